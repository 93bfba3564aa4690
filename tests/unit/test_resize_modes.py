"""Resize modes (issue 14, item 5): stretch, letterbox and crop place the frame in the model's input in
the graph, and the detection decoder maps boxes back through the same placement, exactly.

The model finds the bounding box of the bright pixels of its input (ReduceMax, ArgMax first and last), so
a frame with a white rectangle at known pixels must come back as that rectangle in every mode."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from daemon_helpers import camera, results, sign_copy, start_daemon, stop_daemon, write_config
from edgeinfer.models.placement import placement

CTL = [sys.executable, "-m", "edgeinfer.cli"]
SIDE = 64
FRAME_W, FRAME_H = 128, 64
RECT = (40, 8, 80, 48)  # x1, y1, x2, y2 (corners: x2, y2 one past the last pixel)


def bright_box_model(path, opset: int = 13) -> str:
    """x [1, 3, 64, 64] (0..1) → [1, 1, 6]: (cx, cy, w, h, 1, 1) of the pixels brighter than 0.5, input pixels."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array([1, 1, 6], np.int64), "row_shape")]
    n = helper.make_node
    nodes = [n("ReduceMax", ["x"], ["m"], axes=[1], keepdims=0),
             n("Greater", ["m", "half"], ["mask_b"]), n("Cast", ["mask_b"], ["mask"], to=TensorProto.FLOAT),
             n("ReduceMax", ["mask"], ["cols"], axes=[1], keepdims=0),
             n("ReduceMax", ["mask"], ["rows"], axes=[2], keepdims=0)]
    for axis_name, src in (("x", "cols"), ("y", "rows")):
        nodes += [n("ArgMax", [src], [f"{axis_name}1i"], axis=1, keepdims=0, select_last_index=0),
                  n("ArgMax", [src], [f"{axis_name}2i"], axis=1, keepdims=0, select_last_index=1),
                  n("Cast", [f"{axis_name}1i"], [f"{axis_name}1"], to=TensorProto.FLOAT),
                  n("Cast", [f"{axis_name}2i"], [f"{axis_name}2l"], to=TensorProto.FLOAT),
                  n("Add", [f"{axis_name}2l", "one"], [f"{axis_name}2"]),  # one past the last pixel
                  n("Add", [f"{axis_name}1", f"{axis_name}2"], [f"{axis_name}s"]),
                  n("Mul", [f"{axis_name}s", "half"], [f"c{axis_name}"]),
                  n("Sub", [f"{axis_name}2", f"{axis_name}1"], [f"size_{axis_name}"])]
    nodes += [n("Concat", ["cx", "cy", "size_x", "size_y", "one1", "one1"], ["row"], axis=0),
              n("Reshape", ["row", "row_shape"], ["boxes"])]
    inits.append(numpy_helper.from_array(np.array([1.0], np.float32), "one1"))
    graph = helper.make_graph(nodes, "bright_box",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIDE, SIDE])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def bundle_cli(model: str, out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CTL, "model", "bundle", model, "--out", str(out), "--name", "box", "--version", "1",
                           "--pixel-format", "rgb24", "--scale", str(1 / 255), "--decoder", "detection",
                           "--param", "decode_grid=false", "--param", "score_threshold=0.5", "--labels", "box",
                           *extra], capture_output=True, text=True, timeout=120)


def with_resize(bundle_dir, mode: str, **more) -> None:
    meta = bundle_dir / "model.yaml"
    text = meta.read_text().replace("preprocess:\n", f"preprocess:\n  resize: {mode}\n" +
                                    "".join(f"  {k}: {v}\n" for k, v in more.items()))
    meta.write_text(text)


def frame_with_rect() -> np.ndarray:
    f = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
    x1, y1, x2, y2 = RECT
    f[y1:y2, x1:x2] = 255
    return f


def test_placements():
    # 2:1 into 1:1. Letterbox: 64x32, 16 rows of padding above and below; crop: the centre 64x64.
    assert placement("letterbox", 128, 64, 64, 64).pads == (16, 0, 16, 0)
    cr = placement("crop", 128, 64, 64, 64)
    assert (cr.crop_x, cr.crop_y, cr.crop_w, cr.crop_h) == (32, 0, 64, 64)
    assert placement("stretch", 128, 64, 64, 64).to_frame_x(32) == 64
    # 16:9 into 4:3, the case: letterbox keeps the aspect, crop keeps the centre.
    lb = placement("letterbox", 1920, 1080, 640, 480)
    assert (lb.resize_w, lb.resize_h, lb.pads) == (640, 360, (60, 0, 60, 0))
    cr = placement("crop", 1920, 1080, 640, 480)
    assert (cr.crop_x, cr.crop_w, cr.crop_h) == (240, 1440, 1080)
    with pytest.raises(ValueError, match="resize mode 'squash'"):
        placement("squash", 1, 1, 1, 1)


@pytest.mark.parametrize("mode", ["stretch", "letterbox", "crop"])
def test_a_known_box_maps_back_exactly(mode, tmp_path):
    """The fused graph and the decoder, as a lane runs them (ModelRuntime)."""
    from edgeinfer.models.bundle import load_unverified_bundle
    from edgeinfer.models.runtime import ModelRuntime
    model = bright_box_model(tmp_path / "m.onnx")
    assert bundle_cli(model, tmp_path / "b").returncode == 0
    with_resize(tmp_path / "b", mode)
    rt = ModelRuntime(load_unverified_bundle(str(tmp_path / "b")))
    session = rt.session_for("rgb24", FRAME_H, FRAME_W)
    rows, n = rt.decoder.decode(session.run(frame_with_rect()[None]), FRAME_W, FRAME_H)
    assert n == 1
    assert rows[0, :4].tolist() == list(RECT), (mode, rows[0])


def test_letterbox_pads_with_its_value_and_the_daemon_maps_boxes_back(tmp_path, signing_key, children, stream):
    key, _, trust = signing_key
    model = bright_box_model(tmp_path / "m.onnx")
    assert bundle_cli(model, tmp_path / "b").returncode == 0
    bundle = sign_copy(str(tmp_path / "b"), tmp_path / "signed", key,
                       lambda d: with_resize(d, "letterbox", pad_value=200))  # 200/255 > 0.5: padding is "bright"
    cfg = write_config(tmp_path, bundle, [{"name": stream, "width": FRAME_W, "height": FRAME_H}], trust_dir=trust)
    proc = start_daemon(children, cfg)
    reader = results(proc, stream)
    with camera(proc, stream, FRAME_W, FRAME_H, "rgb24") as writer:
        np.copyto(writer.begin(), np.zeros((FRAME_H, FRAME_W, 3), np.uint8))
        writer.publish(frame_id=1)
        rec = reader.read(20)
    reader.close()
    assert stop_daemon(proc) == 0
    assert rec is not None and rec.item_count == 1
    box = np.frombuffer(rec.payload, np.float32)[:4].tolist()
    # A black frame: only the padding is bright, 16 input rows above and below the frame, which map to frame
    # rows -32..0 and 64..96; the box of both spans the whole input, i.e. the frame and the padding around it.
    assert box == [0.0, -32.0, 128.0, 96.0], box


def test_area_interpolation_needs_opset_18(tmp_path):
    model = bright_box_model(tmp_path / "m.onnx")
    assert bundle_cli(model, tmp_path / "b").returncode == 0
    with_resize(tmp_path / "b", "stretch", interpolation="area")
    r = subprocess.run([*CTL, "model", "verify", str(tmp_path / "b"), "--trust-dir", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    from edgeinfer.models.bundle import BundleError, load_unverified_bundle
    from edgeinfer.models.runtime import ModelRuntime
    with pytest.raises(BundleError, match=r"interpolation area needs Resize's antialias \(opset >= 18\); the "
                                          r"model's opset is 13"):
        ModelRuntime(load_unverified_bundle(str(tmp_path / "b")))


def test_area_interpolation_sees_what_linear_skips(tmp_path):
    """A 256x256 frame with one bright pixel per 4x4 block, into 64x64: linear (no antialias) samples
    between pixels 1 and 2 of each block and sees black; area averages the block (255/16)."""
    import onnx
    from onnx import TensorProto, helper
    from edgeinfer.models.bundle import load_unverified_bundle
    from edgeinfer.models.runtime import ModelRuntime
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIDE, SIDE])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, SIDE, SIDE])
    m = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "id.onnx"))
    frame = np.zeros((256, 256, 3), np.uint8)
    frame[::4, ::4] = 255
    means = {}
    for mode in ("linear", "area"):
        out = tmp_path / mode
        r = subprocess.run([*CTL, "model", "bundle", str(tmp_path / "id.onnx"), "--out", str(out), "--name", "id",
                            "--version", "1", "--decoder", "raw"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        with_resize(out, "stretch", interpolation=mode)
        rt = ModelRuntime(load_unverified_bundle(str(out)))
        means[mode] = float(rt.session_for("bgr24", 256, 256).run(frame[None])[0].mean())
    assert means["linear"] == 0.0
    assert abs(means["area"] - 255 / 16) < 0.5, means
