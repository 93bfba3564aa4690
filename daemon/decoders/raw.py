"""Raw: the first `max_values` float32 values of one output, as they are.

Payload: item_count float32 values.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.decoders.base import KIND_RAW, Decoder, DecoderError, no_leftovers, take


class Raw(Decoder):
    type = "raw"
    kind = KIND_RAW

    def __init__(self, params, labels, input_w, input_h, output_shapes):
        super().__init__(params, labels, input_w, input_h, output_shapes)
        shape = self.output_shape
        static = int(np.prod([d for d in shape if d])) if shape and all(shape[1:]) else None
        self.max_values = take(params, "max_values", static or 4096, int)
        no_leftovers(self.type, params)
        if self.max_values < 1:
            raise DecoderError("decoder parameter max_values: must be >= 1")
        self._buf = np.zeros(self.max_values, np.float32)

    def decode(self, outputs, frame_w, frame_h):
        flat = outputs[self.output].reshape(-1)
        n = min(flat.shape[0], self.max_values)
        self._buf[:n] = flat[:n]
        return self._buf[:n], n
