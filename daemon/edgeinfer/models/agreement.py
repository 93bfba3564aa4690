"""How far two versions of a model agree, frame by frame: the one measure behind `edgeinferctl model quantize`'s
gate (INT8 against FP32) and a rollout's agreement gate (a candidate against the serving version).

Classification: the share of frames whose top-1 answer is the same label (compared by label name where both
versions have labels, so a version that swaps two labels disagrees on those classes), and the largest difference
of the per-class scores as the decoder publishes them. Detection: the share of boxes that find a box of the same
class at IoU >= 0.5 in the other version (greedy, one to one, best box first), and the largest score difference
of those pairs. A raw model's outputs have no agreed meaning to compare.
"""
from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION

IOU_MATCH = 0.5
METRICS = {KIND_CLASSIFICATION: "top1", KIND_DETECTION: "boxes_iou50"}
# The least agreement accepted by default: INT8 against FP32 (quantize), a candidate against the serving version
# (a rollout's gate). docs/operations/models-and-trust.md, "INT8 quantization", says why these values.
DEFAULT_MIN_AGREEMENT = {KIND_CLASSIFICATION: 0.98, KIND_DETECTION: 0.90}


def z_score(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (0.95: 1.96)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(agreed: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a share `agreed`/`n` at `confidence` (two-sided): (low, high). (0, 1) when
    nothing was compared. Unlike the normal approximation it stays inside [0, 1] and is not zero wide at 0 or n
    agreed: 203 of 203 at 95 % is [0.9814, 1]; 202 of 203 is [0.9726, 0.9991]."""
    if n <= 0:
        return 0.0, 1.0
    z = z_score(confidence)
    p, z2 = agreed / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class NotComparable(ValueError):
    """The two versions' outputs cannot be compared (a raw decoder, or nothing detected by either)."""


@dataclasses.dataclass(frozen=True)
class Agreement:
    metric: str             # "top1" or "boxes_iou50"
    agreement: float        # share of answers (classes, boxes) the second version gives as the first does
    max_score_delta: float  # largest |score A - score B| over what was compared
    frames: int             # frames compared
    compared: int           # answers compared (frames, or boxes of both versions)
    pairs: int = 0          # detection: matched box pairs (the score delta is over these)


def scores(decoder, outputs: list[np.ndarray]) -> np.ndarray:
    """A classifier's per-class scores as its decoder publishes them (softmax when configured)."""
    s = outputs[decoder.output].reshape(-1).astype(np.float64)
    if decoder.softmax:
        e = np.exp(s - s.max())
        s = e / e.sum()
    return s


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box a (x1, y1, x2, y2) with each row of b."""
    w = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = w * h
    area = lambda r: np.clip(r[..., 2] - r[..., 0], 0, None) * np.clip(r[..., 3] - r[..., 1], 0, None)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-9)


def match_boxes(ref: np.ndarray, got: np.ndarray) -> list[tuple[int, int]]:
    """Greedy one-to-one pairs (i in ref, j in got) of the same class at IoU >= 0.5, best ref box first.
    Rows: x1, y1, x2, y2, score, class (the detection decoder's payload)."""
    free = np.ones(len(got), bool)
    pairs = []
    for i in np.argsort(-ref[:, 4], kind="stable"):
        if not free.any():
            break
        iou = _iou(ref[i], got)
        iou[~free | (got[:, 5] != ref[i, 5])] = -1.0
        j = int(iou.argmax())
        if iou[j] >= IOU_MATCH:
            free[j] = False
            pairs.append((int(i), j))
    return pairs


class AgreementMeter:
    """Accumulates the agreement of version B with version A, one frame at a time (A: the reference — FP32, or
    the serving version). Classes are compared by label where both decoders have labels, else by index."""

    def __init__(self, decoder_a, decoder_b):
        if decoder_a.kind not in METRICS or decoder_b.kind != decoder_a.kind:
            raise NotComparable(f"decoder {decoder_a.type!r} against {decoder_b.type!r}: agreement is measured for "
                                "two classifiers or two detectors only; a raw model's outputs have no agreed "
                                "meaning to compare")
        self.a, self.b = decoder_a, decoder_b
        self.kind = decoder_a.kind
        la, lb = list(decoder_a.labels or ()), list(decoder_b.labels or ())
        # B's class index → A's (by label name); a label A does not have maps to no class of A (-1 - index).
        self.b_to_a = None
        if la and lb and la != lb:
            self.b_to_a = np.array([la.index(n) if n in la else -1 - i for i, n in enumerate(lb)], np.float64)
        self.frames = self.same = self.total = self.matched = 0
        self.delta = 0.0

    def _as_a(self, cls: int) -> int:
        m = self.b_to_a
        return cls if m is None or not 0 <= cls < len(m) else int(m[cls])

    def add(self, outputs_a: list[np.ndarray], outputs_b: list[np.ndarray], width: int, height: int) -> None:
        """One frame's raw outputs of both versions (width, height: the frame's, for detection boxes)."""
        self.frames += 1
        if self.kind == KIND_CLASSIFICATION:
            sa, sb = scores(self.a, outputs_a), scores(self.b, outputs_b)
            ia, ib = int(sa.argmax()), int(sb.argmax())
            self.total += 1  # before what agreed: a reader on another thread never sees more agreed than compared
            self.same += int(ia == self._as_a(ib))
            if len(sa) == len(sb) and self.b_to_a is None:
                self.delta = max(self.delta, float(np.abs(sa - sb).max()))
            return
        ra = self.a.decode(outputs_a, width, height)[0].copy()  # the decoder reuses its buffer: copy out
        rb = self.b.decode(outputs_b, width, height)[0].copy()
        if self.b_to_a is not None and len(rb):
            cls = rb[:, 5].astype(np.int64)
            ok = (cls >= 0) & (cls < len(self.b_to_a))
            rb[ok, 5] = self.b_to_a[cls[ok]]
        pairs = match_boxes(ra, rb)
        self.total += len(ra) + len(rb)
        self.matched += 2 * len(pairs)
        for i, j in pairs:
            self.delta = max(self.delta, abs(float(ra[i, 4]) - float(rb[j, 4])))

    @property
    def agreed(self) -> int:
        """Answers agreed so far: frames (classification) or boxes of both versions that found a pair."""
        return self.same if self.kind == KIND_CLASSIFICATION else self.matched

    @property
    def agreement(self) -> float | None:
        """The share agreed so far; None before anything was compared."""
        return self.agreed / self.total if self.total else None

    def result(self) -> Agreement:
        if not self.total:
            raise NotComparable(f"neither version detects anything on the {self.frames} frames: nothing to compare")
        return Agreement(METRICS[self.kind], self.agreement, self.delta, self.frames, self.total,
                         self.matched // 2 if self.kind == KIND_DETECTION else 0)
