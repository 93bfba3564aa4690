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

FrameFormat = Literal["gray8", "rgb24", "bgr24", "rgba32", "bgra32"]  # what a camera may write
ModelFormat = Literal["rgb24", "bgr24", "gray8"]                      # what a model may ask for
FRAME_FORMATS: tuple[str, ...] = get_args(FrameFormat)
MODEL_FORMATS: tuple[str, ...] = get_args(ModelFormat)

# Channel order of each format (fusion maps a frame's channels onto the model's).
FRAME_CHANNELS = {"gray8": "Y", "rgb24": "RGB", "bgr24": "BGR", "rgba32": "RGBA", "bgra32": "BGRA"}
MODEL_CHANNELS = {f: FRAME_CHANNELS[f] for f in MODEL_FORMATS}


def channels(pixel_format: str) -> int:
    """Channels of a frame or model pixel format (gray8: 1)."""
    return len(FRAME_CHANNELS[pixel_format])


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
# (docs/abi.md; ring.h ei_tensor_desc). The descriptor: name char[32] (NUL-padded, the first 31 bytes),
# index u32 (among the graph's outputs), dtype u32 (ONNX TensorProto code), ndim u32, dims u32[5].
TENSOR_DESC_SIZE = 64
TENSOR_NAME_BYTES = 32
TENSOR_MAX_DIMS = 5
TENSOR_ALIGN = 8
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
