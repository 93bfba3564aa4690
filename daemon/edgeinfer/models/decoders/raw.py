"""Raw: model outputs as they are.

Two forms (docs/abi.md, payload layouts):
- `output` (one output; the default, output 0): kind 3, item_count float32 values in the
  output's order.
- `outputs` (a list of indices or names): kind 4, one section per output, each a
  descriptor (name, index, ONNX dtype, shape) and the tensor's bytes in its own dtype.

The record holds at most `max_values` values per output (default: the output's size, with
its dynamic dims resolved at warm-up). An output larger than that fails the frame with an
error; it is never cut short.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import numpy as np
from pydantic import Field

from edgeinfer.models.decoders.base import KIND_RAW, KIND_TENSORS, Decoder, DecoderError, DecoderParams
from edgeinfer.abi.vocabulary import (TENSOR_ALIGN, TENSOR_DESC_SIZE, TENSOR_DTYPES, TENSOR_DTYPE_OFFSET,
                                      TENSOR_INDEX_OFFSET, TENSOR_MAX_DIMS, TENSOR_NAME_BYTES, TENSOR_NDIM_OFFSET)

_CODE_OF = {np.dtype(v): k for k, v in TENSOR_DTYPES.items()}


def _padded(n: int) -> int:
    return -(-n // TENSOR_ALIGN) * TENSOR_ALIGN


class RawParams(DecoderParams):
    type: Literal["raw"]
    outputs: Optional[list[Union[int, str]]] = Field(None, min_length=1, max_length=64,
                                                     description="several outputs per record (kind 4)")
    max_values: Optional[int] = Field(None, ge=1, le=1 << 28, description="values per output at most")


class Raw(Decoder):
    type = "raw"
    kind = KIND_RAW
    Params = RawParams

    def __init__(self, params, labels, input_w, input_h, outputs, resize="stretch"):
        super().__init__(params, labels, input_w, input_h, outputs, resize)
        if params.outputs is not None and "output" in params.model_fields_set:
            raise DecoderError("decoder parameters output and outputs: give one (outputs publishes several)")
        self.tensors = params.outputs is not None
        self.kind = KIND_TENSORS if self.tensors else KIND_RAW
        picked = [self.output_index(r) for r in params.outputs] if self.tensors else [self.output]
        if len(set(picked)) != len(picked):
            raise DecoderError(f"decoder parameter outputs: an output is listed twice ({params.outputs})")
        self.picked = picked
        self.caps = [self._capacity(i, params.max_values) for i in picked]  # values each output may publish
        if not self.tensors:
            self._buf = np.zeros(self.caps[0], np.float32)
            return
        self.dtypes = []
        size = 0
        for i, cap in zip(picked, self.caps):
            info = outputs[i]
            if np.dtype(info.dtype) not in _CODE_OF:
                raise DecoderError(f"output {info.name!r}: element type {info.dtype} cannot be published")
            if len(info.shape) > TENSOR_MAX_DIMS:
                raise DecoderError(f"output {info.name!r}: {len(info.shape)} dims; a record holds at most "
                                   f"{TENSOR_MAX_DIMS}")
            self.dtypes.append(np.dtype(info.dtype))
            size += TENSOR_DESC_SIZE + _padded(cap * np.dtype(info.dtype).itemsize)
        self._buf = np.zeros(size, np.uint8)
        # The constant part of each descriptor (name, index, dtype), made once.
        self._heads = []
        for i, dt in zip(picked, self.dtypes):
            head = np.zeros(TENSOR_DESC_SIZE, np.uint8)
            name = outputs[i].name.encode()[: TENSOR_NAME_BYTES - 1]
            head[: len(name)] = np.frombuffer(name, np.uint8)
            head[TENSOR_INDEX_OFFSET:TENSOR_DTYPE_OFFSET + 4].view(np.uint32)[:] = (i, _CODE_OF[dt])
            self._heads.append(head)
        self._dims = np.zeros(1 + TENSOR_MAX_DIMS, np.uint32)  # ndim, dims: filled per frame

    def _capacity(self, index: int, max_values: int | None) -> int:
        info = self.outputs[index] if self.outputs else None
        size = info.values if info is not None else None
        if info is not None and info.data_dependent and max_values is None:
            raise DecoderError(f"output {info.name!r}: its size depends on the frame ({list(info.shape)} at warm-up)"
                               "; set decoder max_values to the most values one frame may produce")
        if max_values is None:
            if size is None:
                raise DecoderError(f"output {info.name if info else index!r}: size unknown; set decoder max_values")
            return max(size, 1)
        if size is not None and not info.data_dependent and size > max_values:
            raise DecoderError(f"output {info.name!r} has {size} values per frame, more than max_values "
                               f"{max_values}: results would be cut short")
        return max_values

    def _too_large(self, index: int, n: int, cap: int) -> DecoderError:
        name = self.outputs[index].name if self.outputs else index
        return DecoderError(f"output {name!r} has {n} values, more than the {cap} a record holds "
                            "(decoder max_values): not published")

    def decode(self, outputs, frame_w, frame_h):
        if not self.tensors:
            flat = outputs[self.output].reshape(-1)
            n = flat.shape[0]
            if n > self.caps[0]:
                raise self._too_large(self.output, n, self.caps[0])
            self._buf[:n] = flat
            return self._buf[:n], n
        buf, off = self._buf, 0
        for i, cap, dt, head in zip(self.picked, self.caps, self.dtypes, self._heads):
            t = outputs[i]
            if t.size > cap:
                raise self._too_large(i, t.size, cap)
            buf[off:off + TENSOR_DESC_SIZE] = head
            dims = self._dims
            dims[:] = 0
            dims[0] = t.ndim
            dims[1:1 + t.ndim] = t.shape
            buf[off + TENSOR_NDIM_OFFSET:off + TENSOR_DESC_SIZE] = dims.view(np.uint8)  # ndim, then dims
            off += TENSOR_DESC_SIZE
            nbytes = t.size * dt.itemsize
            buf[off:off + nbytes].view(dt)[:] = t.reshape(-1)
            end = off + _padded(nbytes)
            buf[off + nbytes:end] = 0
            off = end
        return buf[:off], len(self.picked)
