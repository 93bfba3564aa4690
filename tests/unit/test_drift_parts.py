"""Drift (models/psi.py, control/drift.py): the PSI and the bins, the reference's file, and the chore itself on real result rings
written in this process (the daemon's lanes write the same records): a reference taken from a version's first
frames and kept in the state directory, windows that slide, a figure that stays flat on the same mix and moves on
another, a new version that starts from its own reference, a bundle's own reference, and the exposition."""
from __future__ import annotations

import json
import math
import os
import random
import types

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION
from edgeinfer.config.sections import DriftConfig
from edgeinfer.control.drift import Drift, state_path
from edgeinfer.models.psi import BUNDLE_FILE, EPS, Reference, box_buckets, frame_features, psi, score_edges
from edgeinfer.telemetry.metrics import _drift


def test_psi_is_the_formula_and_zero_for_the_same_distribution():
    assert psi([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0)     # proportions, not counts
    e, a = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    assert psi([50, 50], [90, 10]) == pytest.approx(float(np.sum((a - e) * np.log(a / e))))
    assert psi([50, 50], [90, 10]) == pytest.approx(psi([90, 10], [50, 50]))  # symmetric
    assert psi([], [1, 2]) == 0.0 and psi([1, 2], [0, 0]) == 0.0             # nothing to compare


def test_psi_floors_an_empty_bin_at_eps_and_pads_the_shorter():
    got = psi([100, 0], [50, 50])
    assert got == pytest.approx((0.5 - 1) * math.log(0.5) + (0.5 - EPS) * math.log(0.5 / EPS))
    assert math.isfinite(got) and got > 0.25
    assert psi([1, 1], [1, 1, 0]) == pytest.approx(0.0)                   # an empty bin on both sides costs 0
    assert psi([1, 1], [1, 1, 2]) == pytest.approx(psi([1, 1, 0], [1, 1, 2]))


def test_boxes_per_frame_buckets():
    assert box_buckets([0, 1, 2, 3, 4, 5, 6, 9, 10, 50]).tolist() == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6]


def test_score_bins_are_the_references_quantiles_logits_included():
    rng = np.random.default_rng(1)
    logits = rng.normal(8.0, 3.0, 1000)                      # a classifier without softmax: scores beyond 0-1
    edges = score_edges(logits, 10)
    assert len(edges) == 9 and edges == sorted(edges)
    counts = np.bincount(np.searchsorted(edges, logits, side="right"), minlength=10)
    assert counts.min() >= 95 and counts.max() <= 105       # ~a tenth each
    assert score_edges([0.5] * 100, 10) == [0.5]             # ties: each edge once
    assert score_edges([], 10) == []


def _cls(top: int, score: float, k: int = 4) -> np.ndarray:
    rows = np.zeros((k, 2), np.float32)
    rows[:, 0] = [top, *[c for c in range(k) if c != top]][:k]
    rows[:, 1] = [score, *[score / (i + 2) for i in range(k - 1)]]
    return rows


def test_frame_features_of_a_classification_and_a_detection():
    classes, scores, boxes = frame_features(KIND_CLASSIFICATION, _cls(2, 0.75).tobytes(), 4)
    assert classes.tolist() == [2] and scores.tolist() == [0.75] and boxes is None
    det = np.array([[0, 0, 5, 5, 0.9, 0], [1, 1, 4, 4, 0.4, 3]], np.float32)
    classes, scores, boxes = frame_features(KIND_DETECTION, det.tobytes(), 2)
    assert classes.tolist() == [0, 3] and scores == pytest.approx([0.9, 0.4]) and boxes == 2
    assert frame_features(KIND_DETECTION, b"", 0)[2] == 0
    with pytest.raises(ValueError):
        frame_features(KIND_DETECTION, det.tobytes()[:30], 2)   # a payload shorter than its items


def test_a_reference_bins_unseen_classes_as_other_and_round_trips_through_json():
    ref = Reference.build(KIND_DETECTION, 3, [0, 0, 1], [0.9, 0.8, 0.5], [2, 1, 0], 4)
    assert ref.classes.tolist() == [2, 1, 0] and ref.boxes.tolist() == [1, 1, 1, 0, 0, 0, 0]
    got = ref.bin(np.array([5, -1, 1]), np.array([0.1, 0.95, 0.5]), np.array([12]))
    assert got["classes"].tolist() == [0, 1, 2] and got["boxes"].tolist() == [0, 0, 0, 0, 0, 0, 1]
    again = Reference.from_json(json.loads(json.dumps(ref.to_json("det", "1.0"))), "state")
    assert again.kind == KIND_DETECTION and again.frames == 3 and again.source == "state"
    assert again.classes.tolist() == ref.classes.tolist() and again.edges.tolist() == ref.edges.tolist()
    doc = ref.to_json("det", "1.0")
    for bad in ({**doc, "kind": "raw"}, {**doc, "frames": 0}, {**doc, "extra": 1},
                {**doc, "features": {**doc["features"], "boxes": None}},
                {**doc, "features": {**doc["features"], "score": [1]}}, [1, 2]):
        with pytest.raises(ValueError):
            Reference.from_json(bad, "state")


# ------------------------------------------------------------------ the chore, on real result rings

class _Rig:
    """Result rings written here as a lane writes them, and the Drift chore reading them on a clock of ours."""

    def __init__(self, tmp_path, streams=("a", "b"), records: int = 64, bundle_files=None, **drift):
        cfg = types.SimpleNamespace(drift=DriftConfig(**{"reference_frames": 400, "window_s": 10.0,
                                                         "min_window_frames": 200, "interval_s": 1.0, **drift}),
                                    model=types.SimpleNamespace(state_dir=str(tmp_path / "state")))
        self.writers = {s: ring.ResultWriter.create(64, records=records) for s in streams}
        self.streams = [types.SimpleNamespace(name=s, model="orient", writer=w) for s, w in self.writers.items()]
        bundle = types.SimpleNamespace(path=str(tmp_path / "bundle"), files=bundle_files or {})
        self.models = types.SimpleNamespace(served={"orient": types.SimpleNamespace(
            runtime=types.SimpleNamespace(version="1.0", bundle=bundle))})
        self.cfg = cfg
        self.drift = Drift(cfg, self.streams, self.models)
        self.now = 100.0
        self.rng = random.Random(3)

    def frames(self, stream: str, n: int, mix=(0, 1, 2, 3), version: str = "1.0") -> None:
        for _ in range(n):
            top = self.rng.choice(mix)
            self.writers[stream].write(kind=KIND_CLASSIFICATION, payload=_cls(top, 5.0 + top + self.rng.random()),
                                       item_count=4, model_name="orientation", model_version=version)

    def second(self, per_stream: int = 30, **kw) -> None:
        """One second: `per_stream` frames on every stream, then the chore's tick."""
        for s in self.writers:
            self.frames(s, per_stream, **kw)
        self.now += 1.0
        self.drift.run_due(self.now)

    def figure(self, stream: str, version: str = "1.0"):
        return next((f for f in self.drift.view.figures if (f.stream, f.version) == (stream, version)), None)

    def close(self):
        self.drift.close()
        for w in self.writers.values():
            w.close()


def test_the_reference_is_taken_kept_and_the_figure_moves_only_when_the_mix_does(tmp_path):
    rig = _Rig(tmp_path)
    try:
        for _ in range(6):                       # 2 streams x 30 frames a second: 400 frames in 7 s
            rig.second()
        (ref,) = rig.drift.view.references
        assert (ref.complete, ref.frames, ref.source) == (False, 360, "building")
        assert rig.drift.view.figures == ()      # nothing to compare with yet
        rig.second()
        (ref,) = rig.drift.view.references
        assert (ref.complete, ref.frames) == (True, 400)
        path = state_path(str(tmp_path / "state"), "orient", "1.0")
        saved = json.loads(open(path).read())
        assert saved["kind"] == "classification" and saved["frames"] == 400 and saved["version"] == "1.0"
        assert saved["name"] == "orientation" and oct(os.stat(path).st_mode & 0o777) == "0o600"

        for _ in range(3):
            rig.second()
        a = rig.figure("a")
        assert a is None or a.psi is None        # a's own reference (400 of its frames) is still being taken
        flat = []
        for _ in range(25):                      # the window (10 s) fills, then slides
            rig.second()
            if rig.figure("a") is not None and rig.figure("a").psi is not None:
                flat.append((rig.figure("a").psi, rig.figure("b").psi, rig.figure("*").psi))
        assert rig.figure("a").frames == 300 and rig.figure("*").frames == 600   # the window slid: 10 s of 30
        assert len(flat) >= 8 and max(max(f) for f in flat) < 0.1, flat
        assert set(rig.figure("*").features) == {"classes", "score"}

        for _ in range(10):                      # stream a sees upright pages only; b as before
            rig.frames("b", 30)
            rig.frames("a", 30, mix=(0,))
            rig.now += 1.0
            rig.drift.run_due(rig.now)
        assert rig.figure("a").psi > 0.25 and rig.figure("a").features["classes"] > 0.25
        assert rig.figure("b").psi < 0.25           # no alert (its own 400-frame reference: sampling noise)
        assert 0.1 < rig.figure("*").psi < rig.figure("a").psi   # pooled: half the frames moved
    finally:
        rig.close()

    # A restart: the reference is read back from the state directory, never taken again.
    rig = _Rig(tmp_path)
    try:
        rig.second()
        (ref,) = rig.drift.view.references
        assert (ref.complete, ref.frames, ref.source) == (True, 400, "state")
        for _ in range(10):
            rig.second(mix=(0,))
        assert rig.figure("a").psi > 0.25 and rig.figure("b").psi > 0.25
    finally:
        rig.close()


def test_each_stream_is_compared_with_its_own_scene_and_a_rolled_back_version_is_forgotten(tmp_path):
    """Two cameras that see different scenes (a: upright and 90°, b: 180° and 270° pages), both stable: neither
    alerts (PSI < 0.25), since each is compared with its own reference, not one pooled over both (against which
    each read about 0.7 before). A rolled-back version's references go, files included; a canary-promoted
    version's pooled one only."""
    rig = _Rig(tmp_path, reference_frames=200, min_window_frames=150, score_bins=4)
    try:
        for _ in range(25):
            rig.frames("a", 30, mix=(0, 1))
            rig.frames("b", 30, mix=(2, 3))
            rig.now += 1.0
            rig.drift.run_due(rig.now)
        a, b, pooled = rig.figure("a"), rig.figure("b"), rig.figure("*")
        assert a.psi < 0.25 and b.psi < 0.25, (a, b)
        assert pooled.psi < 0.25, pooled
        for s in ("a", "b"):
            assert os.path.exists(state_path(str(tmp_path / "state"), "orient", "1.0", s))
        rig.drift.discard("orient", "1.0", pooled_only=True)
        assert not os.path.exists(state_path(str(tmp_path / "state"), "orient", "1.0"))
        assert os.path.exists(state_path(str(tmp_path / "state"), "orient", "1.0", "a"))
        rig.drift.discard("orient", "1.0")
        assert not os.listdir(tmp_path / "state" / "drift") and not rig.drift.references
        rig.now += 1.0
        rig.drift.run_due(rig.now)
        assert rig.drift.view.figures == ()
    finally:
        rig.close()


def test_a_new_version_starts_from_its_own_reference(tmp_path):
    # Small samples: a PSI with no change is about (bins - 1) * (1/window + 1/reference), so few bins here.
    rig = _Rig(tmp_path, streams=("a",), reference_frames=200, min_window_frames=150, score_bins=4)
    try:
        for _ in range(16):
            rig.second(mix=(0, 1))
        assert rig.figure("a").psi < 0.1
        rig.second(mix=(3,), version="2.0")     # another version: its frames are its own reference's
        refs = {r.version: r for r in rig.drift.view.references}
        assert refs["1.0"].complete and not refs["2.0"].complete and refs["2.0"].frames == 30
        assert rig.figure("a") is None           # the stream left 1.0, and 2.0 has no window yet
        for _ in range(16):
            rig.second(mix=(3,), version="2.0")
        assert {r.version for r in rig.drift.view.references if r.complete} == {"1.0", "2.0"}
        assert rig.figure("a", "2.0").psi < 0.1  # compared with 2.0's own reference, not 1.0's
        assert os.path.exists(state_path(str(tmp_path / "state"), "orient", "2.0"))
    finally:
        rig.close()


def test_a_bundles_own_reference_comes_first_and_a_bad_state_file_is_replaced(tmp_path):
    ref = Reference.build(KIND_CLASSIFICATION, 100, [0] * 100, [6.0] * 100, [], 10)  # upright pages only
    files = {BUNDLE_FILE: json.dumps(ref.to_json("orientation", "1.0")).encode()}
    rig = _Rig(tmp_path, streams=("a",), bundle_files=files, min_window_frames=50)
    try:
        for _ in range(3):
            rig.second()
        (view,) = rig.drift.view.references
        assert (view.source, view.frames, view.complete) == ("bundle", 100, True)
        assert rig.figure("*").psi > 0.25        # all four rotations against the bundle's upright reference
        assert rig.figure("a") is None           # a stream's own reference is of its own frames: being taken
        assert not os.path.exists(state_path(str(tmp_path / "state"), "orient", "1.0"))  # nothing to record
    finally:
        rig.close()

    path = state_path(str(tmp_path / "state"), "orient", "1.0")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("{not json")
    rig = _Rig(tmp_path, streams=("a",), reference_frames=60)
    try:
        for _ in range(3):
            rig.second()
        assert rig.drift.view.references[0].complete and json.loads(open(path).read())["frames"] == 60
    finally:
        rig.close()


class _Collector:
    def __init__(self, view):
        self.view = view

    def collect(self):
        return _drift(self.view)


def test_a_ring_written_faster_than_read_is_sampled_and_the_exposition(tmp_path):
    rig = _Rig(tmp_path, streams=("a",), records=16, reference_frames=50, min_window_frames=20)
    try:
        for _ in range(6):
            rig.second(per_stream=40)            # 40 records a second into a ring of 16: its newest are read
        read, missed = rig.drift.view.records["a"]
        assert read + missed == 240 and read >= 6 * 15 and missed > 0
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(rig.drift.view))
        text = generate_latest(registry).decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        ids = (("model", "orient"), ("stream", "a"), ("version", "1.0"))
        assert ("edgeinfer_model_drift_psi", ids) in samples
        assert ("edgeinfer_model_drift_psi", (("model", "orient"), ("stream", "*"), ("version", "1.0"))) in samples
        assert samples[("edgeinfer_model_drift_window_frames", ids)] >= 20
        assert samples[("edgeinfer_model_drift_reference_complete", (("model", "orient"), ("version", "1.0")))] == 1
        assert samples[("edgeinfer_model_drift_records_total", (("outcome", "missed"), ("stream", "a")))] == missed
        assert ("edgeinfer_model_drift_feature_psi", (("feature", "score"), *ids)) in samples
    finally:
        rig.close()


def test_the_drift_section_is_validated():
    from pydantic import ValidationError
    assert DriftConfig().reference_frames == 1000 and DriftConfig().window_s == 300.0
    for bad in ({"window_s": 0}, {"reference_frames": 1}, {"interval_s": 0.0}, {"unknown": 1}):
        with pytest.raises(ValidationError):
            DriftConfig(**bad)
