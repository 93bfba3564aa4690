"""The gateway's rings: one frame ring and its result ring per stream of a pool, one request in flight on each.

A `Slot` is one of the pool's streams as the gateway holds it: a FrameWriter
(the gateway is the stream's producer) and a ResultReader (its only reader).
A request takes a free slot of its model and frame size, writes its frame,
and waits for the record that names its frame id. With one request in flight
per ring, newest-frame-wins never drops a request: every request is answered
with its result or an error.

Deadlines: the frame is stamped so that it turns stale, to the daemon, the
moment the request's deadline passes (capture = deadline − the stream's
max_age). A frame that has not been taken by a lane by then is dropped by the
daemon and never run, and the request is answered DEADLINE_EXCEEDED. (The
daemon's age and e2e figures for pool streams therefore count from that
stamp; the gateway's own metrics split the real latency.)

A `SizePool` hands out the slots of one model and size. When all are busy, at
most `max_waiting` requests wait (first come, first served, each until its
deadline); beyond that a request is shed at once (RESOURCE_EXHAUSTED): a queue
without bound would only turn load into latency.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time

import numpy as np

from edgeinfer.abi import ring

DEADLINE_GRACE_S = 0.05  # after its deadline a frame taken just in time may still be running: its answer waits this


class FrontError(Exception):
    """A request's failure, as a gRPC status code name (each front maps it to its protocol)."""

    def __init__(self, code: str, message: str, reason: str | None = None):
        super().__init__(message)
        self.code = code                  # INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...
        self.reason = reason or code.lower()  # counted by this (a short word)


class Timing:
    """Where a request's time went (monotonic ns): waiting for a ring, then the frame's way through the daemon."""

    __slots__ = ("received", "slot", "published", "answered")

    def __init__(self):
        self.received = time.monotonic_ns()
        self.slot = self.published = self.answered = 0


class Slot:
    """One stream of a pool: the gateway's frame ring for it and its result ring."""

    _ids = itertools.count(1)

    def __init__(self, stream: str, width: int, height: int, pixel_format: str, max_age_ms: float, *,
                 ingress_socket: str, results_socket: str):
        self.stream = stream
        self.size = (width, height)
        self.max_age_ns = int(max_age_ms * 1e6)
        self.writer = ring.FrameWriter.connect(stream, width, height, pixel_format, slots=3, socket=ingress_socket,
                                               wait=0)  # never waits: connects when the daemon is there
        try:
            self.reader = ring.ResultReader.watch(stream, socket=results_socket)
        except BaseException:
            self.writer.close()
            raise
        self.frame_bytes = self.writer.layout["frame_bytes"]
        self.lock = threading.Lock()  # the slot's user: one request, or the keeper's step()

    @property
    def connected(self) -> bool:
        return self.writer.connected and self.reader.connected

    def run(self, frame: np.ndarray, deadline_ns: int, timing: Timing) -> ring.ResultRecord:
        """Writes `frame` (flat uint8, frame_bytes long) and waits for its record until the deadline."""
        with self.lock:
            if not self.writer.connected:
                self.writer.step()
                if not self.writer.connected:
                    raise FrontError("UNAVAILABLE", f"edgeinferd is not serving stream {self.stream} now "
                                     f"({self.writer.connection.get('last_error') or 'not connected'}): retry",
                                     "daemon_unavailable")
            while self.reader.read(0.0) is not None:
                pass  # late answers to earlier requests on this ring
            frame_id = next(self._ids)
            view = self.writer.begin_flat()
            view[:self.frame_bytes] = frame
            now = timing.published = time.monotonic_ns()  # before publish(): the lane it wakes may preempt us
            # Stale to the daemon at the request's deadline: a frame not taken by then is never run.
            self.writer.publish(capture_ns=min(now, deadline_ns - self.max_age_ns), frame_id=frame_id,
                                realtime_ns=time.time_ns())
            until = deadline_ns + int(DEADLINE_GRACE_S * 1e9)
            while True:
                left = (until - time.monotonic_ns()) / 1e9
                if left <= 0:
                    if not self.writer.connected:
                        raise FrontError("UNAVAILABLE", "edgeinferd went away while the request waited: retry",
                                         "daemon_unavailable")
                    raise FrontError("DEADLINE_EXCEEDED", "the deadline passed before the answer came (a frame "
                                     "that no lane had taken by then was dropped, never run)", "deadline")
                rec = self.reader.read(min(left, 0.1))
                if rec is not None and rec.frame_id == frame_id:
                    timing.answered = time.monotonic_ns()
                    return rec

    def close(self) -> None:
        with self.lock:
            self.writer.close()
            self.reader.close()


class _Waiter:
    __slots__ = ("slot",)

    def __init__(self):
        self.slot: Slot | None = None


class SizePool:
    """The slots of one model and frame size; at most `max_waiting` requests wait for one."""

    def __init__(self, slots: list[Slot], max_waiting: int):
        self.slots = slots
        self.free = collections.deque(slots)
        self.max_waiting = max_waiting
        self.waiting = 0
        self.in_flight = 0
        self.cond = threading.Condition()
        self._queue: collections.deque = collections.deque()  # waiting requests, first come first served

    def acquire(self, deadline_ns: int) -> Slot:
        with self.cond:
            if self.free and not self._queue:
                self.in_flight += 1
                # A connected ring first: after a (re)start some may still wait for the daemon's handshake.
                slot = next((s for s in self.free if s.connected), self.free[0])
                self.free.remove(slot)
                return slot
            if len(self._queue) >= self.max_waiting:
                raise FrontError("RESOURCE_EXHAUSTED", f"all {len(self.slots)} rings of this model and size are busy "
                                 f"and {len(self._queue)} requests wait: retry later", "shed")
            waiter = _Waiter()
            self._queue.append(waiter)
            self.waiting = len(self._queue)
            while waiter.slot is None:
                left = (deadline_ns - time.monotonic_ns()) / 1e9
                if left <= 0:
                    self._queue.remove(waiter)
                    self.waiting = len(self._queue)
                    raise FrontError("DEADLINE_EXCEEDED", "the deadline passed while the request waited for a "
                                     "ring (it was not run)", "deadline_waiting")
                self.cond.wait(left)
            self.in_flight += 1
            return waiter.slot

    def release(self, slot: Slot) -> None:
        """The slot goes to the first request waiting (handed over: it leaves the line now), else back to free."""
        with self.cond:
            self.in_flight -= 1
            if self._queue:
                waiter = self._queue.popleft()
                waiter.slot = slot
                self.waiting = len(self._queue)
                self.cond.notify_all()
            else:
                self.free.append(slot)

    def keep(self) -> None:
        """Steps the free slots' connections (reconnection after a daemon restart): the frame ring's, and the result
        ring's by reading it (on a free slot, whatever it holds is a late answer nobody waits for)."""
        with self.cond:
            idle = list(self.free)
        for slot in idle:
            if slot.lock.acquire(blocking=False):
                try:
                    slot.writer.step()
                    while slot.reader.read(0.0) is not None:
                        pass
                finally:
                    slot.lock.release()

    @property
    def connected(self) -> bool:
        """Every ring of this size is connected to edgeinferd."""
        return all(s.connected for s in self.slots)
