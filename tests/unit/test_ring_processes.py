"""Frame rings across real processes, handed over by the real handshake: a Python
producer, the C example, crashes on both sides."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from conftest import read_line
from edgeinfer.abi import ring
from ring_helpers import MiniIngress, fill, is_whole

PY_PRODUCER = """
import sys, time
sys.path.insert(0, {tests!r})
from edgeinfer.abi import ring
from ring_helpers import fill
sock, w, h, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writer = ring.FrameWriter.connect("cam0", w, h, socket=sock)
assert writer.connected, writer.connection
n = writer.layout["frame_bytes"]
print("READY", flush=True)
sys.stdin.readline()  # go
for seq in range(1, frames + 1):
    fill(writer.begin_flat(), seq, n)
    assert writer.publish(frame_id=seq) == seq
print("DONE", flush=True)
sys.stdin.readline()  # let the reader drain before the ring is closed
writer.close()
"""


@pytest.fixture
def ingress(tmp_path):
    mi = MiniIngress(str(tmp_path / "ingress.sock"))
    yield mi
    mi.close()


def test_100k_frames_cross_process_none_torn(ingress, children):
    """A Python producer process publishes 100,000 pattern frames as fast as it
    can; this process verifies every frame it acquires, byte for byte."""
    frames, w, h = 100_000, 64, 48
    nbytes = w * h * 3
    prod = children.python(PY_PRODUCER.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ingress.path, w, h, frames,
                           stdin=subprocess.PIPE)
    reader, name, _ = ingress.accept()
    assert name == "cam0" and read_line(prod) == "READY"
    prod.stdin.write("go\n")
    prod.stdin.flush()
    verified = torn = 0
    last = 0
    deadline = time.monotonic() + 240
    while last < frames and time.monotonic() < deadline:
        if not reader.wait(1.0):
            continue
        f = reader.take()
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


def test_c_producer_and_python_reader_agree(ingress, children, c_producer):
    """The C example (ring.h only) and the Python reader agree on layout, metadata and bytes."""
    prod = children.spawn([c_producer, "cam0", "320", "240", "--fps", "500", "--format", "rgb24", "--socket",
                           ingress.path])
    reader, name, _ = ingress.accept()
    assert name == "cam0" and read_line(prod) == "CONNECTED accepted=1"
    with reader:
        layout = reader.layout
        assert (layout["width"], layout["height"], layout["channels"]) == (320, 240, 3)
        assert layout["pixel_format"] == ring.PIXEL_FORMATS["rgb24"]
        got = 0
        deadline = time.monotonic() + 30
        while got < 200 and time.monotonic() < deadline:
            if reader.wait(1.0) and (f := reader.take()) is not None:
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
        assert reader.closed  # a clean exit marks the ring closed: the consumer knows at once


def test_the_c_producer_reconnects_and_hands_over_the_same_ring(ingress, children, c_producer):
    """The daemon goes away (its end of the connection closes): the producer keeps publishing, reconnects
    with backoff, hands over the same ring, and the frames it published meanwhile are in it."""
    prod = children.spawn([c_producer, "cam0", "32", "16", "--fps", "200", "--socket", ingress.path])
    r1, _, conn = ingress.accept()
    assert read_line(prod) == "CONNECTED accepted=1"
    assert r1.wait(5.0)
    with r1.take() as f:
        first = f.seq
    ino = os.fstat(r1.fd).st_ino
    conn.close()  # the daemon "dies"
    assert read_line(prod).startswith("DISCONNECTED")
    r2, _, _ = ingress.accept(timeout=10)
    assert read_line(prod) == "CONNECTED accepted=2"
    assert os.fstat(r2.fd).st_ino == ino  # the same memfd
    assert r2.wait(5.0)
    with r2.take() as f:
        assert f.seq > first + 10 and is_whole(f.flat, f.seq, 32 * 16 * 3)


HOLDING_READER = """
import os, sys, time
from edgeinfer.abi import ring
r = ring.FrameReader(int(sys.argv[1]), "held")
assert r.wait(10)
f = r.take()
print("HOLDING", f.slot, f.seq, flush=True)
time.sleep(600)
"""


def test_reader_killed_while_holding_a_claim(children):
    """The producer keeps publishing around a dead reader's claim; a new reader takes over."""
    w, h = 32, 16
    nbytes = w * h * 3
    with ring.FrameWriter.create(w, h, slots=3) as writer:
        fill(writer.begin_flat(), 1, nbytes)
        writer.publish(frame_id=1)
        holder = children.python(HOLDING_READER, writer.fd, pass_fds=(writer.fd,))
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
        with ring.FrameReader(writer.fd) as reader:  # a new consumer drops the dead one's claim
            with reader.take() as f:
                assert f.seq == 1101 and is_whole(f.flat, 1101, nbytes)


def test_producer_sigkilled_at_random_points(ingress, children, c_producer):
    """200 producers killed at random moments, most of them mid-write: no
    partial frame is ever returned, and every restarted producer's new ring is
    accepted and served."""
    trials, w, h = 200, 64, 32
    nbytes = w * h * 3
    rng = random.Random(1234)
    mid_write = frames_checked = 0
    for trial in range(1, trials + 1):
        # ~20 us per row: a frame takes ~1 ms to write, so most kills land mid-write.
        prod = children.spawn([c_producer, "cam0", str(w), str(h), "--row-delay-us", "20", "--slots", "3",
                               "--socket", ingress.path])
        reader, _, conn = ingress.accept()
        assert read_line(prod) == "CONNECTED accepted=1"
        assert reader.wait(10.0), f"trial {trial}: no frame from the producer"
        with reader.take() as f:
            assert is_whole(f.flat, f.seq, nbytes), "torn frame"
            frames_checked += 1
        time.sleep(rng.uniform(0, 0.004))
        prod.send_signal(signal.SIGKILL)
        prod.wait(10)
        states = [reader.slot_state(s)[1] for s in range(3)]
        mid_write += ring._ring.SLOT_WRITING in states
        # Whatever the dead producer left, only whole frames come out.
        if (f := reader.take()) is not None:
            with f:
                assert is_whole(f.flat, f.seq, nbytes), "torn frame after producer death"
                frames_checked += 1
        assert not ring.sock_alive(conn.fileno())  # its death is seen on the connection at once
        reader.close()
        ingress.conns.remove(conn)
        conn.close()
        children.procs.remove(prod)
        prod.stdout.close(), prod.stderr.close()
    print(f"{trials} kills, {mid_write} mid-write, {frames_checked} frames checked, 0 torn")
    assert mid_write >= trials // 2, "the kills did not land mid-write often enough to test anything"
