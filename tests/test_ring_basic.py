"""Frame and result rings within one process: API behaviour, zero copy, safety of views."""
from __future__ import annotations

import gc
import os
import stat
import threading
import time

import numpy as np
import pytest

from edgeinfer import ring
from ring_helpers import fill, is_whole

SHM = "/dev/shm"


def publish_pattern(writer: ring.FrameWriter, seq_expected: int) -> int:
    flat = writer.begin_flat()
    n = writer.layout["row_stride"] * writer.layout["height"]
    fill(flat, seq_expected, n)
    return writer.publish(frame_id=seq_expected)


def test_publish_then_acquire_returns_the_frame_and_its_metadata(shm_name):
    with ring.FrameWriter.create(shm_name, 64, 48, "rgb24") as w, ring.FrameReader.attach(shm_name) as r:
        assert r.acquire_latest() is None  # nothing published yet
        img = w.begin()
        assert img.shape == (48, 64, 3) and img.dtype == np.uint8 and img.flags.writeable
        img[:] = 17
        seq = w.publish(capture_ns=123, frame_id=99, realtime_ns=456)
        assert seq == 1
        assert r.wait(1.0)
        with r.acquire_latest() as f:
            assert (f.seq, f.frame_id, f.capture_ns, f.capture_realtime_ns) == (1, 99, 123, 456)
            assert f.payload_len == 64 * 48 * 3
            assert f.array.shape == (48, 64, 3) and (f.array == 17).all()
            assert len(f.data) == f.payload_len
        assert r.acquire_latest() is None  # only newer frames are returned


def test_view_is_zero_copy_and_read_only(shm_name):
    with ring.FrameWriter.create(shm_name, 640, 480) as w, ring.FrameReader.attach(shm_name) as r:
        publish_pattern(w, 1)
        with r.acquire_latest() as f:
            # The array the consumer gets is the slot's memory itself.
            assert f.array.__array_interface__["data"][0] == r.slot_address(f.slot)
            assert f.array.base is not None and f.array.flags.c_contiguous
            assert not f.array.flags.writeable
            with pytest.raises(ValueError):
                f.array[0, 0, 0] = 1
            with pytest.raises(ValueError):
                f.array.flags.writeable = True


def test_newest_frame_wins_and_skips_are_counted(shm_name):
    with ring.FrameWriter.create(shm_name, 32, 16) as w, ring.FrameReader.attach(shm_name) as r:
        for i in range(1, 11):
            publish_pattern(w, i)
        with r.acquire_latest() as f:
            assert f.seq == 10 and f.skipped == 9
            assert is_whole(f.flat, 10, 32 * 16 * 3)
        assert r.frames_skipped == 9 and r.frames_acquired == 1


def test_producer_never_writes_into_the_held_slot(shm_name):
    with ring.FrameWriter.create(shm_name, 32, 16, slots=3) as w, ring.FrameReader.attach(shm_name) as r:
        publish_pattern(w, 1)
        f = r.acquire_latest()
        held = f.slot
        for i in range(2, 200):  # with 3 slots the producer cycles through the two others
            publish_pattern(w, i)
            assert w._p.images is not None
        assert is_whole(f.flat, 1, 32 * 16 * 3)
        assert r.slot_state(held) == (1, ring._ring.SLOT_READY)
        f.release()
        with r.acquire_latest() as f2:
            assert f2.seq == 199 and is_whole(f2.flat, 199, 32 * 16 * 3)


def test_acquire_while_holding_is_an_error(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8) as w, ring.FrameReader.attach(shm_name) as r:
        publish_pattern(w, 1)
        publish_pattern(w, 2)
        r.acquire_latest()
        with pytest.raises(ring.RingStateError):
            r.acquire_latest()


def test_view_outlives_writer_reader_and_unlink(shm_name):
    """The mapping stays alive while a view exists: no use-after-unmap, ever."""
    w = ring.FrameWriter.create(shm_name, 16, 16)
    r = ring.FrameReader.attach(shm_name)
    publish_pattern(w, 1)
    f = r.acquire_latest()
    view = f.array
    w.close()
    r.close()
    del w, r, f
    gc.collect()
    assert not os.path.exists(f"{SHM}/{shm_name}")
    assert is_whole(view.reshape(-1), 1, 16 * 16 * 3)  # would fault if unmapped


def test_wait_times_out_without_frames_and_wakes_on_publish(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8) as w, ring.FrameReader.attach(shm_name) as r:
        assert r.wait(0.05) is False
        timer = threading.Timer(0.05, lambda: publish_pattern(w, 1))
        timer.start()
        try:
            assert r.wait(10.0) is True
        finally:
            timer.join()
        assert r.acquire_latest().seq == 1


@pytest.mark.parametrize("use_fallback", [False, True], ids=["futex_waitv", "timed-wait-fallback"])
def test_wait_any_reports_the_ring_that_has_a_frame(shm_name, use_fallback, monkeypatch):
    names = [f"{shm_name}.{i}" for i in range(3)]
    writers = [ring.FrameWriter.create(n, 8, 8) for n in names]
    readers = [ring.FrameReader.attach(n) for n in names]
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


def test_spin_mode_sees_a_frame_published_while_spinning(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8) as w, ring.FrameReader.attach(shm_name) as r:
        timer = threading.Timer(0.01, lambda: publish_pattern(w, 1))
        timer.start()
        try:
            assert r.wait(5.0, spin=1.0)
        finally:
            timer.join()


def test_second_live_producer_and_second_consumer_are_refused(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8), ring.FrameReader.attach(shm_name):
        with pytest.raises(ring.ProducerBusy, match=shm_name):
            ring.FrameWriter.create(shm_name, 8, 8)
        with pytest.raises(ring.ConsumerBusy, match=shm_name):
            ring.FrameReader.attach(shm_name)


def test_closing_the_consumer_lets_another_take_over(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8) as w:
        r1 = ring.FrameReader.attach(shm_name)
        publish_pattern(w, 1)
        r1.acquire_latest()
        r1.close()
        with ring.FrameReader.attach(shm_name) as r2:
            publish_pattern(w, 2)
            assert r2.acquire_latest().seq == 2


def test_segment_mode_and_group_are_the_access_control(shm_name):
    with ring.FrameWriter.create(shm_name, 8, 8, mode=0o640, group=os.getgid()):
        st = os.stat(f"{SHM}/{shm_name}")
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid()
    with pytest.raises(ValueError, match="world-writable"):
        ring.FrameWriter.create(shm_name, 8, 8, mode=0o666)
    with pytest.raises(ValueError, match="no such group"):
        ring.FrameWriter.create(shm_name, 8, 8, group="no-such-group-edgeinfer")


def test_bad_geometry_arguments_are_refused_with_the_reason(shm_name):
    with pytest.raises(ValueError, match="slots"):
        ring.FrameWriter.create(shm_name, 8, 8, slots=2)
    with pytest.raises(ValueError, match="frame size"):
        ring.FrameWriter.create(shm_name, 0, 8)
    with pytest.raises(ValueError, match="pixel format"):
        ring.FrameWriter.create(shm_name, 8, 8, "yuv9")
    with pytest.raises(ValueError, match="row stride"):
        ring.FrameWriter.create(shm_name, 8, 8, row_stride=10)
    with pytest.raises(ValueError, match="segment name"):
        ring.FrameWriter.create("bad/name", 8, 8)
    assert not [e for e in os.listdir(SHM) if shm_name in e]


def test_padded_rows_give_a_strided_view(shm_name):
    with ring.FrameWriter.create(shm_name, 10, 4, "gray8", row_stride=64) as w, \
            ring.FrameReader.attach(shm_name) as r:
        img = w.begin()
        assert img.shape == (4, 10, 1) and img.strides == (64, 1, 1)
        img[:] = np.arange(10, dtype=np.uint8)[None, :, None]
        w.publish()
        with r.acquire_latest() as f:
            assert (f.array[:, :, 0] == np.arange(10)).all()


def test_full_shm_is_a_clear_error_not_a_sigbus(shm_name, tmp_path):
    """A filesystem without room fails at creation (posix_fallocate), never later."""
    big = 16384
    with pytest.raises(ring.ShmFull, match="cannot reserve"):
        # /dev/shm cannot hold 64 frames of 16384x16384x4 (64 GiB) on a 24 GiB machine.
        ring.FrameWriter.create(shm_name, big, big, "bgra32", slots=64)
    assert not [e for e in os.listdir(SHM) if shm_name in e]


# ------------------------------------------------------------------ result ring


def test_result_ring_round_trip(shm_name):
    name = ring.result_segment_name(shm_name)
    with ring.ResultWriter.create(name, 256, records=8) as w, ring.ResultReader.attach(name) as r:
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


def test_result_reader_behind_learns_how_many_it_missed(shm_name):
    name = ring.result_segment_name(shm_name)
    with ring.ResultWriter.create(name, 8, records=4) as w, ring.ResultReader.attach(name) as r:
        for i in range(1, 11):
            w.write(frame_seq=i)
        got = list(r.follow(timeout=0.05))
        assert [x.frame_seq for x in got] == [8, 9, 10]
        assert got[0].missed == 7 and r.missed == 7


def test_many_result_readers_each_see_every_record(shm_name):
    name = ring.result_segment_name(shm_name)
    with ring.ResultWriter.create(name, 8, records=16) as w:
        readers = [ring.ResultReader.attach(name) for _ in range(4)]
        for i in range(1, 11):
            w.write(frame_seq=i, payload=np.array([i], np.uint64))
        for r in readers:
            assert [np.frombuffer(x.payload, np.uint64)[0] for x in r.follow(timeout=0.05)] == list(range(1, 11))
            r.close()


def test_result_payload_larger_than_capacity_is_refused(shm_name):
    name = ring.result_segment_name(shm_name)
    with ring.ResultWriter.create(name, 64, records=4) as w:
        with pytest.raises(ValueError, match="exceeds"):
            w.write(payload=b"x" * 65)


def test_result_reader_follows_a_restarted_writer(shm_name):
    name = ring.result_segment_name(shm_name)
    w = ring.ResultWriter.create(name, 8, records=8)
    r = ring.ResultReader.attach(name)
    w.write(frame_seq=1)
    assert r.read(1.0).frame_seq == 1
    w.close()
    w2 = ring.ResultWriter.create(name, 8, records=8)
    try:
        w2.write(frame_seq=42)
        rec = r.read(timeout=5.0)
        assert rec is not None and rec.frame_seq == 42 and r.attach_count == 2
    finally:
        w2.close()
        r.close()


def test_result_writer_replaces_a_dead_writers_ring_but_not_a_live_one(shm_name):
    name = ring.result_segment_name(shm_name)
    w = ring.ResultWriter.create(name, 8)
    with pytest.raises(ring.ProducerBusy):
        ring.ResultWriter.create(name, 8)
    w._p.close(False)  # like a crash: lock dropped, name left behind
    with ring.ResultWriter.create(name, 8) as w2:
        with ring.ResultReader.attach(name) as r:
            assert r.generation == 2
        w2.write(frame_seq=1)


def test_next_frame_waits_claims_and_follows_a_restarted_producer(shm_name):
    w = ring.FrameWriter.create(shm_name, 8, 8)
    r = ring.FrameReader.attach(shm_name)
    try:
        assert r.next_frame(0.02) is None
        publish_pattern(w, 1)
        publish_pattern(w, 2)
        f = r.next_frame(1.0)
        assert f.seq == 2 and f.skipped == 1 and is_whole(f.flat, 2, 8 * 8 * 3)
        with pytest.raises(ring.RingStateError):
            r.next_frame(0.0)
        f.release()
        w._p.close(False)  # the producer "dies": lock gone, name left
        w = ring.FrameWriter.create(shm_name, 16, 8)  # its restart replaces the segment
        publish_pattern(w, 1)
        deadline = time.monotonic() + 5
        while (f := r.next_frame(0.2)) is None and time.monotonic() < deadline:
            pass
        assert f is not None and f.generation == 2 and f.array.shape == (8, 16, 3)
        f.release()
    finally:
        w.close()
        r.close()


def test_waiting_releases_the_gil(shm_name):
    """Another Python thread keeps running while a reader sleeps in wait()."""
    with ring.FrameWriter.create(shm_name, 8, 8), ring.FrameReader.attach(shm_name) as r:
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


@pytest.mark.parametrize("ring_first", [True, False], ids=["ring-then-watch", "watch-then-ring"])
def test_watch_sees_every_record_written_after_it(shm_name, ring_first):
    """watch() promises the records written from then on, also those written before the first read()
    (an integrator starts the camera between the two) and those in a ring that appeared after watch()."""
    writer = ring.ResultWriter.create(shm_name, 64, records=8) if ring_first else None
    reader = ring.ResultReader.watch(shm_name)
    try:
        writer = writer or ring.ResultWriter.create(shm_name, 64, records=8)
        for i in (1, 2):
            writer.write(frame_seq=i, frame_id=i, capture_ns=i, payload=b"r")
        got = [reader.read(2.0), reader.read(2.0)]
        assert [r.frame_id for r in got if r is not None] == [1, 2]
    finally:
        reader.close()
        writer.close()
