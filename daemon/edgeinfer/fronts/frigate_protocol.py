"""Frigate's `zmq` detector protocol, its messages: a request's envelope, header and tensor checked, and the
error frame a refusal is (frigate.py serves them; its docstring tells the protocol)."""
from __future__ import annotations

import dataclasses
import json


from edgeinfer.fronts.outputs import FRIGATE_ROWS
from edgeinfer.fronts.pool import FrontError

REPLY_BYTES = FRIGATE_ROWS * 6 * 4   # float32 [20, 6]: what Frigate takes for detections
MAX_HEADER_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Request:
    """One request's body, checked. kind: "hello", "upload" or "detect"."""
    kind: str
    model_name: str = ""
    width: int = 0
    height: int = 0
    tensor: bytes = b""


def parse_request(body: list[bytes], sizes: list[tuple[int, int]], pixel_format: str = "rgb24") -> Request:
    """A request's frames (after the envelope) as Frigate sends them; FrontError INVALID_ARGUMENT (with the reason
    counted: frames, header, dtype, shape, size, data) saying what was expected otherwise."""
    said = ", ".join(f"{w}x{h}" for w, h in sizes)
    expected = (f"a JSON header {{\"shape\": [1, H, W, 3], \"dtype\": \"uint8\"}} and the H*W*3 bytes of the frame "
                f"({pixel_format}), W x H one of {said}")
    if not body or len(body) > 2:
        raise FrontError("INVALID_ARGUMENT", f"{len(body)} frames; a request is {expected}", "frames")
    if len(body[0]) > MAX_HEADER_BYTES:
        raise FrontError("INVALID_ARGUMENT", f"a header of {len(body[0])} bytes (at most {MAX_HEADER_BYTES}); a "
                         f"request is {expected}", "header")
    try:
        header = json.loads(body[0])
    except (UnicodeDecodeError, ValueError):
        raise FrontError("INVALID_ARGUMENT", f"the header is not JSON; a request is {expected}", "header") from None
    if not isinstance(header, dict):
        raise FrontError("INVALID_ARGUMENT", f"the header is not a JSON object; a request is {expected}", "header")
    name = header.get("model_name")
    name = name[:256] if isinstance(name, str) else ""
    if header.get("model_request") is True:
        return Request("hello", name)
    if header.get("model_data") is True:
        return Request("upload", name)
    if len(body) != 2:
        raise FrontError("INVALID_ARGUMENT", f"a header without its tensor; a request is {expected}", "frames")
    dtype = header.get("dtype")
    if dtype != "uint8":
        raise FrontError("INVALID_ARGUMENT", f"dtype {str(dtype)[:32]!r}; a request is {expected} (Frigate: "
                         "model.input_dtype int)", "dtype")
    shape = header.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise FrontError("INVALID_ARGUMENT", f"shape {str(shape)[:64]}; a request is {expected}", "shape")
    dims = shape[1:] if len(shape) == 4 and shape[0] == 1 else shape
    if len(dims) != 3 or dims[2] != 3 or dims[0] <= 0 or dims[1] <= 0:
        raise FrontError("INVALID_ARGUMENT", f"shape {shape[:8]}; a request is {expected} (Frigate: "
                         "model.input_tensor nhwc)", "shape")
    height, width = dims[0], dims[1]
    if (width, height) not in sizes:
        raise FrontError("INVALID_ARGUMENT", f"a {width}x{height} frame; the model takes {said} (Frigate: "
                         "model.width and model.height)", "size")
    need = width * height * 3
    if len(body[1]) != need:
        raise FrontError("INVALID_ARGUMENT", f"{len(body[1])} bytes of tensor; a {width}x{height}x3 uint8 frame is "
                         f"{need}", "data")
    return Request("detect", name, width, height, body[1])


def error_reply(e: FrontError) -> bytes:
    """One frame Frigate takes for an error (any length but 480 bytes): {"error": ..., "code": ...}."""
    out = json.dumps({"error": str(e), "code": e.code}).encode()
    return out + b" " if len(out) == REPLY_BYTES else out


def split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]] | None:
    """(the routing envelope, up to and with the empty delimiter; the body), or None without a delimiter."""
    for i, f in enumerate(frames):
        if not f:
            return frames[:i + 1], frames[i + 1:]
    return None
