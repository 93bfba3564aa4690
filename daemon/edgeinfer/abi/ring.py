"""Rings and their handover: the Python face of native/include/edgeinfer/ring.h (ABI 2).

Cameras:   FrameWriter.connect(stream, width, height) → begin() → fill the view → publish().
           The ring is a sealed memfd handed to edgeinferd over its ingress socket; the
           connection is the liveness, and it is re-established by itself (with backoff)
           whenever the daemon comes back.
Readers:   ResultReader.connect(stream) / ResultReader.watch(stream) → read() / follow().
           The daemon hands over the stream's result ring (read-only for everyone but it).
The daemon: FrameReader(fd) from a received ring, ResultWriter.create(...), WaitSet.

This module is the API's one name (`edgeinfer.ring` is this module): it holds the readers' side
(ResultReader, wait_any) and re-exports the rest, each in a module of its own: ring.h's names (errors,
constants, pixel formats: ringdefs.py), the cameras' side (framewriter.py), the daemon's (daemonside.py).
Only the modules of abi/ import the native core.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Iterator

from edgeinfer import _ring
from edgeinfer.abi import daemonside, framewriter, ringdefs
from edgeinfer.abi.daemonside import *  # noqa: F401,F403  (re-exported: the daemon's API)
from edgeinfer.abi.framewriter import *  # noqa: F401,F403  (re-exported: the cameras' API)
from edgeinfer.abi.ringdefs import *  # noqa: F401,F403  (re-exported: ring.h's names are part of the API)
from edgeinfer.abi.ringdefs import MAX_WAIT, RESULTS_SOCKET, DaemonUnavailable, RingError, _waitset, transient
from edgeinfer.abi.vocabulary import RESULT_OK, YUV_BASES, yuv_format_name  # noqa: F401  (re-exported)

# The API's names (`from edgeinfer.ring import *`): this module's, then each part's own __all__.
__all__ = ["ResultReader", "ResultRecord", "wait_any", "RESULT_OK", "YUV_BASES", "yuv_format_name",
           *ringdefs.__all__, *framewriter.__all__, *daemonside.__all__]


def wait_any(readers, timeout: float, spin: float = 0.0) -> list:
    """Sleeps on many rings at once (futex_waitv; per-ring timed waits where the
    kernel lacks it), after spinning up to `spin` seconds. Returns the readers
    with something new, [] on timeout. At most MAX_WAIT readers."""
    if len(readers) > MAX_WAIT:
        raise ValueError(f"wait_any takes at most {MAX_WAIT} readers, got {len(readers)}")
    mask = _waitset.wait([r.native for r in readers], timeout, spin)
    return [r for i, r in enumerate(readers) if mask >> i & 1]


# ------------------------------------------------------------------ results


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
    frame_width: int = 0   # the input frame's size in pixels; 0: not said (a daemon before 0.3)
    frame_height: int = 0


class ResultReader:
    """One of any number of readers of a stream's result ring. It reads a
    read-only mapping and writes no shared memory. Connected through the
    daemon's results socket, it follows the daemon: when the connection closes
    (the daemon stopped or died), it reconnects with backoff and reads the new
    ring from its start. Handed the same ring again (the same daemon closed the
    connection for a new reader: docs/abi.md, "Who is a party"), it reads on
    where it was."""

    retry_min, retry_max = 0.05, 2.0  # seconds between reconnection attempts (doubling)
    liveness_interval = 0.1           # longest sleep before looking at the connection again

    def __init__(self, stream: str, *, socket: str | None = RESULTS_SOCKET, from_oldest: bool = False):
        self.stream = stream
        self.socket = socket
        self.from_oldest = from_oldest
        self.attach_count = 0
        self.last_error: RingError | OSError | None = None  # why the last (re)connection failed
        self._c: _ring.ResultConsumer | None = None
        self._held: _ring.ResultConsumer | None = None  # the last ring, not closed, while its connection is gone
        self._ring_key: tuple | None = None  # (st_dev, st_ino) of the ring read: the same memfd if handed again
        self._sock = -1
        self._missed_before = 0
        self._retry_at = 0.0
        self._retry = self.retry_min
        self._watched_before_ring = False  # watch() found no ring: the first one attached holds nothing we saw

    @classmethod
    def connect(cls, stream: str, *, socket: str = RESULTS_SOCKET, from_oldest: bool = False,
                timeout: float = 10.0) -> "ResultReader":
        """Attached now, or raises (the daemon's refusal, DaemonUnavailable, HandshakeTimeout)."""
        r = cls(stream, socket=socket, from_oldest=from_oldest)
        r._attach(timeout, r.from_oldest)
        return r

    @classmethod
    def watch(cls, stream: str, *, socket: str = RESULTS_SOCKET, from_oldest: bool = False) -> "ResultReader":
        """A reader of every record written from now on: attached now if the daemon is there, else when
        it comes (read() keeps trying), and then from the ring's start, since all of it is newer than
        this call. A refusal (this reader may not read the stream) is raised at once."""
        r = cls(stream, socket=socket, from_oldest=from_oldest)
        try:
            r._attach(5.0, r.from_oldest)
        except RingError as e:
            if not transient(e):
                raise
            r.last_error = e
            r._watched_before_ring = True
        return r

    @classmethod
    def from_fd(cls, fd: int, name: str = "results", *, from_oldest: bool = False) -> "ResultReader":
        """A reader of a ring fd in hand (no connection, no reconnection): in-process use and tests."""
        r = cls(name, socket=None, from_oldest=from_oldest)
        r._c = _ring.ResultConsumer(fd, name, from_oldest)
        r.attach_count = 1
        return r

    def _attach(self, timeout: float, from_oldest: bool) -> None:
        sock, ring_fd = _ring.results_connect(self.socket, self.stream, timeout)
        try:
            st = os.fstat(ring_fd)
            key = (st.st_dev, st.st_ino)
            if self._held is not None and key == self._ring_key:
                c, self._held = self._held, None  # the same ring (held mapped, so no other can share its inode)
            else:
                c = _ring.ResultConsumer(ring_fd, f"{self.stream} results", from_oldest)
        except BaseException:
            os.close(sock)
            raise
        finally:
            os.close(ring_fd)
        self._drop()
        self._c, self._sock, self._ring_key = c, sock, key
        self.attach_count += 1
        self.last_error = None
        self._retry = self.retry_min

    def _drop(self, keep: bool = False) -> None:
        """Lets the ring and its connection go; keep: a ring not closed is held, to read on if it comes again."""
        held = [self._held] if self._held is not None else []
        self._held = None
        if self._c is not None:
            if keep and not self._c.closed:
                self._held = self._c
            else:
                held.append(self._c)
            self._c = None
        for c in held:
            self._missed_before += c.missed
            c.close()
        if self._sock >= 0:
            os.close(self._sock)
            self._sock = -1

    def _gone(self) -> bool:
        """The ring will not move again: closed by the daemon, or its connection is gone."""
        c = self._c
        return c is not None and (c.closed or (self._sock >= 0 and not sock_alive(self._sock)))

    def _reattach(self) -> None:
        """(Re)connects when due; a ring met after the first one is read from its start."""
        if self.socket is None or time.monotonic() < self._retry_at:
            return
        try:
            self._attach(1.0, self.from_oldest or self.attach_count > 0 or self._watched_before_ring)
        except (RingError, OSError) as e:
            if isinstance(e, RingError) and not transient(e):
                self._retry = self.retry_max
            self.last_error = e
            self._retry_at = time.monotonic() + self._retry
            self._retry = min(self._retry * 2, self.retry_max)

    def retry_now(self) -> None:
        """The next read() tries to reconnect at once, whatever the backoff (the daemon is known to be back)."""
        self._retry_at = 0.0
        self._retry = self.retry_min

    @property
    def connected(self) -> bool:
        return self._c is not None and not self._gone()

    @property
    def generation(self) -> int:
        if self._c is None:
            raise DaemonUnavailable(f"{self.stream}: not attached")
        return self._c.generation

    @property
    def missed(self) -> int:
        """Records lost to overwrite since attach, over all rings followed."""
        return self._missed_before + sum(c.missed for c in (self._c, self._held) if c is not None)

    @property
    def native(self) -> _ring.ResultConsumer | None:
        return self._c

    def read(self, timeout: float = 0.0) -> ResultRecord | None:
        """The next record, waiting up to `timeout` seconds; None if none came.
        Raises CorruptRing if the ring's head went backwards or out of range."""
        deadline = time.monotonic() + timeout
        while True:
            c = self._c
            if c is not None:
                got = c.next()
                if got is not None:
                    fields, payload, missed = got
                    (number, frame_seq, frame_id, cap, real, start, done, status, kind, items, mname,
                     mver, width, height) = fields
                    return ResultRecord(number, frame_seq, frame_id, cap, real, start, done, status, kind, items,
                                        mname.decode(errors="replace"), mver.decode(errors="replace"), payload,
                                        missed, width, height)
                if self._gone():
                    self._drop(keep=True)
            if self._c is None:
                self._reattach()
                if self._c is not None:
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            slice_ = min(remaining, self.liveness_interval)
            if self._c is not None:
                _waitset.wait((self._c,), slice_)
            else:
                time.sleep(min(slice_, max(self._retry_at - time.monotonic(), 0.001)))

    def follow(self, timeout: float | None = None) -> Iterator[ResultRecord]:
        """Yields records as they come; stops after `timeout` seconds without one (None: never)."""
        while True:
            rec = self.read(timeout if timeout is not None else 3600.0)
            if rec is None:
                if timeout is not None:
                    return
                continue
            yield rec

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "ResultReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
