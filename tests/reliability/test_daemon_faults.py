"""Daemon faults: SIGKILL under load with a plain restart loop as the
supervisor (systemd's Restart= is checked in the booted container:
tests/system/inside.sh), and a `run` that hangs inside ONNX Runtime."""
from __future__ import annotations

import signal
import statistics
import struct
import time

from conftest import read_line
from daemon_helpers import daemon_log, start_daemon, stop_daemon
from rel_helpers import checksum_ok, drain, fault_daemon, http_status, shm_entries, stream_of, stream_stats
from reliability_matrix import COUNTS

from edgeinfer import ring


def _producer_state(shm_name: str) -> tuple[int, int]:
    """(generation, frames published) of a frame segment, read from its header."""
    with open(f"/dev/shm/{shm_name}", "rb") as f:
        head = f.read(160)
    return struct.unpack_from("<I", head, 148)[0], struct.unpack_from("<Q", head, 152)[0]


def test_daemon_sigkilled_under_load_and_restarted(request, matrix, tmp_path, shm_name, children, c_producer,
                                                   signing_key):
    kills = COUNTS["daemon_kills"]
    second = shm_name + "-b"
    extra = [{"name": stream_of(second), "width": 64, "height": 48, "max_age_ms": 60000}]
    proc, stats, cfg = fault_daemon(children, tmp_path, signing_key, shm_name, extra_streams=extra)
    prods = [children.spawn([c_producer, name, "64", "48", "--fps", "30"]) for name in (shm_name, second)]
    for p in prods:
        read_line(p)
    states = [_producer_state(n) for n in (shm_name, second)]
    readers = [ring.ResultReader.watch(ring.result_segment_name(stream_of(n))) for n in (shm_name, second)]
    resume_s, checked, bad, untouched = [], 0, 0, 0
    try:
        for k in range(kills):
            time.sleep(0.5)  # under load: both streams being served
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed_at = ring.monotonic_ns()
            proc = start_daemon(children, cfg, stats_file=stats, log_file=proc.log_file)  # the supervisor's restart

            def resumed():
                got = [drain(r) for r in readers]
                fresh = [[x for x in g if x.capture_ns > killed_at] for g in got]
                return got if all(fresh) else None
            deadline = time.monotonic() + 30
            got = None
            while got is None and time.monotonic() < deadline:
                got = resumed()
                time.sleep(0.01)
            if got is None:
                break
            resume_s.append((ring.monotonic_ns() - killed_at) / 1e9)
            for g in got:
                checked += len(g)
                bad += sum(not checksum_ok(x) for x in g)
            now = [_producer_state(n) for n in (shm_name, second)]
            untouched += all(p.poll() is None for p in prods) and all(
                n[0] == s[0] and n[1] > s[1] for n, s in zip(now, states))
            states = now
        leaked_while_running = shm_entries(shm_name)
        alive = http_status(proc.metrics_url + "/healthz") == 200 if proc.metrics_url else None
    finally:
        for r in readers:
            r.close()
    code = stop_daemon(proc)
    left = shm_entries(shm_name)  # the producers' two segments stay; the daemon's result rings go with it
    expected_left = sorted([shm_name, second])
    observed = (f"results resumed on both streams after {len(resume_s)}/{kills} kills (median "
                f"{statistics.median(resume_s) if resume_s else float('nan'):.2f} s kill → first result, incl. "
                f"model load); producers untouched {untouched}/{kills}; {checked:,} results checked, {bad} bad; "
                f"/dev/shm while running: {len(leaked_while_running)} entries, after a clean stop: {left}; "
                f"healthy at the end: {alive}")
    passed = (len(resume_s) == kills and untouched == kills and bad == 0 and code == 0 and left == expected_left
              and len(leaked_while_running) == 4 and alive)
    assert matrix.record(request, "daemon", "SIGKILL under load (2 streams × 30 fps), restart loop as supervisor",
                         kills, "producers untouched, results resume, no segment leaked", observed, passed)


def test_hung_run_is_cancelled_and_the_loop_goes_on(request, matrix, tmp_path, shm_name, children, signing_key):
    """The hang model loops ~forever on frames whose first byte is 7. The
    main thread cancels a run past runtime.run_deadline_ms (RunOptions.terminate);
    the frames that follow are served."""
    hangs = 10
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name, kind="hang",
                                  runtime={"run_deadline_ms": 500})
    stream = stream_of(shm_name)
    served_after = 0
    with ring.FrameWriter.create(shm_name, 64, 48, "bgr24") as writer:
        results = ring.ResultReader.watch(ring.result_segment_name(stream))
        try:
            for i in range(hangs):
                writer.begin_flat()[:] = 7          # first byte 7: a 10^12-iteration Loop
                writer.publish(frame_id=2 * i)
                deadline = time.monotonic() + 10
                while stream_stats(stats, stream).get("error", 0) <= i and time.monotonic() < deadline:
                    time.sleep(0.02)
                writer.begin_flat()[:] = 0          # first byte 0: returns at once
                writer.publish(frame_id=2 * i + 1)
                rec = results.read(5.0)
                served_after += rec is not None and rec.frame_id == 2 * i + 1
            s = stream_stats(stats, stream)
            healthy = http_status(proc.metrics_url + "/healthz") == 200
        finally:
            results.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    cancelled = log.count("inference passed its deadline and was cancelled")
    observed = (f"{cancelled} runs cancelled at the 500 ms deadline (error count {s.get('error')}), {served_after} "
                f"following frames served; healthy after: {healthy}")
    passed = cancelled == hangs and s.get("error") == hangs and served_after == hangs and healthy
    assert matrix.record(request, "daemon", "inference run hangs (ONNX Loop of 10^12+ iterations)", hangs,
                         "cancelled at runtime.run_deadline_ms; the next frame is served", observed, passed)


def test_model_that_hangs_at_warm_up_is_refused(request, matrix, tmp_path, shm_name, children, signing_key):
    """A model that hangs on the grey warm-up frame never becomes READY forever:
    the start is refused with the reason once the warm-up deadline passes."""
    proc, _, _ = fault_daemon(children, tmp_path, signing_key, shm_name, kind="hang", model_args={"trigger": 127},
                              runtime={"run_deadline_ms": 200}, wait_ready=False)
    try:
        code = proc.wait(60)
    except Exception:
        code = None
    err = daemon_log(proc) if code is not None else ""
    clear = "warm-up inference (64x48 bgr24) did not finish within 5 s and was cancelled: model refused" in err
    observed = f"exit code {code}; log: {next((x for x in err.splitlines() if 'warm-up' in x), 'no warm-up line')[-160:]}"
    assert matrix.record(request, "daemon", "model hangs during warm-up (before READY)", 1,
                         "start refused with the reason (exit 1), not a daemon stuck before READY", observed,
                         code == 1 and clear)
