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

from edgeinfer.models.bundle import BundleError, InputSpec, PreprocessSpec
from edgeinfer.models.placement import placement
from edgeinfer.abi.vocabulary import FRAME_CHANNELS, MODEL_CHANNELS, frame_shape, yuv_parts

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


# Kr, Kb of each matrix (Kg = 1 - Kr - Kb), and the (Y offset, Y scale, chroma scale) of each range, so that
# R' = Y' + 2(1-Kr)V', B' = Y' + 2(1-Kb)U', G' = Y' - (2Kb(1-Kb)U' + 2Kr(1-Kr)V') / Kg (ITU-R BT.601 / BT.709).
_MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}
_RANGES = {"limited": (16.0, 255.0 / 219.0, 255.0 / 224.0), "full": (0.0, 1.0, 1.0)}


def yuv_to_rgb(colorimetry: str) -> tuple[np.ndarray, np.ndarray]:
    """(M, offsets) with [R, G, B] = M @ ([Y, U, V] - offsets), in 0..255 before clipping."""
    matrix, _, rng = colorimetry.partition("-")
    kr, kb = _MATRICES[matrix]
    kg = 1.0 - kr - kb
    y0, ys, cs = _RANGES["full" if rng == "full" else "limited"]
    m = np.array([[1.0, 0.0, 2 * (1 - kr)],
                  [1.0, -2 * kb * (1 - kb) / kg, -2 * kr * (1 - kr) / kg],
                  [1.0, 2 * (1 - kb), 0.0]]) * np.array([ys, cs, cs])
    return m, np.array([y0, 128.0, 128.0])


def _crop_resize(cur: str, tag: str, crop: tuple[int, int, int, int] | None, size: tuple[int, int] | None,
                 channels: int, sampling: dict, batched: bool, name) -> tuple[list, list, str]:
    """Slice (crop: y0, x0, y1, x1) then Resize (size: H', W') of a uint8 [n, H, W, C] tensor; either may be None.
    tag keeps the names of several planes apart ("" for an RGB frame)."""
    nodes, inits = [], []
    t = (lambda s: name(f"{tag}_{s}")) if tag else name
    if crop is not None:  # crop: the centre region, before any resize
        y0, x0, y1, x1 = crop
        inits += [numpy_helper.from_array(np.array([y0, x0], np.int64), t("crop_starts")),
                  numpy_helper.from_array(np.array([y1, x1], np.int64), t("crop_ends")),
                  numpy_helper.from_array(np.array([1, 2], np.int64), t("hw_axes"))]
        nodes.append(helper.make_node("Slice", [cur, t("crop_starts"), t("crop_ends"), t("hw_axes")],
                                      [t("cropped")], name=t("crop")))
        cur = t("cropped")
    if size is not None:
        # Resize the uint8 frame first: casting the full frame to float first costs far more.
        inits += [numpy_helper.from_array(np.zeros(0, np.float32), t("roi")),
                  numpy_helper.from_array(np.zeros(0, np.float32), t("scales"))]
        if batched:  # sizes = [the frame's own batch, H', W', C]
            inits += [numpy_helper.from_array(np.array([0], np.int64), t("zero")),
                      numpy_helper.from_array(np.array([1], np.int64), t("one")),
                      numpy_helper.from_array(np.array([size[0], size[1], channels], np.int64), t("hwc"))]
            nodes += [helper.make_node("Shape", [cur], [t("shape")], name=t("shape_of")),
                      helper.make_node("Slice", [t("shape"), t("zero"), t("one")], [t("n")], name=t("batch_of")),
                      helper.make_node("Concat", [t("n"), t("hwc")], [t("sizes")], axis=0, name=t("sizes_of"))]
        else:
            inits.append(numpy_helper.from_array(np.array([1, size[0], size[1], channels], np.int64), t("sizes")))
        nodes.append(helper.make_node("Resize", [cur, t("roi"), t("scales"), t("sizes")], [t("resized")],
                                      name=t("resize"), **sampling))
        cur = t("resized")
    return nodes, inits, cur


def _yuv_nodes(base: str, h: int, w: int, crop: tuple[int, int, int, int] | None, size: tuple[int, int] | None,
               out: tuple[int, int], sampling: dict, batched: bool, name) -> tuple[list, list, str]:
    """Nodes that make a uint8 [n, H', W', 3] (Y, U, V) image of size `out` from a YUV frame as the ring
    holds it (4:2:0: [n, H*3/2, W, 1]; yuyv: [n, H, W, 2]). Each plane is cropped and resized from its own
    resolution (the chroma from half size), so nothing is computed at the frame's full size but the Y plane's
    resize, as for an RGB frame. Chroma samples cover 2x2 (4:2:0) or 2x1 (4:2:2) pixels, centred on them; when
    the frame is not resized, chroma is repeated over those pixels (nearest), which is what ffmpeg's swscale
    does (-sws_flags neighbor+accurate_rnd+full_chroma_int matches it within 1 level)."""
    ints = lambda a, n: numpy_helper.from_array(np.array(a, np.int64), name(n))  # noqa: E731
    inits, nodes = [], []
    if base == "yuyv":  # Y0 U Y1 V per pixel pair. Strided slices at full size are slow in ORT: the frame is
        # resized as it is ([n, H, W, 2]: Y, then U or V) for Y, and as pairs ([n, H, W/2, 4]: Y0 U Y1 V) for U
        # and V; each keeps its channels only at the model's size.
        inits += [ints([0, h, w // 2, 4], "pairs"), ints([3], "c_axis"), ints([0], "y_first"), ints([1], "y_end"),
                  ints([1], "uv_first"), ints([4], "uv_end"), ints([2], "uv_step")]
        nodes.append(helper.make_node("Reshape", [FRAME_INPUT, name("pairs")], [name("uv")], name=name("pairs_of")))
        luma = (FRAME_INPUT, 2, [name("y_first"), name("y_end"), name("c_axis")])
        chroma, sub_y = [("uv", 4, [name("uv_first"), name("uv_end"), name("c_axis"), name("uv_step")])], 1
    else:  # nv12 / i420: the Y rows, then the chroma rows
        q = h // 4  # rows of width w one i420 chroma plane takes
        inits += [ints([0], "y_first"), ints([h], "y_end"), ints([h * 3 // 2], "rows_end"), ints([1], "row_axis")]
        nodes.append(helper.make_node("Slice", [FRAME_INPUT, name("y_first"), name("y_end"), name("row_axis")],
                                      [name("y")], name=name("y_rows")))
        luma = (name("y"), 1, None)
        if base == "nv12":  # U V interleaved at half size
            inits.append(ints([0, h // 2, w // 2, 2], "uv_dims"))
            nodes += [helper.make_node("Slice", [FRAME_INPUT, name("y_end"), name("rows_end"), name("row_axis")],
                                       [name("uv_rows")], name=name("uv_rows")),
                      helper.make_node("Reshape", [name("uv_rows"), name("uv_dims")], [name("uv")], name=name("uv"))]
            chroma = [("uv", 2, None)]
        else:  # i420: the U plane, then the V plane
            inits += [ints([h + q], "u_end"), ints([0, h // 2, w // 2, 1], "c_shape")]
            for plane, lo, hi in (("u", "y_end", "u_end"), ("v", "u_end", "rows_end")):
                nodes += [helper.make_node("Slice", [FRAME_INPUT, name(lo), name(hi), name("row_axis")],
                                           [name(f"{plane}_rows")], name=name(f"{plane}_rows")),
                          helper.make_node("Reshape", [name(f"{plane}_rows"), name("c_shape")], [name(plane)],
                                           name=name(plane))]
            chroma = [("u", 1, None), ("v", 1, None)]
        sub_y = 2
    planes = []

    def plane(src: str, tag: str, ch: int, keep: list | None, box, to, how: dict) -> None:
        more, more_inits, res = _crop_resize(src, tag, box, to, ch, how, batched, name)
        if keep is not None:  # the plane's own channels, at the model's size
            more.append(helper.make_node("Slice", [res, *keep], [name(f"{tag}_kept")], name=name(f"{tag}_keep")))
            res = name(f"{tag}_kept")
        nodes.extend(more)
        inits.extend(more_inits)
        planes.append(res)
    plane(luma[0], "y", luma[1], luma[2], crop, size, sampling)
    # A chroma crop covers every chroma sample the luma crop touches (an odd offset: half a sample more).
    c_crop = None if crop is None else (crop[0] // sub_y, crop[1] // 2, -(-crop[2] // sub_y), -(-crop[3] // 2))
    for tag, ch, keep in chroma:  # always resized: from half size to `out`, nearest when the frame is not resized
        plane(name(tag), tag, ch, keep, c_crop, out, sampling if size is not None else {"mode": "nearest"})
    nodes.append(helper.make_node("Concat", planes, [name("yuv444")], axis=3, name=name("yuv444")))
    return nodes, inits, name("yuv444")


def _colour_nodes(colorimetry: str, model_channels: str, cur: str, name) -> tuple[list, list, str]:
    """uint8 (Y, U, V) → float RGB in the model's channel order, clipped and rounded to whole levels as an
    8-bit RGB frame would be (so results match a model fed ffmpeg's rgb24 of the same frame)."""
    m, offsets = yuv_to_rgb(colorimetry)
    rows = [{"R": 0, "G": 1, "B": 2}[c] for c in model_channels]
    f32 = lambda a, n: numpy_helper.from_array(np.asarray(a, np.float32), name(n))  # noqa: E731
    inits = [f32(offsets, "yuv_offsets"), f32(m[rows].T, "yuv_matrix"), f32(0.0, "lo"), f32(255.0, "hi")]
    nodes = [helper.make_node("Cast", [cur], [name("yuv_f")], to=TensorProto.FLOAT, name=name("yuv_cast")),
             helper.make_node("Sub", [name("yuv_f"), name("yuv_offsets")], [name("yuv_c")], name=name("yuv_centre")),
             helper.make_node("MatMul", [name("yuv_c"), name("yuv_matrix")], [name("rgb_f")], name=name("to_rgb")),
             helper.make_node("Clip", [name("rgb_f"), name("lo"), name("hi")], [name("rgb_c")], name=name("clip")),
             helper.make_node("Round", [name("rgb_c")], [name("float")], name=name("levels"))]
    return nodes, inits, name("float")


def preprocess_graph(frame_format: str, frame_h: int, frame_w: int, spec: InputSpec, pre: PreprocessSpec,
                     opset: int, ir_version: int, batched: bool = False) -> onnx.ModelProto:
    """The ops between the camera's frame and the model's input, as a model of its own. batched: the batch
    axis is dynamic (micro-batching: [k, H, W, C]), else 1."""
    n = "batch" if batched else 1
    if opset < 11:
        raise BundleError(f"model opset {opset}: in-graph preprocessing needs opset >= 11 (Resize)")
    ch = len(MODEL_CHANNELS[spec.pixel_format])
    nodes, inits = [], []
    cur = FRAME_INPUT

    def name(s: str) -> str:
        return _PREFIX + s

    place = placement(pre.resize, frame_w, frame_h, spec.width, spec.height)
    sampling = _sampling(pre.interpolation, opset)
    # The crop (y0, x0, y1, x1) and the resize (H', W') the placement asks for; None where there is none.
    crop = None if (place.crop_w, place.crop_h) == (frame_w, frame_h) else (
        place.crop_y, place.crop_x, place.crop_y + place.crop_h, place.crop_x + place.crop_w)
    size = None if (place.resize_w, place.resize_h) == (place.crop_w, place.crop_h) else (
        place.resize_h, place.resize_w)
    yuv = yuv_parts(frame_format)
    if yuv is not None:
        if spec.pixel_format == "gray8":
            raise BundleError(f"a {frame_format} stream cannot feed a gray8 model (no gray path from YUV in-graph)")
        if frame_h % 2 or frame_w % 2:
            raise BundleError(f"a {frame_format} frame needs an even width and height, not {frame_w}x{frame_h}")
        more, more_inits, cur = _yuv_nodes(yuv[0], frame_h, frame_w, crop, size, (place.resize_h, place.resize_w),
                                           sampling, batched, name)
    else:
        more, more_inits, cur = _crop_resize(cur, "", crop, size, len(FRAME_CHANNELS[frame_format]), sampling,
                                             batched, name)
    nodes += more
    inits += more_inits
    if yuv is not None:  # YUV → RGB at the model's size: far fewer pixels than the frame's
        more, more_inits, cur = _colour_nodes(yuv[1], MODEL_CHANNELS[spec.pixel_format], cur, name)
        nodes += more
        inits += more_inits
    if any(place.pads):  # letterbox: pad the resized frame to the input's size with pad_value
        top, left, bottom, right = place.pads
        dtype = np.float32 if yuv is not None else np.uint8  # (a YUV frame is RGB floats by now)
        inits += [numpy_helper.from_array(np.array([0, top, left, 0, 0, bottom, right, 0], np.int64), name("pads")),
                  numpy_helper.from_array(np.array(pre.pad_value, dtype), name("pad_value"))]
        nodes.append(helper.make_node("Pad", [cur, name("pads"), name("pad_value")], [name("padded")],
                                      mode="constant", name=name("letterbox")))
        cur = name("padded")
    if yuv is None:
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
        [helper.make_tensor_value_info(FRAME_INPUT, TensorProto.UINT8,
                                       [n, *frame_shape(frame_format, frame_h, frame_w)])],
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
