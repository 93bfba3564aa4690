"""ring.h's names in Python: the native core's error types and constants, the pixel formats and a frame's
length (frame_bytes), the transient rule, and the per-thread wait set that readers sleep on.

Both sides' modules import them from here; abi/ring.py re-exports every one in `__all__` (they are part of
the API, `edgeinfer.ring`): `__all__` is their one list.
"""
from __future__ import annotations

import threading

from edgeinfer import _ring
from edgeinfer.abi import vocabulary as _vocabulary
from edgeinfer.abi.vocabulary import YUV_BASES, yuv_format_name
from edgeinfer._ring import (  # the error types and objects: part of the API (__all__)
    AbiMismatch,
    AccessDenied,
    BadArgument,
    BadGeometry,
    BadMagic,
    ConnectionClosed,
    CorruptFrame,
    CorruptRing,
    DaemonUnavailable,
    Doorbell,
    Frame,
    HandshakeTimeout,
    InsecureRing,
    NoSpaceForRing,
    ProtocolError,
    Refused,
    RingError,
    RingStateError,
    StreamBusy,
    TruncatedRing,
    TryAgain,
    WaitSet,
)

__all__ = [
    # the native core's errors and objects
    "AbiMismatch", "AccessDenied", "BadArgument", "BadGeometry", "BadMagic", "ConnectionClosed", "CorruptFrame",
    "CorruptRing", "DaemonUnavailable", "Doorbell", "Frame", "HandshakeTimeout", "InsecureRing", "NoSpaceForRing",
    "ProtocolError", "Refused", "RingError", "RingStateError", "StreamBusy", "TruncatedRing", "TryAgain", "WaitSet",
    # ring.h's constants
    "INGRESS_SOCKET", "RESULTS_SOCKET", "PIXEL_FORMATS", "PIXEL_FORMAT_NAMES", "COLORIMETRIES", "COLORIMETRY_NAMES",
    "MAX_WAIT", "STREAM_NAME_MAX", "STATUS", "ROLE_PRODUCER", "ROLE_READER", "TAKE_SHORT", "TAKE_CORRUPT",
    # its functions
    "monotonic_ns", "sigbus_absorbed", "stream_name_ok", "error_for", "recv_hello", "send_reply", "peer_cred",
    "sock_alive", "transient", "parse_pixel_format", "frame_bytes", "format_name",
]

INGRESS_SOCKET = _ring.INGRESS_SOCKET
RESULTS_SOCKET = _ring.RESULTS_SOCKET
PIXEL_FORMATS = dict(_ring.PIXEL_FORMATS)
PIXEL_FORMAT_NAMES = {code: name for name, code in PIXEL_FORMATS.items()}
COLORIMETRIES = dict(_ring.COLORIMETRIES)
COLORIMETRY_NAMES = {code: name for name, code in COLORIMETRIES.items()}
# ring.h's codes and the names the schemas take (vocabulary) are one list, in one order.
assert tuple(sorted(COLORIMETRIES, key=lambda name: COLORIMETRIES[name])) == _vocabulary.COLORIMETRIES, COLORIMETRIES
MAX_WAIT = _ring.MAX_WAIT
STREAM_NAME_MAX = _ring.STREAM_NAME_MAX
STATUS = dict(_ring.STATUS)
ROLE_PRODUCER, ROLE_READER = _ring.ROLE_PRODUCER, _ring.ROLE_READER
TAKE_SHORT, TAKE_CORRUPT = _ring.TAKE_SHORT, _ring.TAKE_CORRUPT
monotonic_ns = _ring.monotonic_ns
sigbus_absorbed = _ring.sigbus_absorbed  # defence in depth: a sealed ring cannot shrink, so this stays 0
stream_name_ok = _ring.stream_name_ok
error_for = _ring.error_for
recv_hello, send_reply, peer_cred, sock_alive = _ring.recv_hello, _ring.send_reply, _ring.peer_cred, _ring.sock_alive


def transient(error: BaseException) -> bool:
    """A failure that passes by itself (no daemon yet, the stream's previous producer not gone yet, a
    busy daemon, a system call short of memory or fds for a moment): retry. Anything else needs someone to
    change the configuration or the client (ring.h's ei_error_transient: the same rule)."""
    return isinstance(error, (DaemonUnavailable, StreamBusy, TryAgain, ConnectionClosed, HandshakeTimeout)) or \
        (type(error) is OSError and error.errno is not None and _ring.errno_transient(error.errno))


def parse_pixel_format(pixel_format: str | int) -> tuple[int, int]:
    """(ring.h pixel format, colorimetry) of a name: "bgr24", "nv12" (BT.601 limited), "nv12:bt709", ..."""
    if isinstance(pixel_format, int):
        return pixel_format, 0
    base, _, colour = pixel_format.lower().partition(":")
    if base not in PIXEL_FORMATS:
        raise ValueError(f"unknown pixel format {pixel_format!r}; one of {sorted(PIXEL_FORMATS)}")
    if colour and (base not in YUV_BASES or colour not in COLORIMETRIES):
        raise ValueError(f"pixel format {pixel_format!r}: only {', '.join(YUV_BASES)} take a colorimetry, one of "
                         f"{', '.join(COLORIMETRIES)} (e.g. nv12:bt709)")
    return PIXEL_FORMATS[base], COLORIMETRIES.get(colour, 0)


def frame_bytes(pixel_format: str | int, width: int, height: int, row_stride: int = 0) -> int:
    """The bytes of one whole frame, which is what a slot's payload_len must say: ring.h's
    ei_frame_payload_len, the one definition (nv12/i420: width × height × 3/2; yuyv: × 2; gray8/rgb/bgr:
    row_stride × height, packed rows when row_stride is 0)."""
    code, _colour = parse_pixel_format(pixel_format)
    n = _ring.frame_payload_len(code, width, height, row_stride)
    if not n:
        raise ValueError(f"unknown pixel format {pixel_format!r}")
    return n


def format_name(layout: dict) -> str:
    """The pixel format's name of a ring's layout (a YUV one with its colorimetry: vocabulary.yuv_format_name)."""
    name = PIXEL_FORMAT_NAMES[layout["pixel_format"]]
    return yuv_format_name(name, COLORIMETRY_NAMES[layout["colorimetry"]]) if name in YUV_BASES else name


class _PerThreadWaitSet(threading.local):
    """A WaitSet fills its C array in place and then sleeps without the GIL: two threads sharing one would
    overwrite each other's array (readers used from several threads crashed on it). One per thread."""

    def __init__(self):
        self.ws = _ring.WaitSet()

    def wait(self, *args):
        return self.ws.wait(*args)


_waitset = _PerThreadWaitSet()
