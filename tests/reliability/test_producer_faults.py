"""Producer faults against the real daemon: SIGKILL at random points (mostly
mid-write), restarts with another geometry, garbage capture timestamps. (ABI 1's
shrunk segment is impossible with ABI 2's sealed rings: 1,000 resize attempts
are an isolation row, tests/reliability/test_isolation.py.)"""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from conftest import read_line
from daemon_helpers import camera, poll, read_stats, results, stop_daemon
from rel_helpers import (checksum_ok, drain, fault_daemon, first_line_or_exit, http_status, open_ring_of, slot_states,
                         stream_stats)
from reliability_matrix import COUNTS

from edgeinfer.abi import ring

W, H = 64, 48


@pytest.mark.timeout(max(600, COUNTS["producer_kills"] * 0.3 + 300))  # long profile: 5,000 kills
def test_producer_sigkilled_at_random_points(request, matrix, tmp_path, stream, children, c_producer, signing_key):
    """The C producer, connected to the daemon and writing slowly row by row, is
    SIGKILLed after a random 0–12 ms, COUNTS['producer_kills'] times. Its
    connection closes with it, which frees the stream: the next producer is
    accepted and served. The daemon serves the checksum model: every result says
    whether the frame it ran on was whole and was the frame its id names. (The
    slot states after each kill are read through our own fd of the producer's
    memfd, opened via /proc while it lived.)"""
    trials = COUNTS["producer_kills"]
    # Every kill is a hand-over of a new ring: runtime.handovers (30 a minute by default) would refuse the 31st.
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, runtime={"handovers": 100000})
    reader = results(proc, stream)
    rng = random.Random(7)
    checked = bad = mid_write = healthy_checks = not_accepted = 0
    last_result_trial = 0
    longest_gap = 0
    try:
        for trial in range(1, trials + 1):
            prod = children.spawn([c_producer, stream, str(W), str(H), "--row-delay-us", "30", "--slots", "3",
                                   "--socket", proc.ingress])
            line = read_line(prod)
            not_accepted += line != "CONNECTED accepted=1"
            fd = open_ring_of(prod.pid, stream)
            try:
                time.sleep(rng.uniform(0, 0.012))
                prod.send_signal(signal.SIGKILL)
                prod.wait(10)
                mid_write += ring._ring.SLOT_WRITING in slot_states(fd)
            finally:
                os.close(fd)
            prod.stdout.close(), prod.stderr.close()
            children.procs.remove(prod)
            got = drain(reader)
            checked += len(got)
            bad += sum(not checksum_ok(r) for r in got)
            if got:
                longest_gap = max(longest_gap, trial - last_result_trial)
                last_result_trial = trial
            if trial % 100 == 0:
                healthy_checks += http_status(proc.metrics_url + "/healthz") == 200
        # Afterwards a well-behaved producer is served at once.
        prod = children.spawn([c_producer, stream, str(W), str(H), "--fps", "100", "--frames", "300",
                               "--socket", proc.ingress])
        resumed = poll(lambda: drain(reader), 10) or []
        bad += sum(not checksum_ok(r) for r in resumed)
        poll(lambda: stream_stats(stats, stream).get("attaches", 0) >= trials + 1, 5)
        s = stream_stats(stats, stream)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        reader.close()
    stop_daemon(proc)
    observed = (f"{mid_write} kills mid-write; {checked:,} results checked, {bad} torn or mislabelled; "
                f"daemon healthy at {healthy_checks}/{trials // 100} checks; longest run of kills without a "
                f"result {longest_gap}; refused as torn by the ring: {s.get('torn', '?')}; producers accepted "
                f"{s.get('attaches', '?')}/{trials + 1} (not at once: {not_accepted}); served again after: "
                f"{len(resumed)} results")
    passed = bad == 0 and healthy_checks == trials // 100 and alive and checked > trials // 4 and \
        mid_write > trials // 2 and s.get("attaches") == trials + 1 and not_accepted == 0 and resumed
    assert matrix.record(request, "producer", "SIGKILL at a random point (C producer, row-by-row writes)", trials,
                         "0 torn frames delivered; daemon never stalls; its closed connection frees the stream: "
                         "every new producer is accepted and served", observed, passed)


def test_producer_restarts_with_another_geometry(request, matrix, tmp_path, stream, children, c_producer,
                                                 signing_key):
    """The producer comes back with another size or pixel format each time: the
    daemon accepts it and serves it (resizing in the graph), or refuses the
    format at the handshake with the reason (the producer exits 1 with it), and
    goes on serving the next one. runtime.geometry_changes is raised: these
    changes are deliberate, not the churn that rule refuses."""
    geometries = [(64, 48, "bgr24"), (128, 96, "bgr24"), (32, 24, "bgr24"), (64, 48, "gray8"), (64, 48, "rgba32"),
                  (640, 480, "bgr24"), (64, 48, "bgr24")] * 3
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, runtime={"geometry_changes": 1000})
    reader = results(proc, stream)
    served = refused = clear = 0
    odd = []
    try:
        for w, h, fmt in geometries:
            started = ring.monotonic_ns()
            prod = children.spawn([c_producer, stream, str(w), str(h), "--format", fmt, "--fps", "50",
                                   "--socket", proc.ingress, "--wait", "30"])
            line, code, err = first_line_or_exit(prod, 60)
            if line is not None and line.startswith("CONNECTED"):
                if poll(lambda: any(r.capture_ns >= started for r in drain(reader)), 30):
                    served += 1
                else:
                    odd.append(f"{w}x{h} {fmt}: accepted, never served")
            elif code == 1:
                refused += 1
                clear += f"cannot serve {w}x{h} {fmt} frames" in err
            else:
                odd.append(f"{w}x{h} {fmt}: {line or f'exit {code}'} {err[-80:]}")
            if prod.poll() is None:
                prod.send_signal(signal.SIGTERM)
                prod.wait(10)
        alive = http_status(proc.metrics_url + "/healthz") == 200
        poll(lambda: sum(n for k, n in read_stats(stats).get("refusals", {}).items()
                         if k == f"{stream}/producer/model") >= refused, 5)
        counted = read_stats(stats).get("refusals", {}).get(f"{stream}/producer/model", 0)
    finally:
        reader.close()
    stop_daemon(proc)
    observed = (f"{served} served with the new geometry, {refused} refused at the handshake ({clear} with a 'cannot "
                f"serve WxH format' reason naming it, {counted} counted by the daemon); daemon healthy after: {alive}"
                + (f"; otherwise: {odd[:3]}" if odd else ""))
    passed = served + refused == len(geometries) and alive and refused == clear == counted and not odd
    assert matrix.record(request, "producer", "restart with another size or pixel format", len(geometries),
                         "accepted with the new geometry and served, or refused at the handshake with the reason",
                         observed, passed)


def test_garbage_capture_timestamps(request, matrix, tmp_path, stream, children, signing_key):
    """Frames stamped zero, in the future, or near 2^64 (a wrapped clock) are
    counted as bad_timestamp; the scheduler keeps serving the honest ones."""
    n = COUNTS["timestamp_frames"]
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream)
    from ring_helpers import fill
    garbage = [lambda now: 0, lambda now: now + 10 ** 10, lambda now: 2 ** 64 - 1, lambda now: 2 ** 64 - 10 ** 6,
               lambda now: 2 ** 63]
    offered_bad = offered_good = 0
    with camera(proc, stream, W, H, "bgr24") as writer:
        reader = results(proc, stream)
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
            reader.close()
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
