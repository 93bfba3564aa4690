"""A result record as a front answers it: named, typed tensors (the Open Inference Protocol) or Frigate's rows.

The values are the record's own bytes: a classification is its rows of
(class_id, score), a detection its rows of (x1, y1, x2, y2, score, class_id)
in frame pixels, raw its float32 values, a tensors record each tensor with its
name, type and shape (docs/abi.md, payload layouts). So a network client gets,
bit for bit, what a local reader of the stream would. Label names come as a
BYTES tensor beside them.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np

from edgeinfer.abi import payloads
from edgeinfer.abi.vocabulary import ITEM_VALUES, KIND_CLASSIFICATION, KIND_DETECTION, KIND_RAW, KIND_TENSORS

# numpy dtype name → the protocol's datatype (KServe v2 / Triton)
DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64"}
FRIGATE_ROWS = 20  # Frigate's detector output: float32 [20, 6]


@dataclasses.dataclass(frozen=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple
    data: bytes


def bytes_tensor(strings: list[str]) -> bytes:
    """A BYTES tensor's raw contents: each element as a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in (s.encode() for s in strings))


def _rows(kind: int, payload: bytes, items: int) -> np.ndarray:
    width = ITEM_VALUES[kind]
    return np.frombuffer(payload, np.float32, items * width).reshape(items, width)


def outputs_of(kind: int, payload: bytes, items: int, labels: list[str]) -> list[OutputTensor]:
    """The outputs of one record (raises payloads.PayloadError for a payload that does not parse)."""
    if kind in (KIND_CLASSIFICATION, KIND_DETECTION):
        rows = _rows(kind, payload, items)
        ids = rows[:, 0] if kind == KIND_CLASSIFICATION else rows[:, 5]
        name = "classes" if kind == KIND_CLASSIFICATION else "detections"
        names = [labels[int(i)] if 0 <= int(i) < len(labels) else "" for i in ids]
        return [OutputTensor(name, "FP32", rows.shape, rows.tobytes()),
                OutputTensor("labels", "BYTES", (items,), bytes_tensor(names))]
    if kind == KIND_RAW:
        values = np.frombuffer(payload, np.float32, items)
        return [OutputTensor("raw", "FP32", (items,), values.tobytes())]
    if kind == KIND_TENSORS:
        return [OutputTensor(t["name"], DATATYPES[t["dtype"]], tuple(t["shape"]), t["array"].tobytes())
                for t in payloads.tensors(payload, items)]
    raise payloads.PayloadError(f"payload kind {kind}: not one a front can answer")


def declared_outputs(decoder: str, learned: list[OutputTensor] | None) -> list[tuple[str, str, tuple]]:
    """(name, datatype, shape) of a model's outputs for ModelMetadata: a decoder's rows (-1: as many as found), or,
    for tensors, those of a record already seen (the warm-up's)."""
    if decoder == "classification":
        return [("classes", "FP32", (-1, 2)), ("labels", "BYTES", (-1,))]
    if decoder == "detection":
        return [("detections", "FP32", (-1, 6)), ("labels", "BYTES", (-1,))]
    return [(o.name, o.datatype, o.shape) for o in learned or []]


def frigate_rows(payload: bytes, items: int, width: int, height: int) -> np.ndarray:
    """Frigate's detector answer: float32 [20, 6] rows of [class_id, score, ymin, xmin, ymax, xmax], the box
    normalised to the region (the request's frame), sorted by score, highest first, unused rows zero."""
    out = np.zeros((FRIGATE_ROWS, 6), np.float32)
    rows = _rows(KIND_DETECTION, payload, items)
    rows = rows[np.argsort(-rows[:, 4], kind="stable")][:FRIGATE_ROWS]
    n = len(rows)
    out[:n, 0] = rows[:, 5]
    out[:n, 1] = rows[:, 4]
    out[:n, 2] = np.clip(rows[:, 1] / height, 0.0, 1.0)
    out[:n, 3] = np.clip(rows[:, 0] / width, 0.0, 1.0)
    out[:n, 4] = np.clip(rows[:, 3] / height, 0.0, 1.0)
    out[:n, 5] = np.clip(rows[:, 2] / width, 0.0, 1.0)
    return out
