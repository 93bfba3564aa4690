"""Classification: softmax (optional) and top-k.

Payload: item_count rows of (class_id, score) float32, best first.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.decoders.base import KIND_CLASSIFICATION, Decoder, DecoderError, no_leftovers, take


class Classification(Decoder):
    type = "classification"
    kind = KIND_CLASSIFICATION

    def __init__(self, params, labels, input_w, input_h, output_shapes):
        super().__init__(params, labels, input_w, input_h, output_shapes)
        self.softmax = take(params, "softmax", False, bool)
        classes = self.output_shape[-1] if self.output_shape else None
        self.top_k = take(params, "top_k", min(5, classes or 5), int)
        no_leftovers(self.type, params)
        if labels and classes and len(labels) != classes:  # a label per class, or the names printed are wrong
            raise DecoderError(f"{len(labels)} labels for an output of {classes} classes")
        if self.top_k < 1:
            raise DecoderError("decoder parameter top_k: must be >= 1")
        self._buf = np.zeros((self.top_k, 2), np.float32)

    def decode(self, outputs, frame_w, frame_h):
        scores = outputs[self.output].reshape(-1)
        if self.softmax:
            e = np.exp(scores - scores.max())
            scores = e / e.sum()
        k = min(self.top_k, scores.shape[0])
        top = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(k)
        top = top[np.argsort(-scores[top], kind="stable")]
        self._buf[:k, 0] = top
        self._buf[:k, 1] = scores[top]
        return self._buf[:k], k
