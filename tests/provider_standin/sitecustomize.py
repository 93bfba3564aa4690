"""A stand-in for OpenVINO's CPU device, on hosts where the real one cannot serve: ONNX Runtime's OpenVINO plugin
offers its devices only on Intel hardware (it lists none on an AMD CPU). With this directory first on PYTHONPATH, a
process (the daemon, and its lanes, forked after this ran) builds an `openvino` model's sessions on ONNX Runtime's
CPU provider and takes them for OpenVINO's. A mock, said so by the tests that use it
(tests/integration/test_provider_faults.py): what they test is edgeinfer's side of a provider, whose runs they
make fail on purpose (runtime.fault_provider); a host whose OpenVINO plugin has a CPU device runs them on the
real one instead."""
from edgeinfer.models import providers as _p

_check, _session_options, _serves_on, _load = _p.check, _p.session_options, _p.serves_on, _p.load


def _standin(spec) -> bool:
    return spec.name == _p.OPENVINO and spec.device == "CPU"


def _load_standin(spec) -> None:
    if spec.name == _p.OPENVINO:  # "registered" in this process, as the real load would (providers.ready: lanes load first)
        _p._registered[_p.OPENVINO] = "OpenVINOExecutionProvider"
    else:
        _load(spec)


_p.load = _load_standin
_p.check = lambda spec: None if _standin(spec) else _check(spec)
_p.session_options = lambda spec, so, threads: ({"providers": ["CPUExecutionProvider"]} if _standin(spec)
                                                 else _session_options(spec, so, threads))
_p.serves_on = lambda session, spec: True if _standin(spec) else _serves_on(session, spec)
print("edgeinfer test: OpenVINO's CPU device is a stand-in in this process (tests/provider_standin)",
      file=__import__("sys").stderr, flush=True)
