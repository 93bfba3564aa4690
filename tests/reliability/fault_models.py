"""Tiny ONNX models that make faults visible in the daemon's own results.

- checksum: counts the bytes of a frame that do not follow the test pattern of
  ring_helpers (byte i of frame seq = (seq * 7 + i // 64) mod 256) relative to
  the frame's first byte, and returns [mismatches, first byte]. A torn frame
  served by the daemon shows up as mismatches > 0 in its result record, and a
  frame served under the wrong id as a first byte != (frame_id * 7) mod 256.
- hang: a Loop of 10^12 iterations when the frame's first byte equals
  `trigger`, of none otherwise: a real hung `run` inside ONNX Runtime, chosen
  by the producer (trigger 127 hangs the daemon's grey warm-up frame).

Both take the frame as float32 NHWC (bundle layout nhwc, pixel format bgr24:
the fused preprocessing is a Cast only), and use the raw decoder.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inits, w, h, out_shape, name):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("frame", TensorProto.FLOAT, [1, h, w, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def checksum_model(w: int, h: int) -> onnx.ModelProto:
    n = w * h * 3
    pattern = ((np.arange(n, dtype=np.int64) >> 6) & 0xFF).astype(np.float32).reshape(1, n)
    inits = [numpy_helper.from_array(pattern, "pattern"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(256.0, np.float32), "k256"),
             numpy_helper.from_array(np.array(0.0, np.float32), "f0")]
    nodes = [
        helper.make_node("Reshape", ["frame", "flat_shape"], ["flat"]),
        helper.make_node("Slice", ["flat", "zero", "one", "one"], ["first"]),   # [1, 1]
        helper.make_node("Sub", ["flat", "first"], ["d0"]),
        helper.make_node("Sub", ["d0", "pattern"], ["d"]),
        helper.make_node("Div", ["d", "k256"], ["q"]),
        helper.make_node("Floor", ["q"], ["qf"]),
        helper.make_node("Mul", ["qf", "k256"], ["m256"]),
        helper.make_node("Sub", ["d", "m256"], ["mod"]),                          # d mod 256
        helper.make_node("Equal", ["mod", "f0"], ["ok"]),
        helper.make_node("Not", ["ok"], ["bad"]),
        helper.make_node("Cast", ["bad"], ["badf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["badf"], ["count"], keepdims=1),           # [1, 1]
        helper.make_node("Concat", ["count", "first"], ["out"], axis=1),          # [1, 2]
    ]
    return _model(nodes, inits, w, h, [1, 2], "checksum")


def hang_model(w: int, h: int, trigger: int = 7) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array([1, -1], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(10 ** 12, np.int64), "huge"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.array(float(trigger), np.float32), "trigger"),
             numpy_helper.from_array(np.array([[0.0]], np.float32), "acc0")]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one_f"], ["acc_out"])],
        "spin",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.array([[1.0]], np.float32), "one_f")])
    nodes = [
        helper.make_node("Reshape", ["frame", "flat_shape"], ["flat"]),
        helper.make_node("Slice", ["flat", "zero", "one", "one"], ["first"]),      # [1, 1]
        helper.make_node("Equal", ["first", "trigger"], ["hit"]),
        helper.make_node("Cast", ["hit"], ["hit_i"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["hit_i", "zero_shape"], ["hit_s"]),           # scalar 0 or 1
        helper.make_node("Mul", ["hit_s", "huge"], ["trips"]),
        helper.make_node("Loop", ["trips", "true", "acc0"], ["out"], body=body),
    ]
    inits.append(numpy_helper.from_array(np.array([], np.int64), "zero_shape"))
    return _model(nodes, inits, w, h, [1, 1], "hang")


def write_bundle(model: onnx.ModelProto, out: str, name: str, version: str, w: int, h: int) -> str:
    """An unsigned bundle (model.onnx + model.yaml) for `model`; sign it next."""
    os.makedirs(out, exist_ok=True)
    onnx.save(model, os.path.join(out, "model.onnx"))
    doc = {"name": name, "version": version,
           "input": {"name": "frame", "width": w, "height": h, "pixel_format": "bgr24", "layout": "nhwc"},
           "preprocess": {"scale": 1.0, "mean": [0.0], "std": [1.0]},
           "decoder": {"type": "raw"}, "labels": []}
    with open(os.path.join(out, "model.yaml"), "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return out


def signed_bundle(kind: str, out, key: str, w: int = 64, h: int = 48, version: str = "1.0.0", **kw) -> str:
    from edgeinfer.models.verify import sign_bundle
    model = {"checksum": checksum_model, "hang": hang_model}[kind](w, h, **kw)
    path = write_bundle(model, str(out), f"fault-{kind}", version, w, h)
    sign_bundle(path, key)
    return path
