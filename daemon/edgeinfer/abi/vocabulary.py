"""The words the daemon, its tools and its records share, defined once.

Pixel formats and their channels, a frame geometry, a result's status, a
payload's kind and what can become of a frame. The numbers are part of the
shared-memory ABI (docs/abi.md; ring.h defines the pixel-format codes): the
config schema, the bundle schema, graph fusion, the statistics block, the
CLI, the demo and the status views all take them from here.
"""
from __future__ import annotations

from typing import Literal, NamedTuple, get_args

# ------------------------------------------------------------------ pixels

YUV_BASES = ("nv12", "i420", "yuyv")                   # YUV as decoders and V4L2 give it
COLORIMETRIES = ("bt601", "bt601-full", "bt709", "bt709-full")  # ring.h ei_colorimetry, in its order


def yuv_format_name(base: str, colorimetry: str) -> str:
    """A YUV format's name carries its colorimetry unless it is BT.601 limited (the zero): nv12, nv12:bt709, ..."""
    return base if colorimetry == COLORIMETRIES[0] else f"{base}:{colorimetry}"


# How an RTSP camera's frames are stamped: by the sender's clock (its RTCP sender reports; the PyAV decoder) or by
# the stream's own timestamps (the ffmpeg program). The first is the default.
RtspClock = Literal["sender", "stream"]
RTSP_CLOCKS: tuple[str, ...] = get_args(RtspClock)

YUV_FORMATS: tuple[str, ...] = tuple(yuv_format_name(b, c) for b in YUV_BASES for c in COLORIMETRIES)
FRAME_FORMATS: tuple[str, ...] = ("gray8", "rgb24", "bgr24", "rgba32", "bgra32", *YUV_FORMATS)
FrameFormat = Literal[FRAME_FORMATS]  # type: ignore[valid-type]  # what a camera may write (built from ring.h)
ModelFormat = Literal["rgb24", "bgr24", "gray8"]                      # what a model may ask for
MODEL_FORMATS: tuple[str, ...] = get_args(ModelFormat)

# Channel order of each interleaved format (fusion maps a frame's channels onto the model's; a YUV frame is
# converted to the model's order in the graph, fusion._colour_nodes).
FRAME_CHANNELS = {"gray8": "Y", "rgb24": "RGB", "bgr24": "BGR", "rgba32": "RGBA", "bgra32": "BGRA"}
MODEL_CHANNELS = {f: FRAME_CHANNELS[f] for f in MODEL_FORMATS}
# Bytes per pixel of a row as the ring holds it (the Y plane's, for the planar formats).
_ROW_BYTES = {"gray8": 1, "rgb24": 3, "bgr24": 3, "rgba32": 4, "bgra32": 4, "nv12": 1, "i420": 1, "yuyv": 2}


def yuv_parts(pixel_format: str) -> tuple[str, str] | None:
    """(base, colorimetry) of a YUV format's name ("nv12:bt709" → ("nv12", "bt709")); None for RGB/gray."""
    base, _, colour = pixel_format.partition(":")
    return (base, colour or "bt601") if base in YUV_BASES else None


def takes_source_colour(pixel_format: str) -> bool:
    """A YUV format named without its colorimetry: a producer fills in the source's ("i420" but not
    "i420:bt601" nor "bgr24")."""
    base, colon, _ = pixel_format.partition(":")
    return base in YUV_BASES and not colon


def channels(pixel_format: str) -> int:
    """Channels of an interleaved frame or model pixel format (gray8: 1). A YUV frame's layout: frame_shape."""
    return len(FRAME_CHANNELS[pixel_format])


def frame_shape(pixel_format: str, height: int, width: int) -> tuple[int, int, int]:
    """(rows, width, bytes per pixel) of one frame in a ring slot, as the slot's view has it: a 4:2:0 frame
    is its Y rows then half as many chroma rows, a yuyv frame two bytes a pixel. The rows come from ring.h's
    frame-length rule (ei_frame_payload_len, through the native module): the one definition."""
    from edgeinfer import _ring  # here, not at the top: ring.py (which imports the native module) imports us
    base = pixel_format.partition(":")[0]
    row = width * _ROW_BYTES[base]
    return _ring.frame_payload_len(_ring.PIXEL_FORMATS[base], width, height) // row, width, _ROW_BYTES[base]


def frame_height(pixel_format: str, rows: int) -> int:
    """The picture's height of a slot view with `rows` rows (the inverse of frame_shape)."""
    return rows * 2 // 3 if pixel_format.partition(":")[0] in ("nv12", "i420") else rows


class Geometry(NamedTuple):
    """A frame geometry: the key of a fused graph and of its session (a plain tuple to everything else)."""
    pixel_format: str
    height: int
    width: int

    def __str__(self) -> str:
        return f"{self.width}x{self.height} {self.pixel_format}"


# ------------------------------------------------------------------ result records

RESULT_OK = 0  # ei_result_record_header.status: the payload is the decoder's output

# ei_result_record_header.payload_kind, and the float32 values per item of each
KIND_NONE, KIND_CLASSIFICATION, KIND_DETECTION, KIND_RAW, KIND_TENSORS = 0, 1, 2, 3, 4
KIND_NAMES = {KIND_NONE: "none", KIND_CLASSIFICATION: "classification", KIND_DETECTION: "detection",
              KIND_RAW: "raw", KIND_TENSORS: "tensors"}
ITEM_VALUES = {KIND_CLASSIFICATION: 2,  # docs/abi.md, payload layouts; raw: flat values
               KIND_DETECTION: 6}       # x1, y1, x2, y2, score, class_id (frame pixels)

# KIND_TENSORS payloads: item_count sections, each a descriptor then the tensor's bytes padded to 8
# (docs/abi.md; abi.h ei_tensor_desc). The descriptor: name char[32] (NUL-padded, the first 31 bytes),
# index u32 (among the graph's outputs), dtype u32 (ONNX TensorProto code), ndim u32, dims u32[5].
# These restate abi.h for code that runs without the native core; tests/unit/test_abi_constants.py checks
# each against the header's (edgeinfer._ring.PAYLOAD_KINDS, TENSOR_DESC).
TENSOR_DESC_SIZE = 64
TENSOR_NAME_BYTES = 32
TENSOR_MAX_DIMS = 5
TENSOR_ALIGN = 8
TENSOR_INDEX_OFFSET, TENSOR_DTYPE_OFFSET, TENSOR_NDIM_OFFSET, TENSOR_DIMS_OFFSET = 32, 36, 40, 44
# ONNX TensorProto element types a record can carry, and their numpy dtypes (strings cannot).
TENSOR_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}

# ------------------------------------------------------------------ what becomes of a frame

# Every frame a camera publishes ends as exactly one of these (the statistics block counts each):
# processed: a result was published; stale: acquired but older than max_age_ms; overload: never
# acquired (newer frames won while the lanes were busy or shedding); torn: refused by the ring's checks;
# short: payload_len shorter than the frame; error: inference or decoding failed; bad_timestamp: capture
# time zero or later than the moment it was served.
OUTCOMES = ("processed", "stale", "overload", "torn", "short", "error", "bad_timestamp")
DROPS = OUTCOMES[1:]  # the outcomes that are not a result
