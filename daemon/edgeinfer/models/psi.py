"""Drift's measure: what of a model's decoded outputs is compared, its bins, a reference of those distributions,
and the population stability index between a window and its reference (control/drift.py, the chore that reads
the result rings, uses them; docs/operations/metrics-and-alerts.md, "Drift").

What is measured, per frame:
- a classifier: its top-1 class, and its top-1 score;
- a detector: its boxes per frame (bucketed 0, 1, 2, 3, 4-5, 6-9, 10+), each box's class and score.
Class ids the reference never saw share one "other" bin; scores are binned on the reference's own deciles
(so a classifier that publishes logits is binned as well as one that publishes probabilities).

PSI = Σ (a_i − e_i) · ln(a_i / e_i) over the bins, a the window's proportions and e the reference's, each floored
at EPS so that an empty bin costs a bounded amount.
"""
from __future__ import annotations

import time

import numpy as np
from pydantic import Field, ValidationError

from edgeinfer.abi.vocabulary import ITEM_VALUES, KIND_CLASSIFICATION, KIND_DETECTION, KIND_NAMES
from edgeinfer.support.strictmodel import StrictModel

EPS = 1e-4                              # the floor of a bin's proportion in the PSI
BOX_EDGES = np.array([1, 2, 3, 4, 6, 10])  # boxes per frame: 0 | 1 | 2 | 3 | 4-5 | 6-9 | 10+
BOX_BUCKETS = ("0", "1", "2", "3", "4-5", "6-9", "10+")
BUNDLE_FILE = "drift_reference.json"    # a bundle's own reference (optional; signed like every bundle file)
STATE_SUBDIR = "drift"
FEATURES = {KIND_CLASSIFICATION: ("classes", "score"), KIND_DETECTION: ("boxes", "classes", "score")}


def psi(expected, actual, eps: float = EPS) -> float:
    """The population stability index of `actual` counts against `expected` counts (the shorter padded with
    empty bins): Σ (a − e) · ln(a / e) over the proportions, each floored at `eps`. 0 when either is empty."""
    e, a = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    n = max(len(e), len(a))
    e, a = np.pad(e, (0, n - len(e))), np.pad(a, (0, n - len(a)))
    if e.sum() <= 0 or a.sum() <= 0:
        return 0.0
    e, a = np.maximum(e / e.sum(), eps), np.maximum(a / a.sum(), eps)
    return float(np.sum((a - e) * np.log(a / e)))


def box_buckets(counts) -> np.ndarray:
    """The bucket (an index of BOX_BUCKETS) of each number of boxes per frame."""
    return np.searchsorted(BOX_EDGES, np.asarray(counts), side="right")


def score_edges(scores, bins: int) -> list[float]:
    """The interior edges of `bins` bins holding equal shares of the reference's scores (its quantiles), each
    edge once: a score lands in bin searchsorted(edges, score, 'right')."""
    s = np.asarray(scores, np.float64)
    if not len(s):
        return []
    return [float(x) for x in np.unique(np.quantile(s, np.arange(1, bins) / bins))]


def frame_features(kind: int, payload: bytes, item_count: int):
    """(classes, scores, boxes) of one result: the top-1 class and score of a classification (boxes None), every
    box's class and score and their number for a detection. Raises ValueError for a payload too short."""
    values = ITEM_VALUES[kind]
    rows = np.frombuffer(payload, np.float32, item_count * values).reshape(item_count, values)
    if kind == KIND_CLASSIFICATION:
        return rows[:1, 0].astype(np.int64), rows[:1, 1].astype(np.float64), None
    return rows[:, 5].astype(np.int64), rows[:, 4].astype(np.float64), item_count


class _Features(StrictModel):
    classes: list[int] = Field(min_length=2)   # per class id seen, then "other" (ids it never saw)
    score_edges: list[float]
    score: list[int]
    boxes: list[int] | None = None             # per BOX_BUCKETS (detectors)


class _ReferenceDoc(StrictModel):
    """The file: `features` holds counts; the rest says what it is the reference of."""
    format: int = Field(1, ge=1, le=1)
    kind: str
    frames: int = Field(ge=1)
    name: str = ""
    version: str = ""
    made_at: str = ""
    features: _Features


class Reference:
    """The reference distributions of one (model, version): counts per bin of each feature, and the bins."""

    def __init__(self, kind: int, frames: int, classes, edges, score, boxes=None, source: str = "served"):
        self.kind, self.frames, self.source = kind, int(frames), source
        self.classes = np.asarray(classes, np.int64)
        self.edges = np.asarray(edges, np.float64)
        self.score = np.asarray(score, np.int64)
        self.boxes = None if boxes is None else np.asarray(boxes, np.int64)
        self.features = FEATURES[kind]

    @classmethod
    def build(cls, kind: int, frames: int, classes, scores, boxes, bins: int) -> "Reference":
        """From the raw features of the reference's `frames` frames: class ids, scores (one per class id) and,
        for a detector, the number of boxes of each frame."""
        classes, scores = np.asarray(classes, np.int64), np.asarray(scores, np.float64)
        known = int(classes[classes >= 0].max()) + 1 if np.any(classes >= 0) else 1
        edges = np.asarray(score_edges(scores, bins))
        ref = cls(kind, frames, np.zeros(known + 1), edges,
                  np.zeros(len(edges) + 1), np.zeros(len(BOX_BUCKETS)) if kind == KIND_DETECTION else None)
        c = ref.bin(classes, scores, np.asarray(boxes) if kind == KIND_DETECTION else None)
        ref.classes, ref.score, ref.boxes = c["classes"], c["score"], c.get("boxes")
        return ref

    def bin(self, classes, scores, boxes=None) -> dict[str, np.ndarray]:
        """Counts per bin of these raw features, in this reference's bins."""
        n = len(self.classes)
        ids = np.where((classes >= 0) & (classes < n - 1), classes, n - 1)
        out = {"classes": np.bincount(ids, minlength=n),
               "score": np.bincount(np.searchsorted(self.edges, scores, side="right"), minlength=len(self.edges) + 1)}
        if self.kind == KIND_DETECTION:
            out["boxes"] = np.bincount(box_buckets(boxes), minlength=len(BOX_BUCKETS))
        return out

    def zeros(self) -> dict[str, np.ndarray]:
        return {f: np.zeros_like(getattr(self, f)) for f in self.features}

    def psi(self, counts: dict[str, np.ndarray]) -> dict[str, float]:
        return {f: psi(getattr(self, f), counts[f]) for f in self.features}

    def to_json(self, name: str, version: str) -> dict:
        return {"format": 1, "kind": KIND_NAMES[self.kind], "frames": self.frames, "name": name, "version": version,
                "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "features": {"classes": self.classes.tolist(), "score_edges": self.edges.tolist(),
                             "score": self.score.tolist(),
                             **({"boxes": self.boxes.tolist()} if self.boxes is not None else {})}}

    @classmethod
    def from_json(cls, data, source: str) -> "Reference":
        """Raises ValueError for anything but what to_json writes."""
        try:
            doc = _ReferenceDoc.model_validate(data)
        except ValidationError as e:
            raise ValueError(str(e).splitlines()[0] + ": " + "; ".join(
                f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())) from None
        kinds = {KIND_NAMES[k]: k for k in FEATURES}
        if doc.kind not in kinds:
            raise ValueError(f"kind {doc.kind!r}: drift is measured for {' and '.join(kinds)} only")
        f = doc.features
        if len(f.score) != len(f.score_edges) + 1 or f.score_edges != sorted(set(f.score_edges)):
            raise ValueError("features.score needs one bin more than features.score_edges, which must increase")
        kind = kinds[doc.kind]
        if (kind == KIND_DETECTION) != (f.boxes is not None) or (f.boxes is not None and
                                                                  len(f.boxes) != len(BOX_BUCKETS)):
            raise ValueError(f"features.boxes: {len(BOX_BUCKETS)} buckets for a detector ({', '.join(BOX_BUCKETS)}), "
                             "none for a classifier")
        if min(f.classes + f.score + (f.boxes or [])) < 0:
            raise ValueError("counts are never negative")
        return cls(kind, doc.frames, f.classes, f.score_edges, f.score, f.boxes, source)
