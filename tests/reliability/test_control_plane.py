"""Nothing the control plane is made to do may delay a lane (#13): 1,000 half-open HTTP connections, a slow
request and 32 parallel /metrics scrapers from an unprivileged outsider, plus a model reload every 2 s, against
quiet windows of the same run. What is asserted holds on any machine: every /healthz probe answered 200, every
frame the cameras published accounted for exactly once, no lane restarted, the reloads served, no inference error.
The lanes' service time per frame (inference start → result published, from the result records) under abuse
against the quiet windows is printed in the row, never asserted: a ratio of two latency percentiles on a shared
machine depends on the machine (it failed a fresh 2-vCPU EPYC run, issue 22); bench/http_abuse.py measures it
side by side. End-to-end latency also carries the cameras' own scheduling and is reported.

The host is set up as docs/operations/tuning.md tells an operator to: the lane has a CPU of its own, and the control
plane, the cameras, this test and the abuser share the others (systemd's AllowedCPUs= on the other slices; here
taskset). On a 2-CPU host with a lane on each CPU, the abuser ran between a lane's frames on the lane's own
CPU and the lanes' p99 rose 0.98-1.40x per round (1.11x median in CI): that measured the abuser taking the
lane's CPU and its L2 cache, which no daemon can prevent, rather than the control plane."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import urllib.request

import numpy as np
import pytest
from edgeinfer.abi.vocabulary import OUTCOMES
from conftest import ROOT, read_line
from daemon_helpers import read_stats, results, sign_copy, start_daemon, stop_daemon, wait_for, write_config
from rel_helpers import stop_and_count
from reliability_matrix import COUNTS

ROUNDS = COUNTS["control_plane_rounds"]  # quiet and abused windows, alternating: drift on a shared machine hits both
WINDOW_S = 6.0
RELOAD_EVERY_S = 2.0


def _collect(readers, phase, out, stop):
    while not stop.is_set():
        for r in readers:
            rec = r.read(0.05)
            if rec is not None and rec.status == 0:
                out.append((phase[0], rec.done_ns - rec.start_ns, rec.done_ns - rec.capture_ns))


def test_control_plane_abuse_does_not_delay_the_lanes(request, matrix, tmp_path, stream, children, c_producer,
                                                       bundles, signing_key, users, sandbox):
    flood_script = sandbox / "http_flood.py"
    shutil.copy(ROOT / "tests/adversary/http_flood.py", flood_script)
    os.chmod(flood_script, 0o644)
    names = [f"{stream}-{i}" for i in range(2)]
    current = tmp_path / "current"
    os.symlink(bundles("orientation"), current)
    versions = [sign_copy("orientation", tmp_path / f"v{i}", signing_key[0], lambda d, i=i: (d / "model.yaml")
                          .write_text((d / "model.yaml").read_text().replace("version: 0.0.11", f"version: 0.0.{12 + i}")))
                for i in range(int(ROUNDS * WINDOW_S / RELOAD_EVERY_S) + 2)]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one for the lane, one for everything else")
    lane_cpu, housekeeping = cpus[-1], cpus[:-1]
    pin = ["taskset", "-c", ",".join(map(str, housekeeping))]
    cfg = write_config(tmp_path, str(current), [{"name": n, "width": 224, "height": 224} for n in names],
                       lanes=[{"cpus": [lane_cpu], "models": ["default"]}])
    stats = str(tmp_path / "stats.json")
    proc = start_daemon(children, cfg, stats_file=stats, log_file=str(tmp_path / "daemon.log"))
    port = proc.metrics_url.rsplit(":", 1)[1]
    own_cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, housekeeping)   # this test (readers, /healthz, reloads) stays off the lane's CPU
    request.addfinalizer(lambda: os.sched_setaffinity(0, own_cpus))
    prods = [children.spawn([*pin, c_producer, n, "224", "224", "--fps", "30", "--socket", proc.ingress]) for n in names]
    for p in prods:
        assert read_line(p) == "CONNECTED accepted=1"
    readers = [results(proc, n) for n in names]
    phase, records, stop = ["warm"], [], threading.Event()
    collector = threading.Thread(target=_collect, args=(readers, phase, records, stop), daemon=True)
    collector.start()
    health = {"ok": 0, "failed": 0}
    reloads = 0
    try:
        wait_for(lambda: len(records) > 60, 30, "results from both cameras")
        for i in range(ROUNDS):
            phase[0] = ("quiet", i)
            time.sleep(WINDOW_S)
            # The outsider runs the system's python on a copy in the sandbox: a fresh clone may sit in a 0700
            # directory, its .venv included (the script needs nothing but the standard library).
            flood = children.spawn([*pin, *users.run_as(users.outsider), "/usr/bin/python3", str(flood_script),
                                    "127.0.0.1", port, str(WINDOW_S + 2)])
            held = read_line(flood, timeout=60)
            phase[0] = ("abused", i)
            end = time.monotonic() + WINDOW_S
            while time.monotonic() < end:
                os.symlink(versions[reloads % len(versions)], tmp_path / "current.new")
                os.replace(tmp_path / "current.new", current)
                proc.send_signal(signal.SIGHUP)
                reloads += 1
                beat = time.monotonic() + RELOAD_EVERY_S
                while time.monotonic() < beat:
                    try:
                        with urllib.request.urlopen(f"{proc.metrics_url}/healthz", timeout=2) as r:
                            health["ok" if r.status == 200 else "failed"] += 1
                    except OSError:
                        health["failed"] += 1
                    time.sleep(0.25)
            phase[0] = ("after", i)
            flood.wait(30)
            flood_out = flood.stdout.read().strip().splitlines()
    finally:
        stop.set()
        collector.join(10)
        for r in readers:
            r.close()
    published = stop_and_count(prods, names, stats, [0] * len(names))
    st = read_stats(stats)
    code = stop_daemon(proc)
    counts = {n: st.get("streams", {}).get(n, {}) for n in names}
    outcomes = [sum(counts[n].get(k, 0) for k in OUTCOMES) for n in names]
    exact = all(counts[n].get("offered") == p == o for n, p, o in zip(names, published, outcomes))
    restarts = sum(ln.get("restarts", 0) for ln in st.get("lanes", {}).values())

    def p99(kind, col, rnd=None):
        v = [x[col] for x in records if x[0][0] == kind and rnd in (None, x[0][1])]
        return float(np.percentile(v, 99)) / 1e6 if v else float("nan"), len(v)

    (q_lane, nq), (a_lane, na) = p99("quiet", 1), p99("abused", 1)
    (q_e2e, _), (a_e2e, _) = p99("quiet", 2), p99("abused", 2)
    ratios = [p99("abused", 1, i)[0] / p99("quiet", 1, i)[0] for i in range(ROUNDS)]
    ratio = float(np.median(ratios))
    done = st.get("reloads", 0)
    errors = sum(counts[n].get("error", 0) for n in names)
    observed = (f"lane on CPU {lane_cpu}, everything else on {','.join(map(str, housekeeping))}; {ROUNDS} rounds of {WINDOW_S:.0f} s quiet / {WINDOW_S:.0f} s abused; flood {held!r}, "
                f"{flood_out[-1] if flood_out else '-'}; {reloads} reloads sent ({done} done); /healthz "
                f"{health['ok']} ok, {health['failed']} failed; lanes' service p99 {q_lane:.2f} ms quiet ({nq} frames) "
                f"vs {a_lane:.2f} ms abused ({na}) = {a_lane / q_lane:.2f}× pooled; per round "
                f"{' '.join(f'{r:.2f}' for r in ratios)}×, median {ratio:.2f}×; e2e p99 {q_e2e:.2f} vs {a_e2e:.2f} ms "
                f"(cameras compete for the CPUs); published {sum(published):,}, accounted {sum(outcomes):,}; lane restarts "
                f"{restarts}; inference errors {errors}")
    assert matrix.record(request, "isolation", "control-plane abuse: 1,000 half-open HTTP connections, a slow "
                         "request, 32 scrapers (an outsider) and a reload every 2 s", ROUNDS,
                         "/healthz answers throughout; every published frame accounted for exactly; no lane restart; "
                         "reloads served; no inference error (the lanes' p99, abused against quiet, is printed: "
                         "bench/http_abuse.py measures it)", observed,
                         health["failed"] == 0 and health["ok"] > 0 and na > 0 and nq > 0 and exact
                         and restarts == 0 and done >= 1 and errors == 0 and code == 0)
