"""Classification: optional softmax, then the top k classes.

Payload: item_count rows of (class_id, score) float32, best first.
"""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field

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
