"""`edgeinferctl model bundle`: write model.yaml for an ONNX file from flags and
the model's own metadata, and copy the model next to it."""
from __future__ import annotations

import os
import shutil
import sys

import onnx
import yaml

from edgeinfer.models.bundle import MODEL_FILE, META_FILE, BundleError, load_unverified_bundle
from edgeinfer.models.runtime import ModelRuntime


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def write_bundle(args) -> str:
    try:
        model = onnx.load(args.onnx, load_external_data=False)
    except Exception as e:
        raise BundleError(f"{args.onnx}: not a readable ONNX model: {e}") from None
    inputs = [i for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer}]
    inp = next((i for i in inputs if i.name == args.input_name), None) if args.input_name else inputs[0]
    if inp is None:
        raise BundleError(f"{args.onnx}: no input named {args.input_name!r} (inputs: {[i.name for i in inputs]})")
    dims = [d.dim_value or None for d in inp.type.tensor_type.shape.dim]
    layout = args.layout or _layout_of(args.onnx, inp.name, dims)
    if args.size:
        w, h = (int(x) for x in args.size.lower().split("x"))
    else:
        hw = dims[2:4] if layout == "nchw" else dims[1:3]
        if len(dims) != 4 or not all(hw):
            raise BundleError(f"{args.onnx}: input {inp.name} has no static size {dims}; pass --size WxH")
        h, w = hw
    labels = args.labels.split(",") if args.labels else []
    if args.labels_from_metadata:
        meta = {p.key: p.value for p in model.metadata_props}
        if args.labels_from_metadata not in meta:
            raise BundleError(f"{args.onnx}: no metadata key {args.labels_from_metadata!r} (keys: {sorted(meta)})")
        labels = meta[args.labels_from_metadata].splitlines()
    decoder = {"type": args.decoder}
    for kv in args.param:
        k, _, v = kv.partition("=")
        decoder[k] = yaml.safe_load(v)
    if args.decoder == "classification" and "softmax" not in decoder:
        decoder["softmax"] = False  # written out, so whoever reads model.yaml sees what the scores are
        op = _producer_of(model, decoder.get("output", 0))
        if op not in ("Softmax", "LogSoftmax", "Sigmoid"):
            print(f"edgeinferctl: note: the classified output is not a softmax's ({op or 'a graph input'}): scores "
                  "are published as the model outputs them (logits); --param softmax=true publishes "
                  "probabilities", file=sys.stderr)
    doc = {
        "name": args.name, **({"family": args.family} if getattr(args, "family", None) else {}),
        "version": args.version,
        "input": {"name": inp.name, "width": w, "height": h, "pixel_format": args.pixel_format, "layout": layout},
        "preprocess": {"scale": args.scale, "mean": _floats(args.mean), "std": _floats(args.std)},
        "decoder": decoder,
        "labels": labels,
    }
    os.makedirs(args.out, exist_ok=True)
    shutil.copyfile(args.onnx, os.path.join(args.out, MODEL_FILE))
    with open(os.path.join(args.out, META_FILE), "w") as f:
        f.write(f"# Written by edgeinferctl model bundle from {os.path.basename(args.onnx)}\n")
        yaml.safe_dump(doc, f, sort_keys=False)
    try:  # the daemon's own model checks (bundlecheck, less the signature: signing comes next)
        ModelRuntime(load_unverified_bundle(args.out))
    except BundleError:
        for name in (MODEL_FILE, META_FILE):  # never leave a bundle the daemon would refuse
            os.unlink(os.path.join(args.out, name))
        raise
    return args.out


def _producer_of(model: onnx.ModelProto, output) -> str | None:
    """The op type of the node that makes graph output `output` (an index or a name), or None."""
    outs = [o.name for o in model.graph.output]
    name = outs[output] if isinstance(output, int) and 0 <= output < len(outs) else output
    return next((n.op_type for n in model.graph.node if name in n.output), None)


def _layout_of(path: str, name: str, dims: list) -> str:
    """NCHW or NHWC from the input's shape, where the channel axis (1 or 3 values) is unambiguous."""
    if len(dims) == 4:
        chw, hwc = dims[1] in (1, 3), dims[3] in (1, 3)
        if chw != hwc:
            return "nchw" if chw else "nhwc"
    raise BundleError(f"{path}: cannot tell the layout of input {name} {dims} (channels first or last?); "
                      "pass --layout nchw or --layout nhwc")
