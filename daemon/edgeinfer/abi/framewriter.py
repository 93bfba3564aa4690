"""The cameras' side of a frame ring: FrameWriter (clients use it as ring.FrameWriter, abi/ring.py).

FrameWriter.connect(stream, width, height) → begin() → fill the view → publish(). The ring is a sealed
memfd handed to edgeinferd over its ingress socket; the connection is the liveness, and it is re-established
by itself (with backoff) whenever the daemon comes back.
"""
from __future__ import annotations

import time

import numpy as np

from edgeinfer import _ring
from edgeinfer.abi.ringdefs import (INGRESS_SOCKET, STREAM_NAME_MAX, BadArgument, RingError, monotonic_ns,
                                    parse_pixel_format, stream_name_ok, transient)

__all__ = ["FrameWriter"]


class FrameWriter:
    """A camera's end of a frame ring. Never blocks on the daemon."""

    def __init__(self, producer: _ring.FrameProducer, stream: str | None = None):
        self._p = producer
        self.stream = stream
        self._frame_id = 0
        self._frame_bytes = producer.layout["frame_bytes"]

    @classmethod
    def create(cls, width: int, height: int, pixel_format: str | int = "bgr24", *, slots: int = 4,
               row_stride: int = 0, label: str = "edgeinfer-frames") -> "FrameWriter":
        """A ring of its own, handed to nobody yet (`fd`): for in-process use and tests."""
        code, colour = parse_pixel_format(pixel_format)
        return cls(_ring.FrameProducer(label, width, height, code, row_stride, slots, colour))

    @classmethod
    def connect(cls, stream: str, width: int, height: int, pixel_format: str | int = "bgr24", *, slots: int = 4,
                row_stride: int = 0, socket: str = INGRESS_SOCKET, wait: float = 10.0) -> "FrameWriter":
        """Creates the ring and hands it to the daemon as `stream`, waiting up to `wait` seconds for
        the daemon to accept it. A refusal that will not pass by itself (this process may not produce
        the stream, a geometry the model cannot serve) is raised; no daemon yet is not: the writer
        publishes anyway and connects when the daemon comes (see `connection`)."""
        if not stream_name_ok(stream):
            raise BadArgument(f"invalid stream name {stream!r}: 1-{STREAM_NAME_MAX} of letters, digits, '_' or "
                              f"'-', starting with a letter or digit")
        w = cls.create(width, height, pixel_format, slots=slots, row_stride=row_stride,
                       label=f"edgeinfer-frames:{stream}")
        w.stream = stream
        try:
            w._p.connect(socket, stream)
            if wait > 0:
                try:
                    w._p.wait_connected(wait)
                except RingError as e:
                    if not transient(e):
                        raise
        except BaseException:
            w.close()
            raise
        return w

    @property
    def fd(self) -> int:
        """The ring's sealed memfd (the writer's own: dup it to keep it)."""
        return self._p.fd

    @property
    def layout(self) -> dict:
        return self._p.layout

    @property
    def connection(self) -> dict:
        """The connection to the daemon: state (disconnected | handshake | connected), last_error (the
        daemon's words for the last refusal, or why the last attempt failed), accepted, attempts."""
        return self._p.connection

    @property
    def connected(self) -> bool:
        return self._p.connection_state == "connected"

    @property
    def connection_state(self) -> str:
        """disconnected | handshake | connected."""
        return self._p.connection_state

    def step(self) -> str:
        """Advances the connection by whatever is due (publish() does it too); never blocks."""
        return self._p.step()

    def begin(self) -> np.ndarray:
        """A writable uint8 view of a free slot: (height, width, channels); a YUV frame's (rows, width, bytes per
        pixel), its chroma rows after the Y rows (vocabulary.frame_shape)."""
        return self._p.images[self._p.begin()]

    def begin_flat(self) -> np.ndarray:
        """The same slot as a flat uint8 array of payload_capacity bytes (for readinto)."""
        return self._p.flats[self._p.begin()]

    def publish(self, capture_ns: int | None = None, frame_id: int | None = None, *,
                realtime_ns: int | None = None, length: int | None = None) -> int:
        """Publishes the slot from begin(); returns the frame's sequence number.
        capture_ns is CLOCK_MONOTONIC (default: now); frame_id defaults to a counter;
        length (bytes written) defaults to the whole frame (frame_bytes); any other is refused here
        (BadArgument, nothing published: the daemon would count it `short` and serve nothing of it)."""
        if frame_id is None:
            self._frame_id += 1
            frame_id = self._frame_id
        return self._p.publish(monotonic_ns() if capture_ns is None else capture_ns,
                               time.time_ns() if realtime_ns is None else realtime_ns, frame_id,
                               self._frame_bytes if length is None else length)

    def close(self) -> None:
        """Tells the daemon the stream ended (the ring is marked closed) and drops the connection."""
        self._p.close()

    def __enter__(self) -> "FrameWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
