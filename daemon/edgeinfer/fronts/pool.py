"""The gateway's rings: one frame ring and its result ring per stream of a pool, one request in flight on each.

A `Slot` is one of the pool's streams as the gateway holds it: a FrameWriter
(the gateway is the stream's producer) and a ResultReader (its only reader).
A request takes a free slot of its model and frame size, writes its frame,
and waits for the record that names its frame id. With one request in flight
per ring, newest-frame-wins never drops a request: every request is answered
with its result or an error.

Whether edgeinferd serves: the result ring's connection. The frame ring's
connection is no evidence: edgeinferd keeps it in systemd's fd store, so it
stays open while the daemon is stopped or dead, but a result ring's closes
with the daemon. A request on a ring whose results connection is gone, and a
request in flight when it goes, is answered UNAVAILABLE at once, never left
to its deadline. Requests never reconnect (a reconnection may wait on a
socket unit's backlog); the keeper does, on free rings: one probe ring per
gateway every PROBE_RETRY_MAX_S at most, and all the others at once when it
gets in (ServedModels.keep), so answers resume within a fraction of a second of the
daemon serving without each ring knocking on the daemon's backlog.

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

Admission by deadline: a request that would wait is refused at once
(RESOURCE_EXHAUSTED, reason `deadline_short`, with the retry hint) when its
deadline leaves less than its expected wait and run: L requests ahead of it on
R rings, each held about `hold_ns` (the moving average of how long a request
holds a ring), is (L/R + 1) × hold_ns. Such a request could not be answered in
time; admitted, it would hold a place in line and then a ring (until its
deadline and the grace) for an answer nobody reads. A request with a free ring
is never refused so (its frame may still make it; the daemon drops it unrun if
no lane takes it in time). A waiter whose deadline passes is never handed a
ring: release() skips it, and one that gets a ring too late gives it on
unused; Slot.run() publishes no frame whose deadline has passed.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time

import numpy as np

from edgeinfer.abi import ring

DEADLINE_GRACE_S = 0.05  # after its deadline a frame taken just in time may still be running: its answer waits this
HOLD_NS_START = 10_000_000  # a pool's hold time before any request has held a ring
PROBE_RETRY_MAX_S = 0.25  # the probe ring's longest wait between reconnections while edgeinferd is away


class FrontError(Exception):
    """A request's failure, as a gRPC status code name (each front maps it to its protocol)."""

    def __init__(self, code: str, message: str, reason: str | None = None, retry_ms: int | None = None):
        super().__init__(message)
        self.code = code                  # INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...
        self.reason = reason or code.lower()  # counted by this (a short word)
        self.retry_ms = retry_ms          # when a retry may find room (a shed request: the front's retry hint)


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
        self.taken_ns = 0  # when its request took it (SizePool's pace)

    @property
    def connected(self) -> bool:
        return self.writer.connected and self.reader.connected

    def _unavailable(self, while_waiting: bool) -> FrontError:
        why = self.reader.last_error or self.writer.connection.get("last_error") or "not connected"
        if while_waiting:
            return FrontError("UNAVAILABLE", f"edgeinferd went away while the request waited (stream {self.stream}; "
                              "its frame may or may not have been run): retry", "daemon_unavailable")
        return FrontError("UNAVAILABLE", f"edgeinferd is not serving stream {self.stream} now ({why}): retry",
                          "daemon_unavailable")

    def run(self, frame: np.ndarray, deadline_ns: int, timing: Timing) -> ring.ResultRecord:
        """Writes `frame` (flat uint8, frame_bytes long) and waits for its record until the deadline."""
        with self.lock:
            if not self.writer.connected:
                self.writer.step()
            if not (self.writer.connected and self.reader.connected):
                raise self._unavailable(False)
            attached = self.reader.attach_count
            while self.reader.read(0.0) is not None:
                pass  # late answers to earlier requests on this ring
            if time.monotonic_ns() >= deadline_ns:  # never run afterwards: no frame is sent past its deadline
                raise FrontError("DEADLINE_EXCEEDED", "the deadline passed while the request waited for a ring (it "
                                 "was not run)", "deadline_waiting")
            frame_id = next(self._ids)
            view = self.writer.begin_flat()
            view[:self.frame_bytes] = frame
            now = timing.published = time.monotonic_ns()  # before publish(): the lane it wakes may preempt us
            # Stale to the daemon at the request's deadline: a frame not taken by then is never run.
            self.writer.publish(capture_ns=min(now, deadline_ns - self.max_age_ns), frame_id=frame_id,
                                realtime_ns=time.time_ns())
            until = deadline_ns + int(DEADLINE_GRACE_S * 1e9)
            while True:
                # The daemon gone (or back as another one, whose ring never saw this frame): said at once.
                if not self.reader.connected or self.reader.attach_count != attached or not self.writer.connected:
                    raise self._unavailable(True)
                left = (until - time.monotonic_ns()) / 1e9
                if left <= 0:
                    raise FrontError("DEADLINE_EXCEEDED", "the deadline passed before the answer came (a frame "
                                     "that no lane had taken by then was dropped, never run)", "deadline")
                rec = self.reader.read(min(left, 0.05))
                if rec is not None and rec.frame_id == frame_id and self.reader.attach_count == attached:
                    timing.answered = time.monotonic_ns()
                    return rec

    def close(self) -> None:
        with self.lock:
            self.writer.close()
            self.reader.close()


class _Waiter:
    __slots__ = ("slot", "deadline_ns", "expired")

    def __init__(self, deadline_ns: int):
        self.slot: Slot | None = None
        self.deadline_ns = deadline_ns
        self.expired = False  # its deadline passed in line: release() took it out, handing it nothing


class SizePool:
    """The slots of one model and frame size; at most `max_waiting` requests wait for one."""

    def __init__(self, slots: list[Slot], max_waiting: int):
        self.slots = slots
        self.free = collections.deque(slots)
        self.max_waiting = max_waiting
        self.waiting = 0
        self.in_flight = 0
        self.hold_ns = HOLD_NS_START  # how long a request holds a slot (moving average): the expected wait's base
        self.cond = threading.Condition()
        self._queue: collections.deque = collections.deque()  # waiting requests, first come first served

    @property
    def full(self) -> bool:
        """A request now would be shed (read without the lock: a hint for refusing at a request's HEADERS; acquire()
        decides under it)."""
        return (not self.free or bool(self._queue)) and len(self._queue) >= self.max_waiting

    def wait_ns(self) -> int:
        """What a request arriving now should expect to wait for its answer, 0 with a ring free (read without the
        lock: the hint for refusing at a request's HEADERS; acquire() decides under it)."""
        ahead = len(self._queue)
        if self.free and not ahead:
            return 0
        n = len(self.slots)
        return self.hold_ns * (ahead + n) // n

    def retry_ms(self) -> int:
        """When a request shed now might find room: its turn behind those waiting, at the slots' recent pace."""
        return max(1, -(-self.hold_ns * (len(self._queue) + 1) // (len(self.slots) * 1_000_000)))

    def acquire(self, deadline_ns: int) -> Slot:
        with self.cond:
            if self.free and not self._queue:
                self.in_flight += 1
                # A connected ring first: after a (re)start some may still wait for the daemon's handshake.
                slot = next((s for s in self.free if s.connected), self.free[0])
                self.free.remove(slot)
                slot.taken_ns = time.monotonic_ns()
                return slot
            ahead, n = len(self._queue), len(self.slots)
            if ahead >= self.max_waiting:
                raise FrontError("RESOURCE_EXHAUSTED", f"all {n} rings of this model and size are busy "
                                 f"and {ahead} requests wait: retry later", "shed", self.retry_ms())
            need = self.hold_ns * (ahead + n) // n
            if deadline_ns - time.monotonic_ns() < need:  # could not be answered in time: refused, not run late
                raise FrontError("RESOURCE_EXHAUSTED", f"all {n} rings of this model and size are busy and {ahead} "
                                 f"requests wait: an answer would take about {need // 1_000_000} ms, more than the "
                                 "request's deadline leaves: retry later, or with a longer deadline", "deadline_short",
                                 self.retry_ms())
            waiter = _Waiter(deadline_ns)
            self._queue.append(waiter)
            self.waiting = len(self._queue)
            while waiter.slot is None:
                left = (deadline_ns - time.monotonic_ns()) / 1e9
                if waiter.expired or left <= 0:
                    if not waiter.expired:
                        self._queue.remove(waiter)
                        self.waiting = len(self._queue)
                    raise FrontError("DEADLINE_EXCEEDED", "the deadline passed while the request waited for a "
                                     "ring (it was not run)", "deadline_waiting")
                self.cond.wait(left)
            self.in_flight += 1
            return waiter.slot

    def release(self, slot: Slot, ran: bool = True) -> None:
        """The slot goes to the first request waiting whose deadline has not passed (handed over: it leaves the line
        now; those past theirs leave it with nothing), else back to free. ran: its frame was sent (the hold counts
        in the pace; a request that gave its ring on unused does not)."""
        with self.cond:
            now = time.monotonic_ns()
            if ran:
                self.hold_ns += (now - slot.taken_ns - self.hold_ns) // 8
            slot.taken_ns = now
            self.in_flight -= 1
            queue = self._queue
            while queue:
                waiter = queue.popleft()
                if waiter.deadline_ns > now:
                    waiter.slot = slot
                    break
                waiter.expired = True
            else:
                self.free.append(slot)
            self.waiting = len(queue)
            self.cond.notify_all()

    def keep(self) -> None:
        """Steps the free slots' connections (reconnection after a daemon restart): the frame ring's, and the result
        ring's by reading it (on a free slot, whatever it holds is a late answer nobody waits for; a reconnection is
        tried when its backoff says)."""
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
