"""Shared-memory frame and result rings: the Python face of native/include/edgeinfer/ring.h.

Producers:  FrameWriter.create(name, width, height) → begin() → fill the view → publish().
The daemon: FrameReader.attach(name) / FrameReader.watch(name) → wait() → acquire_latest()
            (a zero-copy, read-only view of the newest complete frame, held until release).
Results:    ResultWriter.create(name, payload_capacity) → write(...);
            ResultReader.attach(name) → read() / follow().

Readers follow a name, not a file: when a producer restarts (new segment, new
generation) or the daemon recreates a result ring, the same reader object
reattaches by itself. This is the only module that imports the native core.
"""
from __future__ import annotations

import dataclasses
import grp
import time
from typing import Iterator, Sequence

import numpy as np

from edgeinfer import _ring
from edgeinfer._ring import (  # noqa: F401  (re-exported: the error types are part of the API)
    AbiMismatch,
    BadGeometry,
    BadMagic,
    ConsumerBusy,
    CorruptFrame,
    InsecureSegment,
    ProducerBusy,
    RingError,
    RingStateError,
    SegmentNotFound,
    ShmFull,
    TruncatedSegment,
    UntrustedOwner,
)

SHM_DIR = "/dev/shm"
PIXEL_FORMATS = dict(_ring.PIXEL_FORMATS)
PIXEL_FORMAT_NAMES = {code: name for name, code in PIXEL_FORMATS.items()}
MAX_WAIT = _ring.MAX_WAIT
monotonic_ns = _ring.monotonic_ns
sigbus_absorbed = _ring.sigbus_absorbed  # frame-ring pages read after their producer truncated them (process-wide)


def frame_segment_name(stream: str) -> str:
    """The frame ring of a camera stream, as its producer creates it."""
    return f"edgeinfer.{stream}"


def result_segment_name(stream: str) -> str:
    """The result ring the daemon creates for a stream."""
    return f"edgeinfer.{stream}.results"


def _gid(group: str | int | None) -> int:
    if group is None:
        return -1
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no such group: {group!r}") from None


def _pixel_format(pixel_format: str | int) -> int:
    if isinstance(pixel_format, int):
        return pixel_format
    try:
        return PIXEL_FORMATS[pixel_format.lower()]
    except KeyError:
        raise ValueError(f"unknown pixel format {pixel_format!r}; one of {sorted(PIXEL_FORMATS)}") from None


# ------------------------------------------------------------------ producer


class FrameWriter:
    """A camera's end of a frame ring. Never blocks on the consumer."""

    def __init__(self, producer: _ring.FrameProducer):
        self._p = producer
        self._frame_id = 0
        layout = producer.layout
        self._frame_bytes = layout["row_stride"] * layout["height"]

    @classmethod
    def create(cls, name: str, width: int, height: int, pixel_format: str | int = "bgr24", *, slots: int = 4,
               row_stride: int = 0, mode: int = 0o660, group: str | int | None = None,
               shm_dir: str = SHM_DIR) -> "FrameWriter":
        """Creates `name` in shm_dir; replaces a segment whose producer died (its
        readers reattach), refuses one whose producer is alive (ProducerBusy)."""
        return cls(_ring.FrameProducer(shm_dir, name, width, height, _pixel_format(pixel_format), row_stride,
                                       slots, mode, _gid(group)))

    @property
    def name(self) -> str:
        return self._p.name

    @property
    def layout(self) -> dict:
        return self._p.layout

    @property
    def generation(self) -> int:
        return self._p.generation

    def begin(self) -> np.ndarray:
        """A writable (height, width, channels) uint8 view of a free slot."""
        return self._p.images[self._p.begin()]

    def begin_flat(self) -> np.ndarray:
        """The same slot as a flat uint8 array of payload_capacity bytes (for readinto)."""
        return self._p.flats[self._p.begin()]

    def publish(self, capture_ns: int | None = None, frame_id: int | None = None, *,
                realtime_ns: int | None = None, length: int | None = None) -> int:
        """Publishes the slot from begin(); returns the frame's sequence number.
        capture_ns is CLOCK_MONOTONIC (default: now); frame_id defaults to a counter."""
        if frame_id is None:
            self._frame_id += 1
            frame_id = self._frame_id
        return self._p.publish(monotonic_ns() if capture_ns is None else capture_ns,
                               time.time_ns() if realtime_ns is None else realtime_ns, frame_id,
                               self._frame_bytes if length is None else length)

    def close(self, unlink: bool = True) -> None:
        """Tells readers the stream ended and removes the name."""
        self._p.close(unlink)

    def __enter__(self) -> "FrameWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ following a name


class _Follower:
    """Keeps one reader attached to whatever segment currently stands under a
    name: reattaches when the writer marks it superseded or closed, or when the
    name points at another file, and tolerates the name being absent."""

    refresh_interval = 0.1  # seconds between checks of the name when nothing happens

    def __init__(self, name: str, shm_dir: str, allowed_uids: Sequence[int] | None):
        self.name = name
        self.shm_dir = shm_dir
        self.allowed_uids = tuple(allowed_uids) if allowed_uids is not None else None
        self.attach_count = 0
        self.truncations = 0  # segments detached because their writer shrank them under our mapping
        self.last_error: RingError | None = None  # why the segment under the name was refused, if it was
        self._native = None
        self._last_refresh = 0.0

    def _open(self):  # -> native consumer
        raise NotImplementedError

    def _on_attach(self) -> None:
        pass

    def _on_detach(self, old) -> None:
        pass

    def _has_data(self) -> bool:
        raise NotImplementedError

    def _ruined(self, native) -> bool:  # the mapped segment can no longer be trusted
        return False

    def _require(self) -> None:
        if self._native is None:
            raise SegmentNotFound(2, f"{self.name}: not attached (no such segment in {self.shm_dir})")

    @property
    def generation(self) -> int:
        """Generation of the attached segment: 1 + that of the segment it replaced."""
        self._require()
        return self._native.generation

    @property
    def connected(self) -> bool:
        """Attached to a segment that its writer has not closed or replaced."""
        n = self._native
        return n is not None and not (n.flags & (_ring.RING_CLOSED | _ring.RING_SUPERSEDED))

    def refresh(self, force: bool = False) -> bool:
        """Reattaches if the segment under the name changed. True if it did."""
        now = time.monotonic()
        n = self._native
        if n is not None and self._ruined(n):
            self.truncations += 1
            self._on_detach(n)
            n.close()
            self._native = None
            raise TruncatedSegment(f"{self.name}: the producer shrank the segment while it was mapped; "
                                   f"detached (what was read after that is dropped) until a whole segment "
                                   f"stands under the name")
        if n is not None and not force and not (n.flags & (_ring.RING_CLOSED | _ring.RING_SUPERSEDED)) \
                and now - self._last_refresh < self.refresh_interval:
            return False
        self._last_refresh = now
        ident = _ring.identity_of(self.shm_dir, self.name)
        if ident is None or (n is not None and ident == n.identity):
            if n is not None:
                n.acknowledge_flags()
            return False
        new = self._open()  # errors here (bad segment, busy) are the caller's to see
        if n is not None:
            self._on_detach(n)
            n.close()
        self._native = new
        self.attach_count += 1
        self._on_attach()
        return True

    def _attach_now(self) -> None:
        self._native = self._open()
        self.attach_count = 1
        self._last_refresh = time.monotonic()
        self._on_attach()

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_waitset = _ring.WaitSet()


def _wait(followers: Sequence[_Follower], timeout: float, spin: float) -> list:
    """Waits until some follower has something to read; handles reattachment."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        for f in followers:
            try:
                f.refresh()  # cheap unless flagged, unattached, or refresh_interval has passed
                f.last_error = None
            except (RingError, OSError) as e:
                f.last_error = e  # a bad, busy or unreadable segment under the name: wait for a good one
        attached = [f for f in followers if f._native is not None]
        ready = [f for f in attached if f._has_data()]
        if ready:
            return ready
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        # A name with no live segment has no doorbell: wake up to look for it.
        if len(attached) < len(followers) or not all(f.connected for f in attached):
            remaining = min(remaining, _Follower.refresh_interval)
        if attached:
            _waitset.wait([f._native for f in attached], remaining, spin)
        else:
            time.sleep(remaining)


def wait_any(readers: Sequence["FrameReader | ResultReader"], timeout: float, spin: float = 0.0) -> list:
    """Sleeps on many rings at once (futex_waitv; per-ring timed waits where the
    kernel lacks it), after spinning up to `spin` seconds. Returns the readers
    with something new, [] on timeout. At most MAX_WAIT readers."""
    if len(readers) > MAX_WAIT:
        raise ValueError(f"wait_any takes at most {MAX_WAIT} readers, got {len(readers)}")
    natives = [f._native for f in readers]
    if None not in natives and not any(n.flags for n in natives):
        # Fast path: every name attached to a live ring; one native wait, no name checks.
        ready = [f for f in readers if f._has_data()]
        if ready:
            return ready
        if _waitset.wait(natives, timeout, spin):
            ready = [f for f in readers if f._has_data()]
            if ready:
                return ready
        timeout = 0.0  # timed out or a flag changed: the general path looks at the names once
    return _wait(readers, timeout, spin)


# ------------------------------------------------------------------ frames


Frame = _ring.Frame  # the held frame: zero-copy, read-only view + metadata (see native/ring.pyx)


class FrameReader(_Follower):
    """The consumer of one frame ring (one per ring; a second gets ConsumerBusy)."""

    def __init__(self, name: str, shm_dir: str = SHM_DIR, allowed_uids: Sequence[int] | None = None):
        super().__init__(name, shm_dir, allowed_uids)
        self.frames_acquired = 0
        self.frames_skipped = 0  # published frames never acquired (newest frame wins)

    @classmethod
    def attach(cls, name: str, *, shm_dir: str = SHM_DIR, allowed_uids: Sequence[int] | None = None) -> "FrameReader":
        """Attaches now; raises SegmentNotFound and the validation errors."""
        r = cls(name, shm_dir, allowed_uids)
        r._attach_now()
        return r

    @classmethod
    def watch(cls, name: str, *, shm_dir: str = SHM_DIR, allowed_uids: Sequence[int] | None = None) -> "FrameReader":
        """A reader that attaches when the segment appears (wait() looks for it)."""
        r = cls(name, shm_dir, allowed_uids)
        try:
            r._attach_now()
        except RingError as e:  # absent, or not acceptable yet: wait() keeps looking
            r.last_error = None if isinstance(e, SegmentNotFound) else e
        return r

    def _open(self):
        return _ring.FrameConsumer(self.shm_dir, self.name, self.allowed_uids)

    def _has_data(self) -> bool:
        return self._native.has_frame()

    def _ruined(self, native) -> bool:
        return native.truncated

    @property
    def truncated(self) -> bool:
        """The producer shrank the attached segment: frames read from it since are not its frames."""
        n = self._native
        return n is not None and n.truncated

    @property
    def layout(self) -> dict:
        self._require()
        return self._native.layout

    @property
    def producer_alive(self) -> bool:
        return self._native is not None and self._native.producer_alive()

    @property
    def counters(self) -> dict:
        self._require()
        return self._native.counters

    def wait(self, timeout: float, spin: float = 0.0) -> bool:
        """True when a frame newer than the last acquired is there (GIL released while asleep)."""
        n = self._native
        if n is not None and not n.flags:  # fast path: attached to a live ring
            if n.has_frame() or (_waitset.wait((n,), timeout, spin) and n.has_frame()):
                return True
            if not n.flags:
                self.refresh()  # timed out: has the name moved on without telling us?
                return self._native is not n and self._native.has_frame()
            timeout = 0.0  # woken by a flag change: the general path reattaches
        return bool(_wait((self,), timeout, spin))

    def acquire_latest(self) -> Frame | None:
        """Holds the newest complete frame if newer than the last one; None otherwise."""
        n = self._native
        if n is None:
            return None
        f = n.acquire()  # RingStateError if a frame of this segment is still held
        if f is not None:
            self.frames_skipped += f.skipped
            self.frames_acquired += 1
        return f

    def next_frame(self, timeout: float, spin: float = 0.0) -> Frame | None:
        """wait() then acquire_latest() with one native call on the hot path:
        the newest frame newer than the last one, or None after `timeout`."""
        n = self._native
        if n is not None and not n.flags:
            f = n.wait_acquire(timeout, spin)
            if f is not None:
                self.frames_skipped += f.skipped
                self.frames_acquired += 1
                return f
            if not n.flags:
                self.refresh()
                return self.acquire_latest() if self._native is not n else None
            timeout = 0.0
        return self.acquire_latest() if self.wait(timeout, spin) else None

    def peek_capture_ns(self) -> int:
        """Capture time of the newest published frame without claiming it; 0 if none."""
        n = self._native
        return n.peek_capture_ns() if n is not None else 0

    def slot_address(self, slot: int) -> int:
        """Address of a slot's payload in our mapping (for zero-copy checks)."""
        self._require()
        return self._native.slot_address(slot)

    def slot_state(self, slot: int) -> tuple[int, int]:
        self._require()
        return self._native.slot_state(slot)


# ------------------------------------------------------------------ results

RESULT_OK = 0


@dataclasses.dataclass(frozen=True, slots=True)
class ResultRecord:
    """One result, copied out of the ring (see docs/abi.md for the payload layouts)."""

    number: int
    frame_seq: int
    frame_id: int
    capture_ns: int
    capture_realtime_ns: int
    start_ns: int
    done_ns: int
    status: int
    kind: int
    item_count: int
    model_name: str
    model_version: str
    payload: bytes
    missed: int  # records overwritten before this one could be read


class ResultWriter:
    """The daemon's end of a result ring (one writer)."""

    def __init__(self, producer: _ring.ResultProducer):
        self._p = producer

    @classmethod
    def create(cls, name: str, payload_capacity: int, *, records: int = 64, mode: int = 0o660,
               group: str | int | None = None, shm_dir: str = SHM_DIR) -> "ResultWriter":
        return cls(_ring.ResultProducer(shm_dir, name, records, payload_capacity, mode, _gid(group)))

    @property
    def name(self) -> str:
        return self._p.name

    @property
    def payload_capacity(self) -> int:
        return self._p.payload_capacity

    def write(self, *, frame_seq: int = 0, frame_id: int = 0, capture_ns: int = 0, capture_realtime_ns: int = 0,
              start_ns: int = 0, done_ns: int | None = None, status: int = RESULT_OK, kind: int = 0,
              payload=b"", item_count: int = 0, model_name: str = "", model_version: str = "") -> int:
        """Publishes one record; returns its number (1-based)."""
        buf = np.frombuffer(payload, dtype=np.uint8) if not isinstance(payload, np.ndarray) \
            else payload.reshape(-1).view(np.uint8)
        return self._p.write(frame_seq, frame_id, capture_ns, capture_realtime_ns, start_ns,
                             monotonic_ns() if done_ns is None else done_ns, status, kind, buf, item_count,
                             model_name.encode(), model_version.encode())

    def close(self, unlink: bool = True) -> None:
        self._p.close(unlink)

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResultReader(_Follower):
    """One of any number of readers of a result ring; reattaches when the daemon restarts."""

    def __init__(self, name: str, shm_dir: str = SHM_DIR, allowed_uids: Sequence[int] | None = None,
                 from_oldest: bool = False):
        super().__init__(name, shm_dir, allowed_uids)
        self.from_oldest = from_oldest
        self._missed_before = 0

    @classmethod
    def attach(cls, name: str, *, from_oldest: bool = False, shm_dir: str = SHM_DIR,
               allowed_uids: Sequence[int] | None = None) -> "ResultReader":
        r = cls(name, shm_dir, allowed_uids, from_oldest)
        r._attach_now()
        return r

    @classmethod
    def watch(cls, name: str, *, from_oldest: bool = False, shm_dir: str = SHM_DIR,
              allowed_uids: Sequence[int] | None = None) -> "ResultReader":
        """A reader of every record written from now on: attached now if the ring is there, else when it
        appears (read() looks for it), and then from its start, since all of it is newer than this call."""
        r = cls(name, shm_dir, allowed_uids, from_oldest)
        try:
            r._attach_now()
        except RingError as e:  # absent, or not acceptable yet: read() keeps looking
            r.last_error = None if isinstance(e, SegmentNotFound) else e
            r._watched_before_ring = True
        return r

    _watched_before_ring = False  # watch() found no ring: the first one attached holds nothing we saw

    def _open(self):
        # After the first attach (or a watch() that came before the ring), a new segment is read from its
        # start: nothing in it was seen.
        oldest = self.from_oldest or self.attach_count > 0 or self._watched_before_ring
        return _ring.ResultConsumer(self.shm_dir, self.name, self.allowed_uids, oldest)

    def _on_detach(self, old) -> None:
        self._missed_before += old.missed

    def _has_data(self) -> bool:
        return self._native.has_record()

    @property
    def missed(self) -> int:
        """Records lost to overwrite since attach, over all segments followed."""
        return self._missed_before + (self._native.missed if self._native is not None else 0)

    def read(self, timeout: float = 0.0) -> ResultRecord | None:
        """The next record, waiting up to `timeout` seconds; None if none came."""
        deadline = time.monotonic() + timeout
        last_look = False
        while True:
            n = self._native
            if n is not None:
                got = n.next()
                if got is not None:
                    fields, payload, missed = got
                    (number, frame_seq, frame_id, cap, real, start, done, status, kind, items, mname,
                     mver) = fields
                    return ResultRecord(number, frame_seq, frame_id, cap, real, start, done, status, kind, items,
                                        mname.decode(errors="replace"), mver.decode(errors="replace"), payload,
                                        missed)
            if last_look:
                return None
            remaining = deadline - time.monotonic()
            last_look = remaining <= 0
            # _wait looks under the name first, also with no time left: a poller calling read(0) must
            # still move on to a restarted daemon's new ring.
            _wait((self,), max(remaining, 0.0), 0.0)

    def follow(self, timeout: float | None = None) -> Iterator[ResultRecord]:
        """Yields records as they come; stops after `timeout` seconds without one (None: never)."""
        while True:
            rec = self.read(timeout if timeout is not None else 3600.0)
            if rec is None:
                if timeout is not None:
                    return
                continue
            yield rec
