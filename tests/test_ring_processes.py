"""Frame rings across real processes: a Python producer, the C example, crashes on both sides."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from conftest import read_line
from edgeinfer import ring
from ring_helpers import is_whole

PY_PRODUCER = """
import sys, time
sys.path.insert(0, {tests!r})
from edgeinfer import ring
from ring_helpers import fill
name, w, h, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writer = ring.FrameWriter.create(name, w, h)
n = writer.layout["row_stride"] * h
print("READY", flush=True)
sys.stdin.readline()  # go
for seq in range(1, frames + 1):
    fill(writer.begin_flat(), seq, n)
    assert writer.publish(frame_id=seq) == seq
print("DONE", flush=True)
sys.stdin.readline()  # let the reader drain before the ring is closed
writer.close()
"""

HOLDING_READER = """
import sys, time
from edgeinfer import ring
r = ring.FrameReader.attach(sys.argv[1])
assert r.wait(10)
f = r.acquire_latest()
print("HOLDING", f.slot, f.seq, flush=True)
time.sleep(600)
"""


def test_100k_frames_cross_process_none_torn(shm_name, children):
    """A Python producer process publishes 100,000 pattern frames as fast as it
    can; this process verifies every frame it acquires, byte for byte."""
    frames, w, h = 100_000, 64, 48
    nbytes = w * h * 3
    prod = children.python(PY_PRODUCER.format(tests=os.path.dirname(__file__)), shm_name, w, h, frames,
                           stdin=__import__("subprocess").PIPE)
    assert read_line(prod) == "READY"
    reader = ring.FrameReader.attach(shm_name)
    prod.stdin.write("go\n")
    prod.stdin.flush()
    verified = torn = 0
    last = 0
    deadline = time.monotonic() + 240
    while last < frames and time.monotonic() < deadline:
        if not reader.wait(1.0):
            continue
        f = reader.acquire_latest()
        if f is None:
            continue
        with f:
            assert f.seq > last and f.frame_id == f.seq
            if is_whole(f.flat, f.seq, nbytes):
                verified += 1
            else:
                torn += 1
            last = f.seq
    prod.stdin.write("done\n")
    prod.stdin.flush()
    assert prod.wait(30) == 0, prod.stderr.read()
    reader.close()
    assert last == frames, f"reader stopped at frame {last} of {frames}"
    assert torn == 0
    assert verified + reader.frames_skipped == frames
    print(f"verified {verified} frames, skipped {reader.frames_skipped} (newest frame wins), torn {torn}")


def test_c_producer_and_python_reader_agree(shm_name, children, c_producer):
    """The C example (ring.h only) and the Python reader agree on layout, metadata and bytes."""
    prod = children.spawn([c_producer, shm_name, "320", "240", "--fps", "500", "--format", "rgb24"])
    assert read_line(prod).startswith("READY generation=1")
    with ring.FrameReader.attach(shm_name) as reader:
        layout = reader.layout
        assert (layout["width"], layout["height"], layout["channels"]) == (320, 240, 3)
        assert layout["pixel_format"] == ring.PIXEL_FORMATS["rgb24"]
        got = 0
        deadline = time.monotonic() + 30
        while got < 200 and time.monotonic() < deadline:
            if reader.wait(1.0) and (f := reader.acquire_latest()) is not None:
                with f:
                    assert f.frame_id == f.seq and f.payload_len == 320 * 240 * 3
                    assert 0 < f.capture_ns <= ring.monotonic_ns()
                    assert abs(f.capture_realtime_ns - time.time_ns()) < 60e9
                    assert is_whole(f.flat, f.seq, f.payload_len)
                    got += 1
        assert got == 200
    prod.send_signal(signal.SIGTERM)
    assert read_line(prod).startswith("DONE")
    assert prod.wait(10) == 0
    assert not os.path.exists(f"/dev/shm/{shm_name}")  # clean exit unlinks


def test_reader_killed_while_holding_a_claim(shm_name, children):
    """The producer keeps publishing around a dead reader's claim; a new reader takes over."""
    w, h = 32, 16
    nbytes = w * h * 3
    from ring_helpers import fill
    with ring.FrameWriter.create(shm_name, w, h, slots=3) as writer:
        fill(writer.begin_flat(), 1, nbytes)
        writer.publish(frame_id=1)
        holder = children.python(HOLDING_READER, shm_name)
        word, slot, seq = read_line(holder, timeout=30).split()
        assert word == "HOLDING" and int(seq) == 1
        slot = int(slot)
        for s in range(2, 102):  # the held slot is never written while the reader lives
            fill(writer.begin_flat(), s, nbytes)
            writer.publish(frame_id=s)
        assert is_whole(writer._p.flats[slot], 1, nbytes)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        for s in range(102, 1102):  # and after its death the producer never blocks
            fill(writer.begin_flat(), s, nbytes)
            writer.publish(frame_id=s)
        with ring.FrameReader.attach(shm_name) as reader:  # the dead reader's lock is gone
            with reader.acquire_latest() as f:
                assert f.seq == 1101 and is_whole(f.flat, 1101, nbytes)


def test_producer_sigkilled_at_random_points(shm_name, children, c_producer):
    """200 producers killed at random moments, most of them mid-write: the same
    reader object never returns a partial frame and picks up every restarted
    producer (a new segment, generation + 1) by itself."""
    trials, w, h = 200, 64, 32
    nbytes = w * h * 3
    rng = random.Random(1234)
    reader = ring.FrameReader.watch(shm_name)
    mid_write = frames_checked = 0
    try:
        for trial in range(1, trials + 1):
            # ~20 us per row: a frame takes ~1 ms to write, so most kills land mid-write.
            prod = children.spawn([c_producer, shm_name, str(w), str(h), "--row-delay-us", "20", "--slots", "3"])
            assert read_line(prod) == f"READY generation={trial}"
            # The same reader reattaches to the new segment and gets its frames.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if reader.wait(1.0) and reader.generation == trial and (f := reader.acquire_latest()):
                    with f:
                        assert f.generation == trial and is_whole(f.flat, f.seq, nbytes), "torn frame"
                        frames_checked += 1
                    break
            else:
                pytest.fail(f"trial {trial}: reader did not pick up the restarted producer")
            time.sleep(rng.uniform(0, 0.004))
            prod.send_signal(signal.SIGKILL)
            prod.wait(10)
            states = [reader.slot_state(s)[1] for s in range(3)]
            mid_write += ring._ring.SLOT_WRITING in states
            # Whatever the dead producer left, only whole frames come out.
            if reader.wait(0.0) and (f := reader.acquire_latest()):
                with f:
                    assert is_whole(f.flat, f.seq, nbytes), "torn frame after producer death"
                    frames_checked += 1
            assert not reader.producer_alive
        assert reader.attach_count == trials
    finally:
        reader.close()
    print(f"{trials} kills, {mid_write} mid-write, {frames_checked} frames checked, 0 torn")
    assert mid_write >= trials // 2, "the kills did not land mid-write often enough to test anything"


UNPRIVILEGED_WATCHER = """
import os, sys
from edgeinfer import ring  # imported first: the interpreter's own files are not readable by nobody here
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # nobody: cannot read a 0600 root segment
r = ring.FrameReader.watch(sys.argv[1])
got = r.wait(0.5)
print(type(r.last_error).__name__, got, flush=True)
"""


def test_unreadable_segment_is_refused_not_fatal(shm_name, children):
    """A segment the consumer may not open (a producer outside its group) is
    reported as InsecureSegment in last_error; waiting goes on."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    with ring.FrameWriter.create(shm_name, 8, 8, mode=0o600):
        p = children.python(UNPRIVILEGED_WATCHER, shm_name)
        assert read_line(p) == "InsecureSegment False"
        assert p.wait(10) == 0
