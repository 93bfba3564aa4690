"""Producer faults against the real daemon: SIGKILL at random points (mostly
mid-write), restarts with another geometry, garbage capture timestamps, a
segment shrunk (ftruncate) under the daemon's mapping."""
from __future__ import annotations

import collections
import os
import random
import signal
import time

import pytest

from conftest import read_line
from daemon_helpers import daemon_log, poll, read_stats, stop_daemon, wait_for
from ring_helpers import publish_into_slot
from rel_helpers import checksum_ok, drain, fault_daemon, http_status, slot_states, stream_of, stream_stats
from reliability_matrix import COUNTS

from edgeinfer import ring

W, H = 64, 48


@pytest.mark.timeout(max(600, COUNTS["producer_kills"] * 0.3 + 300))  # long profile: 5,000 kills
def test_producer_sigkilled_at_random_points(request, matrix, tmp_path, shm_name, children, c_producer,
                                             signing_key):
    """The C producer, writing slowly row by row, is SIGKILLed after a random
    0–12 ms, COUNTS['producer_kills'] times. The daemon serves the checksum
    model: every result says whether the frame it ran on was whole and was the
    frame its id names."""
    trials = COUNTS["producer_kills"]
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    results = ring.ResultReader.watch(ring.result_segment_name(stream))
    rng = random.Random(7)
    checked = bad = mid_write = healthy_checks = 0
    last_result_trial = 0
    longest_gap = 0
    try:
        for trial in range(1, trials + 1):
            prod = children.spawn([c_producer, shm_name, str(W), str(H), "--row-delay-us", "30", "--slots", "3"])
            assert read_line(prod) == f"READY generation={trial}"
            time.sleep(rng.uniform(0, 0.012))
            prod.send_signal(signal.SIGKILL)
            prod.wait(10)
            prod.stdout.close(), prod.stderr.close()
            children.procs.remove(prod)
            mid_write += ring._ring.SLOT_WRITING in slot_states(f"/dev/shm/{shm_name}")
            got = drain(results)
            checked += len(got)
            bad += sum(not checksum_ok(r) for r in got)
            if got:
                longest_gap = max(longest_gap, trial - last_result_trial)
                last_result_trial = trial
            if trial % 100 == 0:
                healthy_checks += http_status(proc.metrics_url + "/healthz") == 200
        # Afterwards a well-behaved producer is served at once.
        prod = children.spawn([c_producer, shm_name, str(W), str(H), "--fps", "100", "--frames", "300"])
        resumed = wait_for(lambda: drain(results), 10, "results from a producer started after the kills")
        bad += sum(not checksum_ok(r) for r in resumed)
        s = stream_stats(stats, stream)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        results.close()
    stop_daemon(proc)
    observed = (f"{mid_write} kills mid-write; {checked:,} results checked, {bad} torn or mislabelled; "
                f"daemon healthy at {healthy_checks}/{trials // 100} checks; longest run of kills without a "
                f"result {longest_gap}; refused as torn by the ring: {s.get('torn', '?')}; served again after")
    passed = bad == 0 and healthy_checks == trials // 100 and alive and checked > trials // 4 and \
        mid_write > trials // 2
    assert matrix.record(request, "producer", "SIGKILL at a random point (C producer, row-by-row writes)", trials,
                         "0 torn frames delivered; daemon never stalls; a new producer is served", observed, passed)


def test_producer_restarts_with_another_geometry(request, matrix, tmp_path, shm_name, children, c_producer,
                                                 signing_key):
    """The producer comes back with another size or pixel format each time: the
    daemon re-attaches and serves it (resizing in the graph), or refuses the
    format with a clear error, and goes on serving the next one."""
    geometries = [(64, 48, "bgr24"), (128, 96, "bgr24"), (32, 24, "bgr24"), (64, 48, "gray8"), (64, 48, "rgba32"),
                  (640, 480, "bgr24"), (64, 48, "bgr24")] * 3
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    results = ring.ResultReader.watch(ring.result_segment_name(stream))
    served = refused = 0
    try:
        for w, h, fmt in geometries:
            errors_before = stream_stats(stats, stream).get("error", 0)
            started = ring.monotonic_ns()
            prod = children.spawn([c_producer, shm_name, str(w), str(h), "--format", fmt, "--fps", "50"])
            read_line(prod)

            def outcome():
                if any(r.capture_ns >= started for r in drain(results)):
                    return "served"
                if stream_stats(stats, stream).get("error", 0) > errors_before:
                    return "refused"
                return None
            got = wait_for(outcome, 30, f"{w}x{h} {fmt} to be served or refused")
            served += got == "served"
            refused += got == "refused"
            prod.send_signal(signal.SIGTERM)
            prod.wait(10)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        results.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    clear = log.count("cannot serve 64x48 gray8 frames") + log.count("cannot serve 64x48 rgba32 frames")
    observed = f"{served} served with the new geometry, {refused} refused ({clear} with a 'cannot serve WxH format' " \
               f"error naming it); daemon healthy after: {alive}"
    passed = served + refused == len(geometries) and alive and refused == clear
    assert matrix.record(request, "producer", "restart with another size or pixel format", len(geometries),
                         "re-attached with the new geometry, or refused with a clear error", observed, passed)


def test_garbage_capture_timestamps(request, matrix, tmp_path, shm_name, children, signing_key):
    """Frames stamped zero, in the future, or near 2^64 (a wrapped clock) are
    counted as bad_timestamp; the scheduler keeps serving the honest ones."""
    n = COUNTS["timestamp_frames"]
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    from ring_helpers import fill
    garbage = [lambda now: 0, lambda now: now + 10 ** 10, lambda now: 2 ** 64 - 1, lambda now: 2 ** 64 - 10 ** 6,
               lambda now: 2 ** 63]
    offered_bad = offered_good = 0
    with ring.FrameWriter.create(shm_name, W, H, "bgr24") as writer:
        results = ring.ResultReader.watch(ring.result_segment_name(stream))
        try:
            for i in range(n):
                flat = writer.begin_flat()
                fill(flat, i, W * H * 3)
                now = ring.monotonic_ns()
                if i % 2:
                    writer.publish(capture_ns=garbage[(i // 2) % len(garbage)](now), frame_id=i)
                    offered_bad += 1
                else:
                    writer.publish(capture_ns=now, frame_id=i)
                    offered_good += 1
                time.sleep(0.01)  # slower than the model: every frame is acquired
            poll(lambda: stream_stats(stats, stream).get("offered", 0) >= n, 10)  # (a failure still gets its row)
            time.sleep(0.5)
            s = stream_stats(stats, stream)
            alive = http_status(proc.metrics_url + "/healthz") == 200
        finally:
            results.close()
    stop_daemon(proc)
    observed = (f"offered {offered_good} honest + {offered_bad} garbage; processed {s.get('processed')}, "
                f"bad_timestamp {s.get('bad_timestamp')}, stale {s.get('stale')}, overload {s.get('overload')}, "
                f"error {s.get('error')}; loop alive: {alive}")
    # Superseded frames (overload) cannot be told apart by kind; everything else is exact.
    over = s.get("overload", 0)
    passed = alive and s.get("offered") == n and s.get("error") == 0 and s.get("torn") == 0 and \
        offered_bad - over <= s.get("bad_timestamp", -1) <= offered_bad and \
        offered_good - over <= s.get("processed", 0) + s.get("stale", 0) <= offered_good
    assert matrix.record(request, "producer", "capture timestamps zero, 10 s ahead, near 2^64, 2^63", offered_bad,
                         "counted as bad_timestamp; honest frames still served; nothing crashes", observed, passed)


HEADER_SIZE = ring._ring.HEADER_SIZE
SHRANK = "the producer shrank its segment (ftruncate) while it was mapped"


def test_producer_shrinks_its_segment_while_mapped(request, matrix, tmp_path, shm_name, children, c_producer,
                                                   signing_key):
    """Named shared memory cannot be sealed: a producer can ftruncate its ring
    while the daemon has it mapped, and every later read of the lost pages is a
    SIGBUS. Three ways, in turn: to 0 bytes; to the header page, then a publish
    that points at a lost slot; to a random size while the producer keeps
    writing (it dies of its own SIGBUS). The daemon must absorb the fault,
    publish nothing read from the lost pages (the checksum model would show
    it), detach with the reason, and serve the producer's next segment."""
    trials = COUNTS["producer_truncations"]
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    path = f"/dev/shm/{shm_name}"
    results = ring.ResultReader.watch(ring.result_segment_name(stream))
    rng = random.Random(13)
    kinds = collections.Counter()
    said = served = checked = bad = 0
    expected_said = 0
    try:
        for trial in range(trials + 1):  # the last round only checks the segment after the last shrink is served
            if proc.poll() is not None:
                break  # the daemon died (of SIGBUS, without the guard): the row says so
            started = ring.monotonic_ns()
            prod = children.spawn([c_producer, shm_name, str(W), str(H), "--fps", "200", "--slots", "4"])
            assert read_line(prod).startswith("READY")
            got = poll(lambda: [r for r in drain(results) if r.capture_ns >= started], 20)
            served += bool(got)
            checked += len(got or [])
            bad += sum(not checksum_ok(r) for r in got or [])
            if trial == trials:
                prod.send_signal(signal.SIGTERM)
                prod.wait(10)
                break
            kind = ("zero", "header", "running")[trial % 3]
            kinds[kind] += 1
            if kind == "running":  # the producer writes on into lost pages and dies of its own SIGBUS
                os.truncate(path, rng.randrange(HEADER_SIZE + 1, os.stat(path).st_size))
                poll(lambda: prod.poll() is not None, 3)
            else:  # stopped (alive, holding the name) while its ring is shrunk
                prod.send_signal(signal.SIGSTOP)
                os.truncate(path, 0 if kind == "zero" else HEADER_SIZE)
                if kind == "header":
                    publish_into_slot(path, 1)  # every slot's pages are gone
                expected_said += 1
                said += bool(poll(lambda: daemon_log(proc).count(SHRANK) >= expected_said, 10))
            prod.kill()
            prod.wait(10)
            prod.stdout.close(), prod.stderr.close()
            children.procs.remove(prod)
        # (the stats file is rewritten every status interval: the last faults may be a moment away)
        poll(lambda: read_stats(stats).get("segment_truncations", 0) >= expected_said, 5)
        absorbed = read_stats(stats).get("segment_truncations", 0)
        alive = http_status(proc.metrics_url + "/healthz") == 200
        s = stream_stats(stats, stream)
    finally:
        results.close()
    code = stop_daemon(proc) if proc.poll() is None else proc.returncode
    log = daemon_log(proc)
    observed = (f"shrunk to 0 bytes {kinds['zero']}, to the header page + a publish into lost pages "
                f"{kinds['header']}, under a writing producer {kinds['running']}; daemon faults absorbed "
                f"{absorbed}, 'shrank its segment' logged {log.count(SHRANK)} times (expected ≥ {expected_said}); "
                f"daemon killed by SIGBUS: {code == -signal.SIGBUS}; torn {s.get('torn')}; {checked:,} results "
                f"checked, {bad} read from lost pages or torn; next segment served {served}/{trials + 1}; "
                f"healthy {alive}")
    passed = (alive and served == trials + 1 and bad == 0 and said == expected_said and absorbed >= expected_said
              and "Traceback" not in log)
    assert matrix.record(request, "producer", "shrinks its segment (ftruncate) while the daemon has it mapped",
                         trials, "no SIGBUS: the fault absorbed, nothing from the lost pages published, detached "
                         "with the reason, the next segment served", observed, passed)
