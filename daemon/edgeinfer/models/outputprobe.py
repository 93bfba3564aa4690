"""The model's outputs as the decoders see them: name, element type, and shape for one frame.

A graph may leave output dims open (a symbolic batch, a size that follows the input).
Those are resolved by running the model on the declared input geometry, on the control
plane before anything is served, so a decoder sizes its payload for the real output
(and refuses a `max_values` that would cut it short) instead of guessing. The probe runs
on three frames, black, white and noise, preprocessed as model.yaml says: a dim that
differs between them depends on the frame's content (a detector's kept boxes), and its
decoder must be told how large it may get.
"""
from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort

from edgeinfer.models.bundle import BundleError
from edgeinfer.models.decoders import OutputInfo
from edgeinfer.abi.vocabulary import channels


def dims_of(value_info) -> list[int | None]:
    """A value info's dims; None for an open one (a dim_param, no value, or -1 as some exporters write it)."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
            for d in value_info.type.tensor_type.shape.dim]


def _dtype(value_info) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        return np.dtype(object)  # a string or a type numpy has no dtype for: decoders refuse it by name


def output_infos(graph: onnx.ModelProto, model_bytes: bytes, spec, preprocess, where: str,
                 deadline_s: float = 30.0) -> list[OutputInfo]:
    """OutputInfo per graph output; open dims resolved by the warm-up probe (see the module's doc)."""
    declared = [(o.name, _dtype(o), dims_of(o)) for o in graph.graph.output]
    if all(None not in dims for _, _, dims in declared):
        return [OutputInfo(n, dt, tuple(dims)) for n, dt, dims in declared]
    runs = _probe(graph, model_bytes, spec, preprocess, where, deadline_s)
    infos = []
    for i, (n, dt, _) in enumerate(declared):
        shapes = [run[i].shape for run in runs]
        largest = max(shapes, key=lambda s: int(np.prod(s)))
        infos.append(OutputInfo(n, dt, tuple(largest), data_dependent=len(set(shapes)) > 1))
    return infos


def _frames(spec, preprocess, dtype) -> list[np.ndarray]:
    """Black, white and noise, as the model's input: scaled, normalised and laid out as model.yaml says."""
    ch = channels(spec.pixel_format)
    raw = [np.zeros((spec.height, spec.width, ch)), np.full((spec.height, spec.width, ch), 255.0),
           np.random.default_rng(0).integers(0, 256, (spec.height, spec.width, ch)).astype(np.float64)]
    mean, std = np.asarray(preprocess.mean), np.asarray(preprocess.std)
    out = []
    for f in raw:
        x = (f * preprocess.scale - mean) / std
        x = x.transpose(2, 0, 1) if spec.layout == "nchw" else x
        out.append(x[None].astype(dtype))
    return out


def _probe(graph, model_bytes: bytes, spec, preprocess, where: str, deadline_s: float):
    inp = next(i for i in graph.graph.input if i.name == spec.name)
    frames = _frames(spec, preprocess, _dtype(inp))
    options = ort.RunOptions()
    timer = threading.Timer(deadline_s, setattr, (options, "terminate", True))
    timer.daemon = True
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        session = ort.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
        timer.start()
        return [session.run(None, {spec.name: f}, options) for f in frames]
    except Exception as e:
        if options.terminate:
            raise BundleError(f"{where}: the warm-up probe of the outputs' sizes did not finish within "
                              f"{deadline_s:g} s: model refused") from None
        raise BundleError(f"{where}: the warm-up probe of the outputs' sizes failed: {e}") from None
    finally:
        timer.cancel()
