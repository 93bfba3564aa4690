"""Classification: optional softmax, then the top k classes.

Payload: item_count rows of (class_id, score) float32, best first.
"""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field

from edgeinfer._decode import top_k
from edgeinfer.models.decoders.base import KIND_CLASSIFICATION, Decoder, DecoderError, DecoderParams


class ClassificationParams(DecoderParams):
    type: Literal["classification"]
    # Scores are published as the model outputs them (logits, for most classifiers) unless softmax is set:
    # then they are probabilities that sum to 1 over all classes.
    softmax: bool = False
    top_k: Optional[int] = Field(None, ge=1, le=10000, description="classes per result; default min(5, classes)")


class Classification(Decoder):
    type = "classification"
    kind = KIND_CLASSIFICATION
    Params = ClassificationParams

    def __init__(self, params, labels, input_w, input_h, outputs, resize="stretch"):
        super().__init__(params, labels, input_w, input_h, outputs, resize)
        self.softmax = params.softmax
        self.classes = outputs[self.output].values if outputs else None
        self.top_k = params.top_k or min(5, self.classes or 5)
        if labels and self.classes and len(labels) != self.classes:  # a label per class, or the names are wrong
            raise DecoderError(f"{len(labels)} labels for an output of {self.classes} classes")
        self._buf = np.zeros((self.top_k, 2), np.float32)

    def decode(self, outputs, frame_w, frame_h):
        # One native call (edgeinfer._decode) on the output as ONNX Runtime returns it ([1, classes] float32):
        # numpy's top-k cost 80-180 µs right after an inference, its code and data cold in the caches.
        scores = outputs[self.output]
        try:
            k = top_k(scores, self.top_k, self.softmax, self._buf)
        except ValueError:  # another rank, dtype or layout: converted (a copy), then the same
            k = top_k(np.ascontiguousarray(scores, np.float32).reshape(1, -1), self.top_k, self.softmax, self._buf)
        return self._buf[:k], k
