"""Preprocessing fused into the model graph.

At load time we put a few ONNX ops in front of the (verified) model, in memory:
the uint8 [1, H, W, C] frame exactly as the camera wrote it is the graph's
input, and ONNX Runtime's kernels do resize, channel order, cast, layout and
normalisation in one pass. Nothing is computed per frame in numpy, and the
frame view goes straight from shared memory into session.run.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, compose, helper, numpy_helper

from edgeinfer.bundle import BundleError, InputSpec, PreprocessSpec
from edgeinfer.placement import placement
from edgeinfer.vocabulary import FRAME_CHANNELS, MODEL_CHANNELS

FRAME_INPUT = "frame"
_PREFIX = "ei_pre_"


def channel_map(frame_format: str, model_format: str) -> list[int] | None:
    """For each model channel, the frame channel it comes from; None = identity."""
    have, want = FRAME_CHANNELS[frame_format], MODEL_CHANNELS[model_format]
    if want == "Y" and have != "Y":
        raise BundleError(f"a {frame_format} stream cannot feed a gray8 model (no colour conversion in-graph)")
    idx = [0 if have == "Y" else have.index(c) for c in want]
    return None if idx == list(range(len(have))) else idx


def _sampling(interpolation: str, opset: int) -> dict:
    """Resize's attributes for model.yaml's preprocess.interpolation."""
    if interpolation == "nearest":
        return {"mode": "nearest"}
    if interpolation == "area":
        if opset < 18:
            raise BundleError(f"preprocess.interpolation area needs Resize's antialias (opset >= 18); the model's "
                              f"opset is {opset}: convert the model (onnx.version_converter) or use linear")
        return {"mode": "linear", "antialias": 1}
    return {"mode": "linear"}


def check_sampling(model: onnx.ModelProto, pre: PreprocessSpec, where: str) -> None:
    """At load, not at the first frame: an interpolation the model's opset cannot express is refused."""
    try:
        _sampling(pre.interpolation, default_opset(model))
    except BundleError as e:
        raise BundleError(f"{where}: {e}") from None


def default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    raise BundleError("the model imports no default ONNX opset")


def preprocess_graph(frame_format: str, frame_h: int, frame_w: int, spec: InputSpec, pre: PreprocessSpec,
                     opset: int, ir_version: int, batched: bool = False) -> onnx.ModelProto:
    """The ops between the camera's frame and the model's input, as a model of its own. batched: the batch
    axis is dynamic (micro-batching: [k, H, W, C]), else 1."""
    n = "batch" if batched else 1
    if opset < 11:
        raise BundleError(f"model opset {opset}: in-graph preprocessing needs opset >= 11 (Resize)")
    ch_in = len(FRAME_CHANNELS[frame_format])
    ch = len(MODEL_CHANNELS[spec.pixel_format])
    nodes, inits = [], []
    cur = FRAME_INPUT

    def name(s: str) -> str:
        return _PREFIX + s

    place = placement(pre.resize, frame_w, frame_h, spec.width, spec.height)
    if (place.crop_w, place.crop_h) != (frame_w, frame_h):  # crop: the centre region, before any resize
        inits += [numpy_helper.from_array(np.array([place.crop_y, place.crop_x], np.int64), name("crop_starts")),
                  numpy_helper.from_array(np.array([place.crop_y + place.crop_h, place.crop_x + place.crop_w],
                                                   np.int64), name("crop_ends")),
                  numpy_helper.from_array(np.array([1, 2], np.int64), name("hw_axes"))]
        nodes.append(helper.make_node("Slice", [cur, name("crop_starts"), name("crop_ends"), name("hw_axes")],
                                      [name("cropped")], name=name("crop")))
        cur = name("cropped")
    if (place.resize_w, place.resize_h) != (place.crop_w, place.crop_h):
        # Resize the uint8 frame first: casting the full frame to float first costs far more.
        inits += [numpy_helper.from_array(np.zeros(0, np.float32), name("roi")),
                  numpy_helper.from_array(np.zeros(0, np.float32), name("scales"))]
        if batched:  # sizes = [the frame's own batch, H', W', C]
            inits += [numpy_helper.from_array(np.array([0], np.int64), name("zero")),
                      numpy_helper.from_array(np.array([1], np.int64), name("one")),
                      numpy_helper.from_array(np.array([place.resize_h, place.resize_w, ch_in], np.int64),
                                              name("hwc"))]
            nodes += [helper.make_node("Shape", [cur], [name("shape")], name=name("shape_of")),
                      helper.make_node("Slice", [name("shape"), name("zero"), name("one")], [name("n")],
                                       name=name("batch_of")),
                      helper.make_node("Concat", [name("n"), name("hwc")], [name("sizes")], axis=0,
                                       name=name("sizes_of"))]
        else:
            inits.append(numpy_helper.from_array(np.array([1, place.resize_h, place.resize_w, ch_in], np.int64),
                                                 name("sizes")))
        nodes.append(helper.make_node("Resize", [cur, name("roi"), name("scales"), name("sizes")], [name("resized")],
                                      name=name("resize"), **_sampling(pre.interpolation, opset)))
        cur = name("resized")
    if any(place.pads):  # letterbox: pad the resized frame to the input's size with pad_value
        top, left, bottom, right = place.pads
        inits += [numpy_helper.from_array(np.array([0, top, left, 0, 0, bottom, right, 0], np.int64), name("pads")),
                  numpy_helper.from_array(np.array(pre.pad_value, np.uint8), name("pad_value"))]
        nodes.append(helper.make_node("Pad", [cur, name("pads"), name("pad_value")], [name("padded")],
                                      mode="constant", name=name("letterbox")))
        cur = name("padded")
    idx = channel_map(frame_format, spec.pixel_format)
    if idx is not None:
        inits.append(numpy_helper.from_array(np.array(idx, np.int64), name("channels")))
        nodes.append(helper.make_node("Gather", [cur, name("channels")], [name("ordered")], axis=3,
                                      name=name("channel_order")))
        cur = name("ordered")
    nodes.append(helper.make_node("Cast", [cur], [name("float")], to=TensorProto.FLOAT, name=name("cast")))
    cur = name("float")
    if spec.layout == "nchw":
        nodes.append(helper.make_node("Transpose", [cur], [name("nchw")], perm=[0, 3, 1, 2], name=name("to_nchw")))
        cur = name("nchw")
    # (x * scale - mean) / std folded into one multiply and one add per channel.
    mean = np.broadcast_to(np.asarray(pre.mean, np.float64), (ch,))
    std = np.broadcast_to(np.asarray(pre.std, np.float64), (ch,))
    shape = (1, ch, 1, 1) if spec.layout == "nchw" else (1, 1, 1, ch)
    inits += [numpy_helper.from_array((pre.scale / std).astype(np.float32).reshape(shape), name("mul")),
              numpy_helper.from_array((-mean / std).astype(np.float32).reshape(shape), name("add"))]
    nodes.append(helper.make_node("Mul", [cur, name("mul")], [name("scaled")], name=name("scale")))
    nodes.append(helper.make_node("Add", [name("scaled"), name("add")], [name("out")], name=name("normalise")))
    out_shape = [n, ch, spec.height, spec.width] if spec.layout == "nchw" else [n, spec.height, spec.width, ch]
    graph = helper.make_graph(
        nodes, "edgeinfer_preprocess",
        [helper.make_tensor_value_info(FRAME_INPUT, TensorProto.UINT8, [n, frame_h, frame_w, ch_in])],
        [helper.make_tensor_value_info(name("out"), TensorProto.FLOAT, out_shape)],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def fuse(model: onnx.ModelProto, frame_format: str, frame_h: int, frame_w: int, spec: InputSpec,
         pre: PreprocessSpec, batched: bool = False) -> onnx.ModelProto:
    """The model with preprocessing in front: input `frame` uint8 [1, H, W, C] ([k, H, W, C] when batched)."""
    names = [i.name for i in model.graph.input]
    if spec.name not in names:
        raise BundleError(f"model.yaml input.name '{spec.name}' is not a graph input (inputs: {names})")
    pre_model = preprocess_graph(frame_format, frame_h, frame_w, spec, pre, default_opset(model), model.ir_version,
                                 batched)
    try:
        return compose.merge_models(pre_model, model, io_map=[(_PREFIX + "out", spec.name)])
    except Exception as e:  # onnx raises ValueError/checker errors with useful text
        raise BundleError(f"cannot put preprocessing in front of the model: {e}") from None
