"""`edgeinferctl model quantize`: a bundle's model as static INT8 (QDQ), kept
only when it agrees with the FP32 model on frames it was not calibrated on.

1. Frames (images from a directory, or a camera handing its ring to this tool:
   framesource.py) go through the daemon's own fused graph (fusion.fuse) with
   the model's input tensor exposed as an extra output: the calibration
   tensors are exactly what the model sees in the daemon.
2. onnxruntime.quantization.quantize_static, QDQ format, per-channel weights,
   MinMax calibration, on the first N frames.
3. The gate: the next M frames (held out) run through the FP32 and the INT8
   model, each fused and run as the daemon runs it (ModelRuntime), and are
   decoded by the bundle's decoder. Classification: top-1 agreement and the
   largest score difference; detection: the share of boxes that find a box of
   the same class at IoU >= 0.5 in the other model, and the largest score
   difference of those pairs. Below the thresholds nothing is written.
4. The bundle is written under a temporary name, checked by the daemon's model
   checks, signed (--key), checked again with the signature (--trust-dir) and
   only then given its name: a refusal at any step leaves no bundle.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import numpy as np
import onnx
import onnx.version_converter
import yaml
from onnx import TensorProto, helper

from edgeinfer.models.agreement import DEFAULT_MIN_AGREEMENT, IOU_MATCH, Agreement, AgreementMeter, NotComparable
from edgeinfer.models.bundle import META_FILE, MODEL_FILE, Bundle, BundleError, ModelMeta, load_unverified_bundle
from edgeinfer.models.fusion import FRAME_INPUT, _PREFIX, default_opset, fuse
from edgeinfer.models.runtime import ModelRuntime, ThreadPlan
from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION, frame_height

# The model input inside the fused graph: fusion's last preprocessing tensor, which merge_models wires to the
# model's input (fusion.fuse's io_map).
MODEL_INPUT_IN_FUSED = _PREFIX + "out"
# Defaults of the gate (docs/operations/models-and-trust.md, "INT8 quantization" says why these values; the minimum agreement is
# models/agreement.py's, which a rollout's agreement gate takes too).
DEFAULT_MAX_SCORE_DELTA = {KIND_CLASSIFICATION: 0.15, KIND_DETECTION: 0.25}


class QuantizationRefused(ValueError):
    """The INT8 model failed the accuracy gate (or could not be measured): nothing was written."""


def _threads() -> ThreadPlan:
    return ThreadPlan(threads=max(1, min(4, os.cpu_count() or 1)))  # an offline tool: use the host


class ModelInputs:
    """The tensors the model sees in the daemon for given frames: the fused graph (one per frame geometry)
    with the model's input as an extra output."""

    def __init__(self, model: ModelRuntime):
        self.model = model
        self._sessions: dict[tuple, object] = {}

    def __call__(self, frame: np.ndarray, pixel_format: str) -> np.ndarray:
        import onnxruntime as ort
        key = (pixel_format, frame_height(pixel_format, frame.shape[0]), frame.shape[1])
        sess = self._sessions.get(key)
        if sess is None:
            meta = self.model.meta
            fused = fuse(self.model.graph, pixel_format, key[1], key[2], meta.input, meta.preprocess)
            fused.graph.output.append(helper.make_tensor_value_info(MODEL_INPUT_IN_FUSED, TensorProto.FLOAT, None))
            sess = ort.InferenceSession(fused.SerializeToString(), _threads().session_options(),
                                        providers=["CPUExecutionProvider"])
            self._sessions[key] = sess
        return sess.run([MODEL_INPUT_IN_FUSED], {FRAME_INPUT: frame[None]})[0]


class _Reader:
    """onnxruntime.quantization's calibration data reader over prepared tensors."""

    def __init__(self, name: str, tensors: list[np.ndarray]):
        self.name, self._it = name, iter(tensors)

    def get_next(self):
        t = next(self._it, None)
        return None if t is None else {self.name: t}

    def rewind(self):  # some calibrators ask; ours read once
        pass


@dataclasses.dataclass(frozen=True)
class Options:
    per_channel: bool = True
    reduce_range: bool = True   # 7-bit weights: no u8*s8 saturation on CPUs without VNNI (docs: why)


def quantize_graph(model_bytes: bytes, input_name: str, tensors: list[np.ndarray], opts: Options) -> bytes:
    """Static INT8 QDQ of an ONNX model, calibrated (MinMax) on `tensors` fed to `input_name`."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    with tempfile.TemporaryDirectory(prefix="edgeinfer-quantize-") as tmp:
        src, pre, out = (os.path.join(tmp, n) for n in ("src.onnx", "pre.onnx", "int8.onnx"))
        model = onnx.load_from_string(model_bytes)
        if opts.per_channel and default_opset(model) < 13:
            # Per-channel DequantizeLinear (its `axis`) is opset 13; this ORT's quantizer does not convert.
            model = onnx.version_converter.convert_version(model, 13)
        onnx.save(model, src)
        # ONNX shape inference and ORT's basic optimisations (constant folding, Conv+BN) before quantizing, as
        # ORT recommends. Symbolic shape inference needs sympy, which we do not ship; these models have static
        # shapes, where ONNX's own inference is enough.
        quant_pre_process(src, pre, skip_symbolic_shape=True)
        quantize_static(pre, out, _Reader(input_name, tensors), quant_format=QuantFormat.QDQ,
                        per_channel=opts.per_channel, reduce_range=opts.reduce_range,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        with open(out, "rb") as f:
            return f.read()


# ------------------------------------------------------------------ the gate

def agreement(decoder, fp32: list[list[np.ndarray]], int8: list[list[np.ndarray]],
              sizes: list[tuple[int, int]]) -> Agreement:
    """How far the INT8 model's decoded answers agree with the FP32 model's, frame by frame (models/agreement.py,
    the measure a rollout's agreement gate uses too). sizes: (width, height) of each frame."""
    try:
        meter = AgreementMeter(decoder, decoder)
        for a, b, (w, h) in zip(fp32, int8, sizes):
            meter.add(a, b, w, h)
        return meter.result()
    except NotComparable as e:
        raise QuantizationRefused(f"the FP32 and the INT8 model on the {len(fp32)} held-out frames: {e}"
                                  + ("; calibrate with frames where the model detects objects"
                                     if decoder.kind == KIND_DETECTION else "")) from None


def run_model(model: ModelRuntime, frames: list[tuple[np.ndarray, str]]) -> list[list[np.ndarray]]:
    """Each frame through the model's fused, warmed session, as a lane runs it."""
    out = []
    for frame, fmt in frames:
        sess = model.session_for(fmt, frame.shape[0], frame.shape[1])
        out.append([o.copy() for o in sess.run(np.ascontiguousarray(frame[None]))])
    return out


# ------------------------------------------------------------------ the bundle

def default_version(version: str) -> str:
    """The source version as a post-release (0.0.11 → 0.0.11.post1): ordered after the FP32 model it comes
    from and before the next release, in the same family (docs/operations/models-and-trust.md)."""
    import re
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise ValueError(f"source version {version!r} has a suffix already: pass --version for the INT8 bundle")
    return version + ".post1"


def int8_meta(src: ModelMeta, name: str | None, version: str | None, record: dict) -> ModelMeta:
    doc = src.model_dump(mode="json", exclude_unset=True)
    doc.pop("quantization", None)
    doc["name"] = name or (src.name + "-int8")
    doc["family"] = src.floor_family  # one anti-rollback floor for the FP32 model and its INT8 versions
    doc["version"] = version or default_version(src.version)
    doc["quantization"] = record
    try:
        return ModelMeta.model_validate(doc)
    except Exception as e:
        raise ValueError(f"the INT8 bundle's model.yaml would be invalid: {e}; pass --name / --version") from None


def write_meta(path: str, meta: ModelMeta, source: str) -> None:
    with open(path, "w") as f:
        f.write(f"# Written by edgeinferctl model quantize from {source}\n")
        yaml.safe_dump(meta.model_dump(mode="json", exclude_unset=True), f, sort_keys=False)


def in_memory(meta: ModelMeta, model_bytes: bytes, where: str) -> ModelRuntime:
    """A ModelRuntime of a bundle not written yet (the gate runs before anything is written)."""
    return ModelRuntime(Bundle(where, meta, model_bytes, {MODEL_FILE: model_bytes}), threads=_threads(),
                        warmup_runs=1)


def finish_bundle(tmp: str, out: str, key: str | None, trust_dir: str | None) -> str:
    """Checks the bundle written in `tmp` with the daemon's model checks, names it `out`, signs it (key) and
    runs the daemon's full checks (trust_dir). Any failure removes it."""
    from edgeinfer.models.check import check_bundle
    from edgeinfer.models.verify import sign_bundle
    written = False
    try:
        m = ModelRuntime(load_unverified_bundle(tmp), threads=_threads(), warmup_runs=1)
        spec = m.meta.input
        m.session_for(spec.pixel_format, spec.height, spec.width)  # builds and warms, as the daemon would
        os.rename(tmp, out)  # a fresh name (checked absent): signing covers the files, not the directory
        written = True
        if key:
            sign_bundle(out, key)
        if trust_dir:
            check_bundle(out, trust_dir)
    except BaseException:
        shutil.rmtree(out if written else tmp, ignore_errors=True)
        raise
    return out


# ------------------------------------------------------------------ the command

def quantize_bundle(bundle: str, frames: list[tuple[np.ndarray, str]], calibration: int, out: str, *,
                    key: str | None = None, trust_dir: str | None = None, name: str | None = None,
                    version: str | None = None, min_agreement: float | None = None,
                    max_score_delta: float | None = None, opts: Options = Options(), source_note: str = "",
                    say=print) -> ModelMeta:
    """Quantizes `bundle` on frames[:calibration], gates it on the rest, writes `out`. Returns its meta."""
    import onnxruntime
    if os.path.lexists(out):
        raise ValueError(f"{out} exists; refusing to overwrite (give a new --out)")
    held = frames[calibration:]
    if calibration < 1 or not held:
        raise ValueError(f"{len(frames)} frames for {calibration} calibration frames: held-out frames are needed "
                         "for the accuracy gate (--held-out)")
    src = ModelRuntime(load_unverified_bundle(bundle), threads=_threads(), warmup_runs=1)
    kind = src.decoder.kind
    if kind not in DEFAULT_MIN_AGREEMENT:
        raise ValueError(f"{bundle}: decoder {src.decoder.type!r}: the accuracy gate knows classification and "
                         "detection only; a raw model's outputs have no agreed meaning to compare")
    min_agreement = DEFAULT_MIN_AGREEMENT[kind] if min_agreement is None else min_agreement
    max_score_delta = DEFAULT_MAX_SCORE_DELTA[kind] if max_score_delta is None else max_score_delta

    inputs = ModelInputs(src)
    tensors = [inputs(f, fmt) for f, fmt in frames[:calibration]]
    say(f"calibrating on {calibration} frames{source_note} (static INT8, QDQ, "
        f"{'per-channel' if opts.per_channel else 'per-tensor'} weights"
        f"{', 7-bit weights (reduce_range)' if opts.reduce_range else ''}, MinMax)")
    try:
        q = quantize_graph(src.bundle.model_bytes, src.meta.input.name, tensors, opts)
    except Exception as e:  # ORT's quantizer raises whatever it meets: one line, the reason
        raise BundleError(f"{bundle}/model.onnx: onnxruntime.quantization failed: {type(e).__name__}: {e}") from None

    record = {"method": "static-int8-qdq", "activations": "uint8", "weights": "int8",
              "per_channel": opts.per_channel, "reduce_range": opts.reduce_range, "calibration": "minmax",
              "calibration_frames": calibration, "held_out_frames": len(held),
              "source_version": src.meta.version, "source_sha256": src.bundle.sha256,
              "onnxruntime": onnxruntime.__version__}
    # The gate: both models fused and decoded as the daemon runs them, on frames not used for calibration.
    provisional = int8_meta(src.meta, name, version, {**record, "metric": "top1", "agreement": 0.0,
                                                      "max_score_delta": 0.0})
    int8 = in_memory(provisional, q, f"{out} (not written)")
    sizes = [(f.shape[1], f.shape[0]) for f, _ in held]
    a = agreement(src.decoder, run_model(src, held), run_model(int8, held), sizes)
    what = "top-1 agreement" if a.metric == "top1" else f"boxes matched at IoU >= {IOU_MATCH} (same class)"
    over = f" (over {a.pairs} matched pairs)" if a.metric != "top1" else ""
    say(f"held-out frames: {a.frames}; {what}: {a.agreement:.4f} ({a.compared} compared); "
        f"max score delta: {a.max_score_delta:.4f}{over}")
    if a.agreement < min_agreement or a.max_score_delta > max_score_delta:
        raise QuantizationRefused(
            f"INT8 model refused, no bundle written: {what} {a.agreement:.4f} (minimum {min_agreement:g}), max "
            f"score delta {a.max_score_delta:.4f}{over} (maximum {max_score_delta:g}) on {a.frames} held-out frames; "
            "calibrate on more (or more typical) frames, or keep the FP32 model")
    meta = int8_meta(src.meta, name, version, {**record, "metric": a.metric, "agreement": round(a.agreement, 6),
                                               "max_score_delta": round(a.max_score_delta, 6),
                                               "min_agreement": min_agreement,
                                               "max_score_delta_allowed": max_score_delta})
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.quantize-", dir=parent)
    try:
        os.chmod(tmp, 0o755)  # a bundle the daemon's user can read, like one written by `model bundle`
        with open(os.path.join(tmp, MODEL_FILE), "wb") as f:
            f.write(q)
        write_meta(os.path.join(tmp, META_FILE), meta, bundle)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish_bundle(tmp, out, key, trust_dir)
    return meta
