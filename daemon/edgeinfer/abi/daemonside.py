"""The daemon's side of the rings: FrameReader, the consumer of a frame ring a camera handed over, and
ResultWriter, the writer of a stream's result ring (both re-exported by abi/ring.py).
"""
from __future__ import annotations

from edgeinfer import _ring
from edgeinfer.abi.ringdefs import Frame, _waitset, monotonic_ns
from edgeinfer.abi.vocabulary import RESULT_OK

__all__ = ["FrameReader", "ResultWriter"]


class FrameReader:
    """The consumer of one frame ring, from the fd its producer handed over.
    The fd is checked before anything is mapped: a sealed memfd (it can never
    shrink), of exactly the size its header declares, open read-write."""

    def __init__(self, fd: int, name: str = "frame ring", max_size: int = 1 << 40, join: bool = False):
        """join: another process of the daemon (a lane) consumes it too: its shared consumer line is kept."""
        self._c = _ring.FrameConsumer(fd, name, max_size, join)
        self.name = name
        self.frames_acquired = 0
        self.frames_skipped = 0  # published frames never taken (newest frame wins)
        self.geometry_key: tuple | None = None  # a lane's: the geometry of the session serving this ring

    @property
    def native(self) -> _ring.FrameConsumer:
        return self._c

    @property
    def layout(self) -> dict:
        return self._c.layout

    @property
    def fd(self) -> int:
        return self._c.fd

    @property
    def closed(self) -> bool:
        """The producer closed the ring cleanly."""
        return self._c.closed

    @property
    def truncated(self) -> bool:
        return self._c.truncated

    @property
    def counters(self) -> dict:
        return self._c.counters

    @property
    def status(self) -> int:
        """Why the last take() returned None: 0 nothing new, TAKE_SHORT, TAKE_CORRUPT."""
        return self._c.status

    def wait(self, timeout: float, spin: float = 0.0) -> bool:
        """True when a frame not taken yet is there (GIL released while asleep)."""
        c = self._c
        return c.has_frame() or bool(_waitset.wait((c,), timeout, spin)) and c.has_frame()

    def take(self) -> Frame | None:
        """Holds the newest complete frame if `latest` changed; None otherwise (see status)."""
        f = self._c.take()
        if f is not None:
            self.frames_skipped += f.skipped
            self.frames_acquired += 1
        return f

    acquire_latest = take

    def next_frame(self, timeout: float, spin: float = 0.0) -> Frame | None:
        """wait() then take(): the newest frame not taken yet, or None after `timeout`."""
        return self.take() if self.wait(timeout, spin) else None

    def slot_address(self, slot: int) -> int:
        """Address of a slot's payload in our mapping (for zero-copy checks)."""
        return self._c.slot_address(slot)

    def slot_state(self, slot: int) -> tuple[int, int]:
        return self._c.slot_state(slot)

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResultWriter:
    """The daemon's end of a result ring: a memfd sealed read-only for every
    mapping but the writer's own, handed to readers by fd."""

    def __init__(self, producer: _ring.ResultProducer):
        self._p = producer

    @classmethod
    def create(cls, payload_capacity: int, *, records: int = 64, label: str = "edgeinfer-results",
               generation: int = 1) -> "ResultWriter":
        return cls(_ring.ResultProducer(label, records, payload_capacity, generation))

    @property
    def fd(self) -> int:
        """The sealed memfd to hand to readers (the writer's own)."""
        return self._p.fd

    @property
    def payload_capacity(self) -> int:
        return self._p.payload_capacity

    def drop_fd(self) -> None:
        """Closes this process's fd of the ring, keeping the mapping (the lanes' zygote)."""
        self._p.drop_fd()

    def resume(self) -> None:
        """Continue from the ring's head (lanes sharing this writer take turns writing)."""
        self._p.resume()

    @property
    def head(self) -> int:
        """The number of the newest record (1-based, 0 = none) as of this writer's last write or resume()."""
        return self._p.head

    def set_wake(self, wake: bool) -> None:
        """FUTEX_WAKE on every record (while readers are connected), or not at all."""
        self._p.set_wake(wake)

    def write(self, *, frame_seq: int = 0, frame_id: int = 0, capture_ns: int = 0, capture_realtime_ns: int = 0,
              start_ns: int = 0, done_ns: int | None = None, status: int = RESULT_OK, kind: int = 0,
              payload=b"", item_count: int = 0, model_name: str = "", model_version: str = "",
              frame_width: int = 0, frame_height: int = 0) -> int:
        """Publishes one record; returns its number (1-based). payload: bytes or a C-contiguous array (its bytes)."""
        return self._p.write(frame_seq, frame_id, capture_ns, capture_realtime_ns, start_ns,
                             monotonic_ns() if done_ns is None else done_ns, status, kind, payload, item_count,
                             model_name.encode(), model_version.encode(), frame_width, frame_height)

    def write_served(self, frame, start_ns: int, done_ns: int, kind: int, payload, item_count: int,
                     model_name: bytes, model_version: bytes, frame_width: int, frame_height: int) -> int:
        """The lane loop's write of a served frame's result (RESULT_OK): positional, the names already encoded,
        the payload's buffer read in place (no keyword parsing, encoding or array view made per frame)."""
        return self._p.write(frame.seq, frame.frame_id, frame.capture_ns, frame.capture_realtime_ns, start_ns,
                             done_ns, RESULT_OK, kind, payload, item_count, model_name, model_version, frame_width,
                             frame_height)

    def close(self) -> None:
        """Marks the ring closed: readers see it at once."""
        self._p.close()

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
