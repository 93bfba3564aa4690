"""Frame and result rings within one process: API behaviour, zero copy, safety of views, sealing."""
from __future__ import annotations

import errno
import fcntl
import gc
import mmap
import os
import socket
import struct
import threading

import numpy as np
import pytest

from edgeinfer.abi import ring
from ring_helpers import fill, is_whole

F_GET_SEALS = 1034
SEALS = {"seal": 1, "shrink": 2, "grow": 4, "write": 8, "future_write": 16}


def publish_pattern(writer: ring.FrameWriter, seq_expected: int) -> int:
    flat = writer.begin_flat()
    fill(flat, seq_expected, writer.layout["frame_bytes"])
    return writer.publish(frame_id=seq_expected)


def pair(*args, **kw) -> tuple[ring.FrameWriter, ring.FrameReader]:
    w = ring.FrameWriter.create(*args, **kw)
    return w, ring.FrameReader(w.fd, "test ring")


def test_publish_then_acquire_returns_the_frame_and_its_metadata():
    w, r = pair(64, 48, "rgb24")
    with w, r:
        assert r.take() is None and r.status == 0  # nothing published yet
        img = w.begin()
        assert img.shape == (48, 64, 3) and img.dtype == np.uint8 and img.flags.writeable
        img[:] = 17
        seq = w.publish(capture_ns=123, frame_id=99, realtime_ns=456)
        assert seq == 1
        assert r.wait(1.0)
        with r.take() as f:
            assert (f.seq, f.frame_id, f.capture_ns, f.capture_realtime_ns) == (1, 99, 123, 456)
            assert f.payload_len == 64 * 48 * 3
            assert f.array.shape == (48, 64, 3) and (f.array == 17).all()
            assert len(f.data) == f.payload_len
            assert f.arrival_ns > 0  # the consumer's own clock, never the producer's
        assert r.take() is None  # only newer frames are returned


def test_view_is_zero_copy_and_read_only():
    w, r = pair(640, 480)
    with w, r:
        publish_pattern(w, 1)
        with r.take() as f:
            # The array the consumer gets is the slot's memory itself.
            assert f.array.__array_interface__["data"][0] == r.slot_address(f.slot)
            assert f.array.base is not None and f.array.flags.c_contiguous
            assert not f.array.flags.writeable
            with pytest.raises(ValueError):
                f.array[0, 0, 0] = 1
            with pytest.raises(ValueError):
                f.array.flags.writeable = True


def test_newest_frame_wins_and_skips_are_counted():
    w, r = pair(32, 16)
    with w, r:
        for i in range(1, 11):
            publish_pattern(w, i)
        with r.take() as f:
            assert f.seq == 10 and f.skipped == 9
            assert is_whole(f.flat, 10, 32 * 16 * 3)
        assert r.frames_skipped == 9 and r.frames_acquired == 1


def test_a_reader_that_adopts_a_ring_counts_on_from_where_the_last_one_stopped():
    """A ring handed to a new consumer (a restarted daemon) keeps what the last one accounted for: the header's
    `consumed`. Frames up to it are not counted again; frames nobody took are counted once, as skipped, by the
    adopter; over both readers every published frame has exactly one outcome."""
    consumed_at = 224  # ring.h: offsetof(ei_frame_ring_header, consumed)
    w, first = pair(32, 16)
    with w:
        for i in range(1, 6):
            publish_pattern(w, i)
        with first.take() as f:
            assert f.seq == 5 and f.skipped == 4
        publish_pattern(w, 6)
        with first.take() as f:
            assert f.seq == 6 and f.skipped == 0
        assert first.counters["consumed"] == 6
        first.close()
        for i in range(7, 10):  # published while no reader runs (a restart's gap)
            publish_pattern(w, i)
        with ring.FrameReader(w.fd, "adopter") as second:
            with second.take() as f:
                assert f.seq == 9 and f.skipped == 2  # 7 and 8, nobody's; not the 8 the first one accounted
            outcomes = sum(r.frames_acquired + r.frames_skipped for r in (first, second))
            assert outcomes == second.counters["published"] == 9
        # An adopter of a ring whose newest frame was consumed sees nothing new, then counts on from it.
        with ring.FrameReader(w.fd, "third") as third:
            assert third.take() is None and third.status == 0
            publish_pattern(w, 10)
            with third.take() as f:
                assert f.seq == 10 and f.skipped == 0
        # A `consumed` beyond `published` is no consumer's: the adopter counts from the ring's start.
        os.pwrite(w.fd, (10 ** 6).to_bytes(8, "little"), consumed_at)
        publish_pattern(w, 11)
        with ring.FrameReader(w.fd, "fooled") as fooled:
            with fooled.take() as f:
                assert f.seq == 11 and f.skipped == 10


def test_producer_never_writes_into_the_held_slot():
    w, r = pair(32, 16, slots=3)
    with w, r:
        publish_pattern(w, 1)
        f = r.take()
        held = f.slot
        for i in range(2, 200):  # with 3 slots the producer cycles through the two others
            publish_pattern(w, i)
        assert is_whole(f.flat, 1, 32 * 16 * 3)
        assert r.slot_state(held) == (1, ring._ring.SLOT_READY)
        f.release()
        with r.take() as f2:
            assert f2.seq == 199 and is_whole(f2.flat, 199, 32 * 16 * 3)


def test_acquire_while_holding_is_an_error():
    w, r = pair(8, 8)
    with w, r:
        publish_pattern(w, 1)
        publish_pattern(w, 2)
        r.take()
        with pytest.raises(ring.RingStateError):
            r.take()


def test_short_payload_is_its_own_outcome_and_the_next_frame_is_served():
    """A producer that says it wrote less than the frame (past the helper's check: a producer of its own) gets
    no result for it (counted, with its length), and nothing stalls: the next whole frame is served."""
    w, r = pair(64, 48)
    with w, r:
        w.begin()
        w._p.publish(ring.monotonic_ns(), 0, 1, 100, checked=False)
        assert r.take() is None and r.status == ring.TAKE_SHORT
        assert (r.native.short_len, r.native.frame_bytes) == (100, 64 * 48 * 3)
        publish_pattern(w, 2)
        with r.take() as f:
            assert f.seq == 2 and f.skipped == 0


@pytest.mark.parametrize("fmt, length", [("nv12", 64 * 48), ("nv12", 64 * 48 * 3 // 2 + 1), ("bgr24", 100)])
def test_the_producer_refuses_a_payload_len_that_is_not_the_frame(fmt, length):
    """ring.h's publish checks payload_len against the frame's length (ei_frame_payload_len): a wrong one is
    refused where the producer sees it, names both lengths, publishes nothing, and keeps the slot reserved."""
    w, r = pair(64, 48, fmt)
    with w, r:
        w.begin()
        with pytest.raises(ring.BadArgument, match=f"payload_len {length} is not the frame's length, "
                                                    f"{ring.frame_bytes(fmt, 64, 48)} bytes"):
            w.publish(length=length)
        assert r.take() is None and r.status == 0 and r.counters["published"] == 0
        assert w.publish(length=ring.frame_bytes(fmt, 64, 48)) == 1  # the same slot, now with the right length
        with r.take() as f:
            assert f.seq == 1 and f.payload_len == w.layout["frame_bytes"]


def test_views_are_gone_after_release():
    """A Frame is valid until release(): after it, its views fail loudly instead of showing a slot the
    producer may be rewriting. The metadata stays readable (the daemon stamps the result with it)."""
    w, r = pair(16, 16)
    with w, r:
        publish_pattern(w, 1)
        f = r.take()
        assert f.batch.shape == (1, 16, 16, 3)
        f.release()
        for name in ("array", "batch", "flat", "data"):
            with pytest.raises(ring.RingStateError, match="released"):
                getattr(f, name)
        assert f.seq == 1 and f.payload_len == 16 * 16 * 3
        publish_pattern(w, 2)
        with r.take() as f:  # the next take hands the views out again
            assert is_whole(f.flat, 2, 16 * 16 * 3)
        with pytest.raises(ring.RingStateError):
            f.array  # the end of the `with` block released it
        publish_pattern(w, 3)
        f = r.take()
    with pytest.raises(ring.RingStateError):
        f.flat  # closing the reader released the frame it held


def test_view_outlives_writer_and_reader():
    """The mapping stays alive while a view exists: no use-after-unmap, ever."""
    w, r = pair(16, 16)
    publish_pattern(w, 1)
    f = r.take()
    view = f.array
    w.close()
    r.close()
    del w, r, f
    gc.collect()
    assert is_whole(view.reshape(-1), 1, 16 * 16 * 3)  # would fault if unmapped


def test_wait_times_out_without_frames_and_wakes_on_publish():
    w, r = pair(8, 8)
    with w, r:
        assert r.wait(0.05) is False
        timer = threading.Timer(0.05, lambda: publish_pattern(w, 1))
        timer.start()
        try:
            assert r.wait(10.0) is True
        finally:
            timer.join()
        assert r.take().seq == 1


@pytest.mark.parametrize("use_fallback", [False, True], ids=["futex_waitv", "timed-wait-fallback"])
def test_wait_any_reports_the_ring_that_has_a_frame(use_fallback, monkeypatch):
    pairs = [pair(8, 8) for _ in range(3)]
    writers, readers = [p[0] for p in pairs], [p[1] for p in pairs]
    if use_fallback:
        real_wait = ring._waitset.wait
        monkeypatch.setattr(ring, "_waitset", type("W", (), {
            "wait": staticmethod(lambda natives, t, spin: real_wait(natives, t, spin, False))})())
    try:
        assert ring.wait_any(readers, 0.05) == []
        timer = threading.Timer(0.05, lambda: publish_pattern(writers[2], 1))
        timer.start()
        try:
            assert ring.wait_any(readers, 10.0) == [readers[2]]
        finally:
            timer.join()
        publish_pattern(writers[0], 1)
        assert set(ring.wait_any(readers, 1.0)) == {readers[0], readers[2]}
    finally:
        for x in writers + readers:
            x.close()


def test_a_doorbell_wakes_a_wait_set():
    """The control plane's doorbell wakes the loop sleeping on its rings (bit n = the bell)."""
    w, r = pair(8, 8)
    bell = ring.Doorbell()
    ws = ring.WaitSet()
    with w, r:
        assert ws.wait([r.native], 0.05, 0.0, True, bell) == 0
        timer = threading.Timer(0.05, bell.ring)
        timer.start()
        try:
            assert ws.wait([r.native], 10.0, 0.0, True, bell) == 0b10
        finally:
            timer.join()
        assert bell.take() and not bell.take()


def test_spin_mode_sees_a_frame_published_while_spinning():
    w, r = pair(8, 8)
    with w, r:
        timer = threading.Timer(0.01, lambda: publish_pattern(w, 1))
        timer.start()
        try:
            assert r.wait(5.0, spin=1.0)
        finally:
            timer.join()


def test_a_new_consumer_of_the_same_ring_takes_over():
    """A restarted daemon gets the same ring back (fd store or reconnect): its consumer starts clean."""
    w = ring.FrameWriter.create(8, 8)
    r1 = ring.FrameReader(w.fd)
    publish_pattern(w, 1)
    r1.take()  # held, as by a daemon that then dies
    r1.close()
    with ring.FrameReader(w.fd) as r2:
        assert r2.native.counters["claims"] == 1
        publish_pattern(w, 2)
        assert r2.take().seq == 2
    w.close()


def test_a_frame_ring_is_a_sealed_memfd_nobody_can_resize():
    w = ring.FrameWriter.create(64, 48)
    with w:
        st = os.fstat(w.fd)
        seals = fcntl.fcntl(w.fd, F_GET_SEALS)
        assert st.st_nlink == 0  # no name anyone could open
        assert seals & (SEALS["seal"] | SEALS["shrink"] | SEALS["grow"]) == 7 and not seals & SEALS["write"]
        assert st.st_size == w.layout["total_size"]
        assert st.st_blocks * 512 >= st.st_size  # every page reserved at creation: no SIGBUS, ever
        for size in (0, 4096, st.st_size + 4096):
            with pytest.raises(OSError) as e:
                os.ftruncate(w.fd, size)
            assert e.value.errno == errno.EPERM
        assert os.readlink(f"/proc/self/fd/{w.fd}").startswith("/memfd:edgeinfer-frames")


def test_bad_geometry_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="slots"):
        ring.FrameWriter.create(8, 8, slots=2)
    with pytest.raises(ValueError, match="frame size"):
        ring.FrameWriter.create(0, 8)
    with pytest.raises(ValueError, match="pixel format"):
        ring.FrameWriter.create(8, 8, "yuv9")
    with pytest.raises(ValueError, match="row stride"):
        ring.FrameWriter.create(8, 8, row_stride=10)
    with pytest.raises(ring.BadArgument, match="stream name"):
        ring.FrameWriter.connect("bad/name", 8, 8, socket="/nonexistent")
    with pytest.raises(ring.BadArgument, match="stream name"):
        ring.FrameWriter.connect("cam0\n", 8, 8, socket="/nonexistent")


def test_padded_rows_give_a_strided_view():
    w, r = pair(10, 4, "gray8", row_stride=64)
    with w, r:
        img = w.begin()
        assert img.shape == (4, 10, 1) and img.strides == (64, 1, 1)
        img[:] = np.arange(10, dtype=np.uint8)[None, :, None]
        w.publish()
        with r.take() as f:
            assert (f.array[:, :, 0] == np.arange(10)).all()


# ------------------------------------------------------------------ result ring


def result_pair(capacity: int, records: int = 8, from_oldest: bool = False):
    w = ring.ResultWriter.create(capacity, records=records)
    return w, ring.ResultReader.from_fd(w.fd, from_oldest=from_oldest)


def test_result_ring_round_trip():
    w, r = result_pair(256)
    with w, r:
        assert r.read() is None
        payload = np.array([[1, 2, 3, 4, 0.9, 0]], dtype=np.float32)
        n = w.write(frame_seq=5, frame_id=6, capture_ns=7, capture_realtime_ns=8, start_ns=9, done_ns=10,
                    status=0, kind=2, payload=payload, item_count=1, model_name="det", model_version="1.2.3")
        assert n == 1
        rec = r.read(timeout=1.0)
        assert (rec.number, rec.frame_seq, rec.frame_id, rec.capture_ns, rec.capture_realtime_ns,
                rec.start_ns, rec.done_ns) == (1, 5, 6, 7, 8, 9, 10)
        assert (rec.kind, rec.item_count, rec.model_name, rec.model_version, rec.missed) == (2, 1, "det", "1.2.3", 0)
        assert np.array_equal(np.frombuffer(rec.payload, np.float32).reshape(1, 6), payload)


def test_result_reader_behind_learns_how_many_it_missed():
    w, r = result_pair(8, records=4)
    with w, r:
        for i in range(1, 11):
            w.write(frame_seq=i)
        got = list(r.follow(timeout=0.05))
        assert [x.frame_seq for x in got] == [8, 9, 10]
        assert got[0].missed == 7 and r.missed == 7


def test_many_result_readers_each_see_every_record():
    w = ring.ResultWriter.create(8, records=16)
    with w:
        readers = [ring.ResultReader.from_fd(w.fd) for _ in range(4)]
        for i in range(1, 11):
            w.write(frame_seq=i, payload=np.array([i], np.uint64))
        for r in readers:
            assert [np.frombuffer(x.payload, np.uint64)[0] for x in r.follow(timeout=0.05)] == list(range(1, 11))
            r.close()


def test_result_payload_larger_than_capacity_is_refused():
    with ring.ResultWriter.create(64, records=4) as w:
        with pytest.raises(ValueError, match="exceeds"):
            w.write(payload=b"x" * 65)


def test_closing_the_writer_is_seen_by_its_readers():
    w, r = result_pair(8)
    w.write(frame_seq=1)
    assert r.read(1.0).frame_seq == 1
    w.close()
    assert r.native.closed and r.read(0.2) is None and not r.connected


def test_waiting_releases_the_gil():
    """Another Python thread keeps running while a reader sleeps in wait()."""
    w, r = pair(8, 8)
    with w, r:
        counter = 0
        stop = threading.Event()

        def spin():
            nonlocal counter
            while not stop.is_set():
                counter += 1

        t = threading.Thread(target=spin)
        t.start()
        try:
            before = counter
            assert r.wait(0.3) is False
            during = counter - before
        finally:
            stop.set()
            t.join()
        # With the GIL held for 0.3 s the other thread could not count at all.
        assert during > 1000


def _hello(stream: str) -> bytes:
    return b"EIHELLO2" + struct.pack("<II", ring._ring.ABI_VERSION, ring.ROLE_PRODUCER) + \
        stream.encode().ljust(64, b"\0") + bytes(48)


def test_recv_hello_hands_every_extra_fd_to_the_caller_or_closes_it_itself():
    """The daemon's receive (ring.h ei_sock_recv_fds): every fd of a message reaches the caller's `dispose` list,
    for it to close off its control plane (issue 23: a client's fd can make close() block); none is dropped by
    the kernel inside recvmsg, even 200 of them. Without the list, recv_hello closes them itself."""
    for n in (2, 200):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sent = [os.memfd_create(f"t{i}") for i in range(n)]
        try:
            socket.send_fds(a, [_hello("cam")], sent)
            extra: list[int] = []
            with pytest.raises(ring.ProtocolError, match=f"more fds than one: {n} fds"):
                ring.recv_hello(b.fileno(), extra)
            assert len(extra) == n
            assert all(os.readlink(f"/proc/self/fd/{f}").startswith("/memfd:t") for f in extra)
            for f in extra:
                os.close(f)
        finally:
            for f in sent:
                os.close(f)
            a.close()
            b.close()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = os.memfd_create("solo")
    try:
        before = set(os.listdir("/proc/self/fd"))
        socket.send_fds(a, [_hello("cam")], [fd, fd])
        with pytest.raises(ring.ProtocolError, match="more fds than one: 2 fds"):
            ring.recv_hello(b.fileno())  # no list: closed here (ei_fd_close_received)
        assert set(os.listdir("/proc/self/fd")) == before, "recv_hello left an fd open"
        socket.send_fds(a, [_hello("cam")], [fd])
        role, name, got = ring.recv_hello(b.fileno(), [])
        assert (role, name) == (ring.ROLE_PRODUCER, "cam")
        assert os.readlink(f"/proc/self/fd/{got}").startswith("/memfd:solo")
        os.close(got)
    finally:
        os.close(fd)
        a.close()
        b.close()
