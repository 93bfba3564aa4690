"""models.NAME.provider: how it is written and refused, what this host is said to have, the write+execute probe
and the lanes' filter with and without `jit` (real seccomp filters, each in a child of its own), and the fallback
of a model's sessions to the CPU provider when its own cannot take it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from edgeinfer.config.sections import ModelEntry, Provider
from edgeinfer.models import providers
from edgeinfer.models.providers import ProviderSpec


@pytest.mark.parametrize("written, spec", [
    ("cpu", ProviderSpec()),
    ("openvino:CPU", ProviderSpec("openvino", "CPU")),
    ("openvino:AUTO", ProviderSpec("openvino", "AUTO")),
    ("cuda", ProviderSpec("cuda", "0")),
    ("tensorrt:1", ProviderSpec("tensorrt", "1")),
    ({"name": "openvino", "device": "GPU", "options": {"PERFORMANCE_HINT": "LATENCY"}},
     ProviderSpec("openvino", "GPU", (("PERFORMANCE_HINT", "LATENCY"),))),
])
def test_a_provider_is_written_short_or_as_a_mapping(written, spec):
    assert Provider.model_validate(written).spec() == spec
    assert ModelEntry(bundle="/b", provider=written).provider.spec() == spec


def test_the_default_is_the_cpu_provider():
    e = ModelEntry(bundle="/b")
    assert e.provider.spec() == providers.CPU_SPEC and e.provider.spec().label == "cpu"
    assert not e.provider.spec().jit


@pytest.mark.parametrize("written, said", [
    ("openvino", "openvino needs its device: one of CPU, GPU, NPU, AUTO"),
    ("openvino:VPU", "openvino needs its device"),
    ("cpu:0", "the cpu provider takes no device"),
    ("cuda:first", "cuda's device is a device id"),
    ("rocm", "Input should be 'cpu', 'openvino', 'cuda' or 'tensorrt'"),
    ({"name": "openvino", "device": "CPU", "options": {"A": "x\ny"}}, "without control characters"),
    ({"name": "openvino", "device": "CPU", "extra": 1}, "Extra inputs are not permitted"),
])
def test_a_provider_that_cannot_be_is_refused_with_what_would_be(written, said):
    with pytest.raises(ValidationError, match=said.replace("(", r"\(").replace(")", r"\)")):
        ModelEntry(bundle="/b", provider=written)


def test_labels_and_jit():
    assert ProviderSpec("openvino", "GPU").label == "openvino:GPU" and ProviderSpec("openvino", "GPU").jit
    assert ProviderSpec("cuda", "0").label == "cuda:0" and not ProviderSpec("cuda", "0").jit


def test_a_rollback_refuses_the_provider_with_its_options_not_another_precision():
    """A candidate rolled back at FP16 leaves the same device at FP32 free to roll out: the rollback record names
    the provider with its options (ProviderSpec.said), and a record from before providers names the CPU."""
    from types import SimpleNamespace
    from edgeinfer.control.rollout import Rollouts
    f16 = ProviderSpec("openvino", "GPU", (("INFERENCE_PRECISION_HINT", "f16"),))
    f32 = ProviderSpec("openvino", "GPU", (("INFERENCE_PRECISION_HINT", "f32"),))
    assert f16.said == "openvino:GPU (INFERENCE_PRECISION_HINT=f16)" and ProviderSpec().said == "cpu"
    book = SimpleNamespace(refused={"det": [{"digest": "d1", "provider": f16.said}, {"digest": "d1"}]})
    model = lambda spec, digest="d1": SimpleNamespace(bundle=SimpleNamespace(digest=digest), provider=spec)
    assert Rollouts.rolled_back(book, "det", model(f16)) is not None
    assert Rollouts.rolled_back(book, "det", model(f32)) is None
    assert Rollouts.rolled_back(book, "det", model(ProviderSpec())) == {"digest": "d1"}  # (before providers)
    assert Rollouts.rolled_back(book, "det", model(f16, "d2")) is None


def test_a_gpu_build_of_onnx_runtime_is_named_where_it_is_missing():
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA: the row is about a build without it")
    why = providers.check(ProviderSpec("cuda", "0"))
    assert why and "CUDAExecutionProvider is not in this ONNX Runtime build" in why and "onnxruntime-gpu" in why
    with pytest.raises(providers.ProviderError, match="CUDAExecutionProvider"):
        import onnxruntime as ort
        providers.session_options(ProviderSpec("cuda", "0"), ort.SessionOptions(), 1)


def _openvino_here() -> str | None:
    return providers.check(ProviderSpec("openvino", "CPU"))


def test_the_host_listing_says_every_provider_and_why():
    rows = dict(providers.host_listing())
    assert rows["cpu"].startswith("available")
    assert {"cuda", "tensorrt"} <= set(rows)
    if _openvino_here() is None:
        assert rows["openvino:CPU"].startswith("available (onnxruntime-ep-openvino ")
        assert set(rows) >= {"openvino:GPU", "openvino:NPU", "openvino:AUTO"}
        if "NPU" not in providers.openvino_devices():
            assert "OpenVINO finds no NPU device on this host" in rows["openvino:NPU"]


def _child(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_write_execute_memory_is_what_the_lane_filter_refuses_unless_jit():
    """The probe `check` uses for a JIT provider, under the lanes' real seccomp filter: refused without jit (as
    systemd's MemoryDenyWriteExecute=yes refuses it), allowed with it."""
    code = """
        from edgeinfer.models import providers
        from edgeinfer.support import sandbox
        before = providers.write_execute_allowed()
        sandbox._harden.install_lane_filter({jit})
        print(before, providers.write_execute_allowed())
    """
    assert _child(code.format(jit="False")) == "True False"
    assert _child(code.format(jit="True")) == "True True"


@pytest.mark.skipif(_openvino_here() is not None, reason=f"OpenVINO's EP cannot run here: {_openvino_here()}")
def test_openvino_under_a_filter_without_jit_is_said_not_run():
    """A JIT provider in a process that may not map write+execute memory: `check` names the unit setting, and no
    session is tried (OpenVINO's CPU plugin would abort the process)."""
    out = _child("""
        from edgeinfer.models import providers
        from edgeinfer.support import sandbox
        providers.load(providers.ProviderSpec("openvino", "CPU"))
        sandbox._harden.install_lane_filter(False)
        print(providers.check(providers.ProviderSpec("openvino", "CPU")))
    """)
    assert "MemoryDenyWriteExecute=yes" in out


@pytest.mark.skipif(_openvino_here() is not None, reason=f"OpenVINO's EP cannot run here: {_openvino_here()}")
def test_a_session_set_falls_back_to_the_cpu_provider_and_says_why(tmp_path):
    """The orientation model's sessions asked of an absent NPU: built on the CPU provider, `fallback` says why,
    and every later geometry follows (one model never runs on two providers by accident)."""
    from edgeinfer.models.bundle import load_unverified_bundle
    from edgeinfer.models.runtime import ModelRuntime
    from daemon_helpers import bundle
    model = ModelRuntime(load_unverified_bundle(bundle("orientation")), warmup_runs=1,
                         provider=ProviderSpec("openvino", "NPU"))
    if "NPU" in providers.openvino_devices():
        pytest.skip("this host has an NPU")
    assert model.sessions.fallback.startswith("openvino:NPU: OpenVINO finds no NPU device")  # said before a session
    s = model.session_for("bgr24", 224, 224)
    assert model.sessions.serving == providers.CPU_SPEC
    assert model.sessions.fallback.startswith("openvino:NPU: OpenVINO finds no NPU device")
    assert s.session.get_providers() == ["CPUExecutionProvider"]
    model.session_for("bgr24", 240, 320)
    assert model.sessions.serving == providers.CPU_SPEC

    on_cpu_device = ModelRuntime(load_unverified_bundle(bundle("orientation")), warmup_runs=1,
                                 provider=ProviderSpec("openvino", "CPU"))
    s = on_cpu_device.session_for("bgr24", 224, 224)
    assert on_cpu_device.sessions.fallback is None
    assert s.session.get_providers()[0] == "OpenVINOExecutionProvider"


def test_the_provider_fault_hook_needs_fault_injection():
    """runtime.fault_provider is a test hook: refused without runtime.fault_injection, and only its four kinds."""
    from edgeinfer.config.sections import RuntimeConfig
    with pytest.raises(ValidationError, match="needs fault_injection: true"):
        RuntimeConfig(fault_provider={"det": "raise"})
    with pytest.raises(ValidationError):
        RuntimeConfig(fault_injection=True, fault_provider={"det": "explode"})
    assert RuntimeConfig(fault_injection=True, fault_provider={"det": "stuck"}).fault_provider == {"det": "stuck"}


def test_a_lane_says_a_hung_provider_with_a_checked_flag():
    """ProviderFallback.restart is a real bool on the wire: a lane's 1 or "yes" is a protocol error (a lane is not
    trusted further than the protocol), and a Stage names why a model is to be staged on the CPU provider."""
    from edgeinfer.lanes.protocol import FROM_LANE, TO_LANE, ProtocolError, ProviderFallback, Stage, decode, encode
    msg = ProviderFallback("det", "cpu", "openvino:GPU: a run did not end", True)
    assert decode(encode(msg), FROM_LANE) == msg
    assert decode(encode(ProviderFallback("det", "cpu", "why")), FROM_LANE).restart is False
    for bad in (1, "yes", None):
        with pytest.raises(ProtocolError):
            decode(b'["ProviderFallback","det","cpu","why",' + json.dumps(bad).encode() + b"]", FROM_LANE)
    assert decode(encode(Stage("det", "hung")), TO_LANE) == Stage("det", "hung")
    from edgeinfer.lanes.protocol import CandidateHung
    said = CandidateHung("det", "openvino:GPU: a run did not end")
    assert decode(encode(said), FROM_LANE) == said
    with pytest.raises(ProtocolError):  # a lane says only what its protocol has, never what it may not
        decode(b'["CandidateHung","det"]', FROM_LANE)
    with pytest.raises(ProtocolError):
        decode(encode(said), TO_LANE)


def test_a_plugin_provider_is_ready_in_a_process_only_once_loaded():
    """A lane may build sessions on a plugin provider only if it loaded it before its sandbox (providers.ready):
    the CPU and in-box providers need nothing loaded."""
    out = _child("""
        from edgeinfer.models import providers as p
        print(p.ready(p.CPU_SPEC), p.ready(p.ProviderSpec("cuda", "0")), p.ready(p.ProviderSpec("openvino", "CPU")))
        try:
            p.load(p.ProviderSpec("openvino", "CPU"))
        except p.ProviderError:
            pass
        print(p.ready(p.ProviderSpec("openvino", "GPU")))
    """)
    assert out.split() == ["True", "True", "False", "True"], out


@pytest.mark.parametrize("deadline_ms, hang_s, grace_s", [(300, 5.0, 0.3), (100, 5.0, 0.25), (1000, 5.0, 1.0),
                                                          (3000, 5.0, 1.5), (6000, 5.0, 0.0)])
def test_a_hung_run_is_said_by_the_lane_before_the_control_plane_kills_it(deadline_ms, hang_s, grace_s):
    """The grace a cancelled provider run gets before the lane holds it hung (and says so, and why) ends before
    runtime.lane_hang_s, when the control plane would kill the lane not knowing why and restart it into the same
    hang: run_deadline_ms 3000 with lane_hang_s 5 gets 1.5 s, not 3 s."""
    from types import SimpleNamespace
    from edgeinfer.lanes.process import Lane
    lane = SimpleNamespace(cfg=SimpleNamespace(runtime=SimpleNamespace(run_deadline_ms=deadline_ms,
                                                                       lane_hang_s=hang_s)))
    assert Lane._hung_grace_ns(lane) == pytest.approx(grace_s * 1e9)
