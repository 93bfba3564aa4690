"""A result record's payload as values a reader can use (docs/abi.md, payload layouts):
rows with class ids as integers and label names, or tensors with their names and shapes.
Readers only: the daemon writes payloads with the decoders."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.abi.vocabulary import (ITEM_VALUES, KIND_CLASSIFICATION, KIND_DETECTION, KIND_RAW, KIND_TENSORS,
                                  TENSOR_ALIGN, TENSOR_DESC_SIZE, TENSOR_DIMS_OFFSET, TENSOR_DTYPES,
                                  TENSOR_INDEX_OFFSET, TENSOR_MAX_DIMS, TENSOR_NAME_BYTES)


class PayloadError(ValueError):
    """A payload that does not parse as its kind says (a reader's problem to report, never to guess around)."""


def _label(labels: list[str], class_id: int) -> str | None:
    return labels[class_id] if 0 <= class_id < len(labels) else None


def tensors(payload: bytes, item_count: int) -> list[dict]:
    """The sections of a KIND_TENSORS payload: [{name, index, dtype, shape, array}]."""
    out: list[dict] = []
    off = 0
    for _ in range(item_count):
        if off + TENSOR_DESC_SIZE > len(payload):
            raise PayloadError(f"tensor {len(out)}: descriptor past the payload's {len(payload)} bytes")
        desc = payload[off:off + TENSOR_DESC_SIZE]
        name = desc[:TENSOR_NAME_BYTES].split(b"\0", 1)[0].decode(errors="replace")
        index, code, ndim = np.frombuffer(desc, np.uint32, 3, TENSOR_INDEX_OFFSET)  # index, dtype, ndim in a row
        dims = np.frombuffer(desc, np.uint32, TENSOR_MAX_DIMS, TENSOR_DIMS_OFFSET)
        if code not in TENSOR_DTYPES or ndim > TENSOR_MAX_DIMS:
            raise PayloadError(f"tensor {len(out)} ({name!r}): dtype code {code}, {ndim} dims: not a record's")
        dtype = np.dtype(TENSOR_DTYPES[int(code)])
        shape = tuple(int(d) for d in dims[:ndim])
        nbytes = int(np.prod(shape, dtype=np.uint64)) * dtype.itemsize
        off += TENSOR_DESC_SIZE
        if off + nbytes > len(payload):
            raise PayloadError(f"tensor {len(out)} ({name!r}): {shape} {dtype} runs past the payload")
        array = np.frombuffer(payload, dtype, nbytes // dtype.itemsize, off).reshape(shape)
        out.append({"name": name, "index": int(index), "dtype": dtype.name, "shape": list(shape), "array": array})
        off += -(-nbytes // TENSOR_ALIGN) * TENSOR_ALIGN
    return out


def describe(kind: int, payload: bytes, item_count: int, labels: Sequence[str] = ()) -> dict:
    """JSON-ready: {"classes": [...]} , {"detections": [...]}, {"values": [...]} or {"tensors": [...]}."""
    labels = list(labels)
    if kind == KIND_CLASSIFICATION:
        rows = np.frombuffer(payload, np.float32).reshape(-1, ITEM_VALUES[kind])[:item_count]
        return {"classes": [{"class_id": int(c), "label": _label(labels, int(c)), "score": float(s)}
                            for c, s in rows]}
    if kind == KIND_DETECTION:
        rows = np.frombuffer(payload, np.float32).reshape(-1, ITEM_VALUES[kind])[:item_count]
        return {"detections": [{"box": [float(v) for v in r[:4]], "score": float(r[4]), "class_id": int(r[5]),
                                "label": _label(labels, int(r[5]))} for r in rows]}
    if kind == KIND_RAW:
        return {"values": np.frombuffer(payload, np.float32)[:item_count].tolist()}
    if kind == KIND_TENSORS:
        return {"tensors": [{**{k: v for k, v in t.items() if k != "array"}, "values": t["array"].tolist()}
                            for t in tensors(payload, item_count)]}
    return {}
