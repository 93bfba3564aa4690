"""Decoders on hand-made outputs, and the fused preprocessing graph on real models."""
from __future__ import annotations

import numpy as np
import pytest

from daemon_helpers import bundle
from edgeinfer.models.bundle import BundleError, load_unverified_bundle as load_bundle
from edgeinfer.models.decoders import DecoderError, make_decoder, registered
from edgeinfer.models.decoders.detection import nms
from edgeinfer.models.fusion import channel_map
from edgeinfer.models.runtime import ModelRuntime


def test_registry_is_derived_from_the_classes():
    assert registered() == ["classification", "detection", "raw"]
    with pytest.raises(DecoderError, match="unknown decoder type 'segmentation'"):
        make_decoder({"type": "segmentation"}, [], 8, 8, [[1, 4]])
    with pytest.raises(DecoderError, match=r"decoder parameter colour: unknown parameter"):
        make_decoder({"type": "classification", "colour": 1}, [], 8, 8, [[1, 4]])


def test_classification_top_k_best_first_with_optional_softmax():
    d = make_decoder({"type": "classification", "top_k": 2, "softmax": True}, [], 8, 8, [[1, 4]])
    rows, n = d.decode([np.array([[1.0, 3.0, 2.0, 0.0]], np.float32)], 8, 8)
    assert n == 2 and rows[:, 0].tolist() == [1, 2]
    e = np.exp([1.0, 3.0, 2.0, 0.0])
    np.testing.assert_allclose(rows[:, 1], (e / e.sum())[[1, 2]], rtol=1e-6)
    assert d.payload_capacity == 2 * 2 * 4


@pytest.mark.parametrize("classes,k", [(4, 4), (4, 2), (1000, 5), (1000, 1), (3, 7)])
@pytest.mark.parametrize("softmax", [False, True])
def test_classification_top_k_equals_numpy_on_ties_nan_and_any_size(classes, k, softmax):
    """The native top-k (edgeinfer._decode) against numpy written out: the k best, best first, ties by the lower
    class index; NaN ranks last and stays NaN; softmax over every class."""
    rng = np.random.default_rng(classes * 31 + k)
    d = make_decoder({"type": "classification", "top_k": k, "softmax": softmax}, [], 8, 8, [[1, classes]])
    for trial in range(20):
        s = rng.integers(-3, 4, classes).astype(np.float32) if trial % 2 else rng.normal(size=classes).astype(np.float32)
        if trial == 5 and classes > 2:
            s[[0, 2]] = np.nan
        rows, n = d.decode([s[None]], 8, 8)
        rows = rows.copy()  # the decoder's own buffer: the next decode writes it again
        order = sorted(range(classes), key=lambda i: (np.isnan(s[i]), -s[i] if not np.isnan(s[i]) else 0, i))
        want = order[:min(k, classes)]
        assert n == len(want) and rows[:, 0].astype(int).tolist() == want, (s, rows)
        if softmax:
            e = np.exp(s - s.max())
            ref = (e / e.sum())[want]
        else:
            ref = s[want]
        np.testing.assert_allclose(rows[:, 1], ref, rtol=1e-5, atol=1e-7)
        for other in (s, s.astype(np.float64)[None, :, None, None], s[None, ::-1][:, ::-1]):  # converted first
            again, m = d.decode([other], 8, 8)
            assert m == n and np.array_equal(again, rows, equal_nan=True)


def test_detection_decodes_grid_scales_to_the_frame_and_suppresses_overlaps():
    d = make_decoder({"type": "detection", "strides": [32], "score_threshold": 0.5}, [], 64, 64, [[1, 4, 6]])
    out = np.zeros((1, 4, 6), np.float32)
    out[0, :, 4] = out[0, :, 5] = 0.0
    out[0, 0] = [0.5, 0.5, 0.0, 0.0, 1.0, 0.9]   # cell (0,0): centre (16,16), 32x32
    out[0, 3] = [0.5, 0.5, 0.0, 0.0, 0.8, 1.0]   # cell (1,1): centre (48,48), 32x32
    rows, n = d.decode([out], 128, 64)           # frame twice as wide as the model input
    assert n == 2
    np.testing.assert_allclose(rows[0], [0, 0, 64, 32, 0.9, 0], atol=1e-5)
    np.testing.assert_allclose(rows[1], [64, 32, 128, 64, 0.8, 0], atol=1e-5)
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], np.float32)
    assert nms(boxes, np.array([0.9, 0.8, 0.7], np.float32), 0.5, 10).tolist() == [0, 2]
    with pytest.raises(DecoderError, match="3549 rows"):
        make_decoder({"type": "detection"}, [], 64, 64, [[1, 3549, 6]])


def test_raw_never_cuts_an_output_short():
    with pytest.raises(DecoderError, match="5 values per frame, more than max_values 3: results would be cut short"):
        make_decoder({"type": "raw", "max_values": 3}, [], 8, 8, [[1, 5]])
    d = make_decoder({"type": "raw"}, [], 8, 8, [[1, 5]])
    vals, n = d.decode([np.arange(5, dtype=np.float32)[None]], 8, 8)
    assert n == 5 and vals.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(DecoderError, match="has 6 values, more than the 5 a record holds"):
        d.decode([np.arange(6, dtype=np.float32)[None]], 8, 8)


def test_channel_maps():
    assert channel_map("bgr24", "bgr24") is None
    assert channel_map("rgb24", "bgr24") == [2, 1, 0]
    assert channel_map("bgra32", "rgb24") == [2, 1, 0]
    assert channel_map("gray8", "rgb24") == [0, 0, 0]
    with pytest.raises(BundleError, match="cannot feed a gray8 model"):
        channel_map("rgb24", "gray8")


def test_fused_channel_order_and_resize_are_done_in_graph():
    rt = ModelRuntime(load_bundle(bundle("orientation")), warmup_runs=0)
    rng = np.random.default_rng(3)
    bgr = rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
    a = rt.session_for("bgr24", 224, 224).run(bgr)[0]
    b = rt.session_for("rgb24", 224, 224).run(np.ascontiguousarray(bgr[..., ::-1]))[0]
    np.testing.assert_allclose(a, b, atol=1e-6)  # the Gather reorders exactly
    big = np.repeat(np.repeat(bgr, 2, axis=1), 2, axis=2)  # 448x448, each pixel doubled
    c = rt.session_for("bgr24", 448, 448).run(big)[0]
    assert c.shape == a.shape and int(c.argmax()) == int(a.argmax())
    from edgeinfer.models.fusion import fuse
    same = [n.op_type for n in fuse(rt.graph, "bgr24", 224, 224, rt.meta.input, rt.meta.preprocess).graph.node]
    other = [n.op_type for n in fuse(rt.graph, "rgb24", 448, 448, rt.meta.input, rt.meta.preprocess).graph.node]
    assert same[:3] == ["Cast", "Transpose", "Mul"] and "Resize" not in same  # no resize, no reorder needed
    assert other[:3] == ["Resize", "Gather", "Cast"]  # resize the uint8 frame first, then reorder, then cast
