"""The benchmarks still run (smoke, not timing).

bench/ measures; tests never assert its figures. But a bench that no longer
starts records nothing: a cleanup once removed an attribute both benches used
and nobody noticed until the next measurement. Each runs here in its smallest
shape, and what is asserted is what does not depend on the machine: it ran to
its JSON summary, and its accounting of frames was exact.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import ROOT
from test_rtsp import _gst_rtsp_missing


def _summary(args: list[str], timeout: float) -> dict:
    """Runs a bench (its models come from `make models`, a prerequisite of `make test`); its JSON summary."""
    assert (ROOT / "models/bundles/orientation/model.onnx").exists(), "run `make models` first"
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_scale_bench_runs_lanes_and_batched_rows_with_exact_accounting():
    s = _summary(["bench/scale.py", "--quick", "--rows", "lanes,batched", "--warmup", "1", "--window", "2",
                  "--bare-runs", "50"], timeout=300)
    assert set(s["rows"]) == {"lanes", "batched"}, s.get("skipped")
    for key, row in s["rows"].items():
        assert row["throughput_fps"] > 0, key
        assert all(phase["exact"] for rnd in row["accounting"] for phase in rnd.values()), (key, row["accounting"])


def test_e2e_bench_runs_to_its_summary():
    s = _summary(["bench/e2e.py", "--quick", "--no-abi1", "--frames", "40", "--rss-results", "200", "--rounds", "1"],
                 timeout=300)
    rows = s["rows"]
    assert rows["edgeinferd (40 fps offered)"]["n"] >= 30, rows
    assert rows["floor: fused graph, bare run"]["n"] == 40
    t = s["targets"]
    # Every row's first frame after connecting is reported apart (never silently dropped), and the daemon's own
    # stages split the 40 fps row.
    assert t["first_frame_us"]["n"] >= 3 and t["first_frame_us"]["max"] > 0, t["first_frame_us"]
    assert {"age", "inference", "decode", "publish"} <= set(t["stages_40fps_mean_us"]), t["stages_40fps_mean_us"]
    assert t["stages_40fps_mean_us"]["inference"] > 0


def test_quantize_bench_runs_both_models_to_its_summary():
    s = _summary(["bench/quantize.py", "--quick"], timeout=300)
    assert set(s["rows"]) == {"orientation", "detector"}
    for name, row in s["rows"].items():
        assert row["fp32"]["p99_ms"] > 0 and row["int8"]["p99_ms"] > 0 and 0 <= row["agreement"] <= 1, name


def test_yuv_bench_runs_each_format_to_its_summary():
    s = _summary(["bench/yuv.py", "--quick"], timeout=600)
    assert [r["format"] for r in s["rows"]] == ["bgr24", "i420", "nv12"]
    for row in s["rows"]:
        assert row["served"] > 0 and row["errors"] == 0 and row["producer_ms"] > 0 and row["daemon_ms"] > 0, row


def test_rtsp_clock_bench_runs_both_decoders_to_its_summary():
    missing = _gst_rtsp_missing()
    if missing:
        pytest.skip(missing)
    s = _summary(["bench/rtsp_clock.py", "--quick"], timeout=300)
    # Both clocks ran their feeds to the end (the bench raises otherwise). Their CPU per frame is a difference of
    # two runs' CPU times: under a loaded suite the start-up's own variance can exceed 50 frames' worth, so the
    # figure is a measurement (bench/), never asserted here.
    assert set(s["cpu_ms_per_frame"]) == {"sender", "stream"} and s["frames"] == 50
    assert all(math.isfinite(v) for v in s["cpu_ms_per_frame"].values()), s


def test_fronts_bench_runs_every_row_of_both_models_to_its_summary():
    """bench/fronts.py: the local path, the gRPC front, the plain servicer, the Frigate front and its ZeroMQ
    reference (when the gateway has a Frigate front), and the open-loop load with a camera beside it."""
    from conftest import require_root
    require_root("the bench starts edgeinferd with SCHED_FIFO lanes")
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt)")
    s = _summary(["bench/fronts.py", "--seconds", "0.5", "--clients", "1,2"], timeout=400)
    frigate = "frigate" not in s["skipped"]
    for model, closed in (("orientation", ["local", "grpc", "plain"]),
                          ("detector", ["local", "grpc", "plain", "zmq"] + (["frigate"] if frigate else []))):
        rows = s["models"][model]["rows"]
        keys = {"local"} | {f"{k}/{c}" for k in closed if k != "local" for c in (1, 2)}
        loads = {"grpc@150%"} | ({"frigate@150%"} if frigate and model == "detector" else set())
        assert set(rows) == keys | loads, (model, sorted(rows))
        for key in keys:
            assert rows[key]["n"] > 0 and rows[key]["rps"] > 0 and rows[key]["errors"] == {}, (model, key, rows[key])
        for key in loads:
            r = rows[key]
            assert r["sent"] == r["answered"]["n"] + r["shed"] + sum(r["errors"].values()), (model, key, r)
            assert r["camera"]["published"] > 0 and 0 <= r["camera"]["processed"] <= r["camera"]["published"]
        assert "grpc_p50_over_local_us" in s["models"][model]["targets"]


@pytest.mark.skipif(not any(__import__("os").path.exists(p) for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto")),
                    reason="mosquitto (make system-packages)")
def test_mqtt_bench_runs_its_three_windows_to_its_summary():
    s = _summary(["bench/mqtt.py", "--streams", "2", "--fps", "10", "--seconds", "1", "--rounds", "1"], timeout=300)
    assert s["received_per_s"][0] > 0 and s["published_per_s"][0] > 0, s
    assert set(s["lanes_p99_us"]) == {"none", "healthy", "stalled"} and s["stalled_over_none_p99"][0] > 0, s


def test_rollout_bench_runs_its_windows_and_a_decision_to_its_summary():
    s = _summary(["bench/rollout.py", "--quick", "--streams", "2"], timeout=300)
    row = s["loads"]["0.5"]["rounds"][0]
    assert set(row["none"]["versions"]) == {"0.0.11"} and set(row["shadow"]["versions"]) == {"0.0.11"}, row
    assert row["none"]["answered"] > 0 and row["shadow"]["answered"] > 0, row
    assert s["decision"]["decision"] == "promote", s["decision"]


def test_shedding_bench_runs_its_windows_and_a_refusal_burst_to_its_summary():
    """bench/shedding.py --quick: capacity, the offered loads with clients that retry at once, the all-refused burst
    (the daemon stopped, the pool held); every window's accounting, never its figures."""
    from conftest import require_root
    require_root("the bench starts edgeinferd with SCHED_FIFO lanes")
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt)")
    s = _summary(["bench/shedding.py", "--quick"], timeout=300)
    rnd, = s["rounds"]
    loads = ("100%", "150%", "300%")
    assert set(rnd["rows"]) == {"capacity", *loads, *(f"{x} fixed" for x in loads)}, rnd["rows"].keys()
    assert rnd["capacity"] > 0 and rnd["rows"]["capacity"]["refused"] == 0, rnd["rows"]["capacity"]
    for key, row in rnd["rows"].items():
        assert row["answered"] > 0 and set(row["cpu"]) == {"gateway", "daemon", "clients"}, (key, row)
    burst = rnd["refusal"]
    assert burst["refused"] > 0 and burst["cpu"]["gateway"]["ms_per_refused"] is not None, burst
    assert set(s["targets"]) == {"150%", "300%", "150% fixed", "300% fixed"}, s["targets"]


def test_providers_bench_serves_each_row_on_its_provider():
    """bench/providers.py on the tiny model: a row per provider this host has (the others skipped, said), each
    daemon row served on the provider it names (/metrics), its bare and end-to-end windows full."""
    s = _summary(["bench/providers.py", "--quick", "--frames", "10", "--models", "cls-tiny"], timeout=300)
    assert "cls-tiny/cpu" in s["rows"], s
    assert {k.split("/", 1)[1] for k in s["rows"]} | set(s["skipped"]) == {"cpu", "openvino:CPU"}, s
    for key, row in s["rows"].items():
        assert row["serving"] == key.split("/", 1)[1], (key, row)
        assert row["bare"]["n"] == row["e2e"]["n"] == 10, (key, row)
