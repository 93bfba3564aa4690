"""Daemon faults: SIGKILL under load with a plain restart loop as the
supervisor (systemd's Restart= is checked in the booted container:
tests/system/inside.sh), and a `run` that hangs inside ONNX Runtime."""
from __future__ import annotations

import os
import signal
import statistics
import time

from daemon_helpers import camera, daemon_log, poll, read_stats, results, start_daemon, stop_daemon
from rel_helpers import (Lines, checksum_ok, drain, fault_daemon, http_status, mapped_memfds, memfds, open_ring_of,
                         published, stream_stats)
from reliability_matrix import COUNTS

from edgeinfer.abi import ring


def test_daemon_sigkilled_under_load_and_restarted(request, matrix, tmp_path, stream, children, c_producer,
                                                   signing_key):
    """Two C producers at 30 fps; the daemon is SIGKILLed COUNTS['daemon_kills']
    times and started again at once (the supervisor). Each producer sees its
    connection close, keeps publishing, reconnects with backoff and hands over
    the same ring (same memfd); results resume on both streams. Nothing can leak:
    rings have no names, and the daemon holds exactly its two result rings and
    the two frame rings it serves."""
    kills = COUNTS["daemon_kills"]
    second = stream + "-b"
    names = (stream, second)
    extra = [{"name": second, "width": 64, "height": 48, "max_age_ms": 60000}]
    proc, stats, cfg = fault_daemon(children, tmp_path, signing_key, stream, extra_streams=extra)
    prods = [children.spawn([c_producer, n, "64", "48", "--fps", "30", "--socket", proc.ingress]) for n in names]
    outs = [Lines(p) for p in prods]
    assert [o.next(20) for o in outs] == ["CONNECTED accepted=1"] * 2
    ring_fds = [open_ring_of(p.pid, n) for p, n in zip(prods, names)]  # ours: the producers' rings, read-only
    inodes = [os.fstat(fd).st_ino for fd in ring_fds]
    counts = [published(fd) for fd in ring_fds]
    readers = [results(proc, n) for n in names]
    resume_s, checked, bad, untouched, held = [], 0, 0, 0, []
    try:
        for k in range(kills):
            time.sleep(0.5)  # under load: both streams being served
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed_at = ring.monotonic_ns()
            proc = start_daemon(children, cfg, stats_file=stats, log_file=proc.log_file)  # the supervisor's restart

            got = [[], []]  # every record read, from the killed daemon's rings and from the new ones
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for g, r in zip(got, readers):
                    g.extend(drain(r))
                if all(any(x.capture_ns > killed_at for x in g) for g in got):
                    break
                time.sleep(0.01)
            else:
                break
            resume_s.append((ring.monotonic_ns() - killed_at) / 1e9)
            for g in got:
                checked += len(g)
                bad += sum(not checksum_ok(x) for x in g)
            # Each producer saw the connection go and was accepted again, handing over the same ring,
            # which went on filling while the daemon was away.
            lines = [[o.next(10) or "", o.next(10) or ""] for o in outs]
            now = [published(fd) for fd in ring_fds]
            served = {os.stat(f"/proc/{proc.pid}/fd/{fd}").st_ino for fd in memfds(proc.pid, "edgeinfer-frames:")}
            untouched += all(p.poll() is None for p in prods) and all(
                ln[0].startswith("DISCONNECTED") and ln[1] == f"CONNECTED accepted={k + 2}" for ln in lines) and \
                all(n > c for n, c in zip(now, counts)) and served == set(inodes)
            counts = now
            # Rings only: the control plane also opens short-lived memfds of its own (a fused graph on its way
            # to the lanes), which are not rings. Counted by ring (inode), not by fd: the drift chore reads each
            # result ring through an fd of its own (control/drift.py), the same ring.
            rings = {**memfds(proc.pid, "edgeinfer-frames:"), **memfds(proc.pid, "edgeinfer-results:")}
            held.append((len({os.stat(f"/proc/{proc.pid}/fd/{fd}").st_ino for fd in rings}),
                         mapped_memfds(proc.pid)))
        alive = http_status(proc.metrics_url + "/healthz") == 200 if proc.metrics_url else None
    finally:
        for r in readers:
            r.close()
    code = stop_daemon(proc)
    sockets_left = [p for p in (proc.ingress, proc.results) if os.path.exists(p)]
    for fd in ring_fds:
        os.close(fd)
    observed = (f"results resumed on both streams after {len(resume_s)}/{kills} kills (median "
                f"{statistics.median(resume_s) if resume_s else float('nan'):.2f} s kill → first result, incl. "
                f"model load); producers untouched (alive, same ring handed over again, still publishing) "
                f"{untouched}/{kills}; {checked:,} results checked, {bad} bad; rings held by the daemon after each "
                f"restart (rings by inode, mappings): {sorted(set(held))}; after a clean stop: exit {code}, sockets "
                f"left {sockets_left}; healthy at the end: {alive}")
    passed = (len(resume_s) == kills and untouched == kills and bad == 0 and code == 0 and not sockets_left
              and set(held) == {(4, 4)} and alive)
    assert matrix.record(request, "daemon", "SIGKILL under load (2 streams × 30 fps), restart loop as supervisor",
                         kills, "producers untouched (they reconnect and hand over the same ring), results resume, "
                         "nothing leaked (the daemon holds 2 result + 2 frame rings)", observed, passed)


def test_hung_run_is_cancelled_and_the_loop_goes_on(request, matrix, tmp_path, stream, children, signing_key):
    """The hang model loops ~forever on frames whose first byte is 7. The
    main thread cancels a run past runtime.run_deadline_ms (RunOptions.terminate);
    the frames that follow are served."""
    hangs = 10
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, kind="hang",
                                  runtime={"run_deadline_ms": 500})
    served_after = 0
    with camera(proc, stream, 64, 48, "bgr24") as writer:
        reader = results(proc, stream)
        try:
            for i in range(hangs):
                writer.begin_flat()[:] = 7          # first byte 7: a 10^12-iteration Loop
                writer.publish(frame_id=2 * i)
                deadline = time.monotonic() + 10
                while stream_stats(stats, stream).get("error", 0) <= i and time.monotonic() < deadline:
                    time.sleep(0.02)
                writer.begin_flat()[:] = 0          # first byte 0: returns at once
                writer.publish(frame_id=2 * i + 1)
                rec = reader.read(5.0)
                served_after += rec is not None and rec.frame_id == 2 * i + 1
            s = stream_stats(stats, stream)
            healthy = http_status(proc.metrics_url + "/healthz") == 200
            # counted by the lanes (the stats file); logged once a minute per lane, the rest counted in the next line

            def lane_cancels() -> int:
                return sum(ln["runs_cancelled"] for ln in read_stats(stats).get("lanes", {}).values())
            poll(lambda: lane_cancels() >= hangs, 10, 0.1)
            cancelled = lane_cancels()
        finally:
            reader.close()
    stop_daemon(proc)
    logged = daemon_log(proc).count("inference passed its deadline and was cancelled")
    observed = (f"{cancelled} runs cancelled at the 500 ms deadline (error count {s.get('error')}; {logged} "
                f"logged), {served_after} following frames served; healthy after: {healthy}")
    passed = cancelled == hangs and s.get("error") == hangs and served_after == hangs and healthy and logged >= 1
    assert matrix.record(request, "daemon", "inference run hangs (ONNX Loop of 10^12+ iterations)", hangs,
                         "cancelled at runtime.run_deadline_ms; the next frame is served", observed, passed)


def test_model_that_hangs_at_warm_up_is_refused(request, matrix, tmp_path, stream, children, signing_key):
    """A model that hangs on the grey warm-up frame never becomes READY forever:
    the start is refused with the reason once the warm-up deadline passes."""
    proc, _, _ = fault_daemon(children, tmp_path, signing_key, stream, kind="hang", model_args={"trigger": 127},
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
