"""Execution providers (models.NAME.provider): the real daemon serving real models on ONNX Runtime's OpenVINO
plugin EP (`onnxruntime-ep-openvino`, on its CPU device: the device this machine has), its lanes under their
seccomp filter; a provider that cannot serve here leaves its model on the CPU provider, loudly, and touches no
other model. Nothing is mocked: the devices that are not here (an NPU) are the failure."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon_helpers import daemon_log, edgeinferd_args, start_daemon, stop_daemon, write_config
from edgeinfer.cameras.synthetic import make_frames
from edgeinfer.models import providers
from test_daemon import class_scores, detector_floor, feed_and_collect, reference

OPENVINO_MISSING = providers.check(providers.ProviderSpec("openvino", "CPU"))
CUDA_MISSING = providers.check(providers.ProviderSpec("cuda", "0"))
needs_openvino = pytest.mark.skipif(OPENVINO_MISSING is not None,
                                    reason=f"OpenVINO's EP cannot run here: {OPENVINO_MISSING}")

# OpenVINO's CPU plugin at FP32 (the default edgeinfer sets) against ONNX Runtime's CPU provider on the unfused
# model: other kernels, other summation orders. Measured here: |Δ| ≤ 3e-6 on the detector's raw outputs, 2e-7 on
# the classifier's scores; the bounds leave room for other CPUs' kernels and stay far below what bf16 gives
# (0.008 on the scores, 0.026 on the boxes' raw outputs), which they must catch.
SCORE_ATOL = 1e-4
BOX_RTOL, BOX_ATOL = 1e-4, 1e-2  # boxes in pixels, as test_daemon's CPU rows compare them


def _samples(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _healthz(proc) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(proc.metrics_url + "/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _metrics(proc) -> dict:
    return _samples(proc.metrics_url + "/metrics")  # the daemon prints its listener's base URL


def _two_models(bundles, tmp_path, stream, orientation: str, detector: str):
    """A configuration of the classifier and the detector, a stream each, on these providers: (config, bundle
    paths, stream names, --check-config's run)."""
    ori, det = bundles("orientation"), bundles("detector")
    names = {"orientation": f"{stream}-o", "detector": f"{stream}-d"}
    cfg = write_config(tmp_path, None, [
        {"name": names["orientation"], "model": "orientation", "width": 224, "height": 224, "max_age_ms": 60000},
        {"name": names["detector"], "model": "detector", "width": 416, "height": 416, "max_age_ms": 60000}],
        models={"orientation": {"bundle": ori, "provider": orientation},
                "detector": {"bundle": det, "provider": detector}})
    check = subprocess.run(edgeinferd_args(cfg, "--check-config"), capture_output=True, text=True, timeout=60)
    return cfg, (ori, det), names, check


@needs_openvino
def test_openvino_serves_the_classifier_and_the_detector_as_the_cpu_does(bundles, children, tmp_path, stream):
    """Both models on `provider: openvino:CPU` in one daemon: every result equals plain ONNX Runtime's CPU
    provider on the unfused model within the stated tolerance, and /metrics says the lanes serve on OpenVINO
    (no fallback: a silent one would pass the comparison)."""
    cfg, (ori, det), names, check = _two_models(bundles, tmp_path, stream, "openvino:CPU", "openvino:CPU")
    assert check.returncode == 0, check.stderr
    proc = start_daemon(children, cfg)
    m = _metrics(proc)
    for model in ("orientation", "detector"):
        key = ("edgeinfer_model_provider", (("configured", "openvino:CPU"), ("model", model),
                                            ("serving", "openvino:CPU")))
        assert m.get(key, 0) >= 1, {k: v for k, v in m.items() if k[0].startswith("edgeinfer_model_provider")}
        assert m[("edgeinfer_model_provider_fallback", (("configured", "openvino:CPU"), ("model", model)))] == 0

    _, run = reference(ori)
    pool = [f for f, _ in make_frames(224, 224, pages=6)]
    refs = [run(f)[0].reshape(-1) for f in pool]
    worst = 0.0
    for idx, rec in feed_and_collect(proc, names["orientation"], pool, 60):
        got = class_scores(rec)
        worst = max(worst, float(np.abs(got - refs[idx]).max()))
        assert int(np.argmax(got)) == int(np.argmax(refs[idx]))
    assert worst <= SCORE_ATOL, f"classifier scores differ from the CPU provider's by {worst}"

    pool_d, refs_d = detector_floor(det)
    total = 0
    for idx, rec in feed_and_collect(proc, names["detector"], pool_d, 8):
        got = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 6)
        assert got.shape == refs_d[idx].shape
        np.testing.assert_allclose(got, refs_d[idx], rtol=BOX_RTOL, atol=BOX_ATOL)
        total += rec.item_count
    assert total > 0, "the comparison needs frames with detections"
    status, body = _healthz(proc)
    assert status == 200 and body["provider_fallback"] == {}, body
    assert stop_daemon(proc) == 0


@needs_openvino
def test_a_device_that_is_not_here_leaves_its_model_on_the_cpu_loudly(bundles, children, tmp_path, stream):
    """`provider: openvino:NPU` on a host without an NPU: --check-config refuses it (exit 2, naming the model,
    the device and what the host has); a start serves that model on the CPU provider, results exact, and says
    so in the log, /healthz (200, degraded: `provider_fallback`), STATUS='s source (the stats) and
    edgeinfer_model_provider_fallback; the other model, on OpenVINO's CPU device, is untouched."""
    if "NPU" in providers.openvino_devices():
        pytest.skip("this host has an NPU: the row needs a device that is not there")
    cfg, (ori, det), names, check = _two_models(bundles, tmp_path, stream, "openvino:NPU", "openvino:CPU")
    assert check.returncode == 2, (check.stdout, check.stderr)
    assert "models.orientation.provider: openvino:NPU cannot serve on this host" in check.stderr
    assert "no NPU device" in check.stderr and "detector" not in check.stderr

    stats = str(tmp_path / "stats.json")
    proc = start_daemon(children, cfg, stats_file=stats)
    m = _metrics(proc)
    assert m[("edgeinfer_model_provider_fallback", (("configured", "openvino:NPU"), ("model", "orientation")))] >= 1
    assert m[("edgeinfer_model_provider", (("configured", "openvino:NPU"), ("model", "orientation"),
                                           ("serving", "cpu")))] >= 1
    assert m[("edgeinfer_model_provider_fallback", (("configured", "openvino:CPU"), ("model", "detector")))] == 0
    status, body = _healthz(proc)
    assert status == 200, body
    fb = body["provider_fallback"]
    assert set(fb) == {"orientation"} and fb["orientation"]["configured"] == "openvino:NPU", fb
    assert "no NPU device" in fb["orientation"]["reason"]

    _, run = reference(ori)
    pool = [f for f, _ in make_frames(224, 224, pages=4)]
    refs = [run(f)[0].reshape(-1) for f in pool]
    for idx, rec in feed_and_collect(proc, names["orientation"], pool, 20):
        np.testing.assert_allclose(class_scores(rec), refs[idx], atol=1e-5)  # the CPU provider: exact
    pool_d, refs_d = detector_floor(det)
    for idx, rec in feed_and_collect(proc, names["detector"], pool_d, 4):
        got = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 6)
        np.testing.assert_allclose(got, refs_d[idx], rtol=BOX_RTOL, atol=BOX_ATOL)
    assert stop_daemon(proc) == 0
    log = daemon_log(proc)
    assert "model orientation on lane0" in log and "serving on the CPU provider instead" in log, log[-3000:]
    final = json.load(open(stats))
    assert final["models"]["orientation"]["provider_fallback"]["configured"] == "openvino:NPU"
    assert final["models"]["detector"]["provider_fallback"] is None


@needs_openvino
def test_a_model_its_provider_cannot_compile_moves_to_the_cpu_when_its_camera_comes(bundles, children, tmp_path,
                                                                                     stream):
    """A stream whose geometry comes with its camera (no width/height configured): its session is built when the
    camera attaches, and OpenVINO refuses to compile it (an option value it does not take: the injected failure).
    That lane says so then (ProviderFallback), the model serves on the CPU provider, results exact, and the
    metric, /healthz and the log say it."""
    cfg = write_config(tmp_path, None, [{"name": stream, "model": "orientation", "max_age_ms": 60000}],
                       models={"orientation": {"bundle": bundles("orientation"), "provider": {
                           "name": "openvino", "device": "CPU", "options": {"INFERENCE_PRECISION_HINT": "bogus"}}}})
    proc = start_daemon(children, cfg)
    key = ("edgeinfer_model_provider_fallback", (("configured", "openvino:CPU"), ("model", "orientation")))
    assert _metrics(proc)[key] == 0  # nothing compiled yet: no session before a camera
    _, run = reference(bundles("orientation"))
    pool = [f for f, _ in make_frames(224, 224, pages=3)]
    refs = [run(f)[0].reshape(-1) for f in pool]
    for idx, rec in feed_and_collect(proc, stream, pool, 6):
        np.testing.assert_allclose(class_scores(rec), refs[idx], atol=1e-5)
    assert _metrics(proc)[key] >= 1  # the lanes that built a session for its geometry
    status, body = _healthz(proc)
    assert status == 200 and "could not compile the model" in body["provider_fallback"]["orientation"]["reason"]
    assert stop_daemon(proc) == 0
    log = daemon_log(proc)
    # whichever lane took the camera's ring first built its session there (both lanes hold the model)
    assert re.search(r"model orientation on lane[01]: openvino:CPU: openvino:CPU could not compile the model", log), \
        log[-3000:]


@needs_openvino
def test_check_config_names_a_provider_package_that_is_not_installed(bundles, tmp_path, stream):
    """The OpenVINO package missing (its import fails, as on a host without it: a module of that name that
    raises ImportError shadows the installed one; the only stand-in here, said so): --check-config says which
    package to install, exit 2."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "onnxruntime_ep_openvino.py").write_text("raise ImportError('No module named onnxruntime_ep_openvino')\n")
    cfg = write_config(tmp_path, None, [{"name": stream, "model": "orientation", "width": 224, "height": 224}],
                       models={"orientation": {"bundle": bundles("orientation"), "provider": "openvino:CPU"}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), *sys.path])}
    check = subprocess.run(edgeinferd_args(cfg, "--check-config"), capture_output=True, text=True, timeout=60,
                           env=env)
    assert check.returncode == 2, (check.stdout, check.stderr)
    assert "the OpenVINO execution provider is not installed" in check.stderr
    assert "onnxruntime-ep-openvino" in check.stderr


@pytest.mark.skipif(CUDA_MISSING is not None, reason=f"no CUDA here: {CUDA_MISSING}")
def test_cuda_serves_the_classifier_as_the_cpu_does():
    """Where onnxruntime-gpu and an NVIDIA GPU are (this project's machines have neither: it skips, saying so):
    the classifier's fused session on `cuda:0` answers as the CPU provider's does on the same frames, without
    falling back (operator mismatches on the accelerator are what it catches)."""
    from daemon_helpers import bundle
    from edgeinfer.models.bundle import load_unverified_bundle
    from edgeinfer.models.runtime import ModelRuntime
    frames = [f[None] for f, _ in make_frames(224, 224, pages=4)]
    on = {}
    for spec in (providers.CPU_SPEC, providers.ProviderSpec("cuda", "0")):
        model = ModelRuntime(load_unverified_bundle(bundle("orientation")), warmup_runs=1, provider=spec)
        sess = model.session_for("bgr24", 224, 224)
        assert model.sessions.fallback is None, model.sessions.fallback
        on[spec.label] = [sess.run(f)[0] for f in frames]
    for a, b in zip(on["cpu"], on["cuda:0"]):
        np.testing.assert_allclose(b, a, atol=SCORE_ATOL * 10)  # TF32/cuDNN kernels: a looser bound, stated
