"""Execution providers: which ONNX Runtime provider (and device) a model's sessions run on, whether this host
has it, and the session options that put a session on it.

`models.NAME.provider` in the configuration (config/sections.py) becomes a `ProviderSpec`:
  cpu               ONNX Runtime's own CPU provider (the default; always there)
  openvino:DEVICE   the OpenVINO plugin EP (`onnxruntime-ep-openvino`, loaded with
                    `register_execution_provider_library`); DEVICE: CPU, GPU, NPU or AUTO, picked among the devices
                    `get_ep_devices()` enumerates (the EP's own `device_type` option is ignored by the plugin)
  cuda, tensorrt    in-box providers of an `onnxruntime-gpu` build (CUDAExecutionProvider,
                    TensorrtExecutionProvider), on device_id DEVICE (default 0)

Nothing of a provider is loaded until a model asks for it (`load`): a daemon whose models are all on the CPU never
imports the OpenVINO package nor maps its libraries. A lane loads its models' providers before its seccomp filter
(the plugin stats its own files while it registers, which the filter refuses), and a lane whose provider compiles
kernels at run time (`jit`: OpenVINO's CPU plugin maps its code read+write+execute) gets a filter that lets it
(native/harden.h, docs/decisions/0038-execution-providers.md).

`check(spec)` says why a provider cannot serve on this host (None: it can); `--check-config` refuses such a
configuration, and a start serves that model on the CPU provider instead, loudly (SessionSet.add).
ONNX Runtime is imported by the functions that use it: the configuration's schema names this module, and loading
a configuration (the gateway, the bridge, --check-config of an all-CPU file) imports no ONNX Runtime.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import json
import mmap
from typing import TYPE_CHECKING

from edgeinfer.support.cpuflags import cpuinfo_field

if TYPE_CHECKING:
    import onnxruntime as ort

CPU = "cpu"
OPENVINO = "openvino"
NAMES = (CPU, OPENVINO, "cuda", "tensorrt")
OPENVINO_DEVICES = ("CPU", "GPU", "NPU", "AUTO")
OPENVINO_PACKAGE = "onnxruntime-ep-openvino"
INBOX = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}  # onnxruntime-gpu's
PLUGINS = {OPENVINO}  # providers loaded as plugin libraries (load: before a lane's sandbox)
JIT = {OPENVINO}  # providers whose kernels are compiled into write+execute memory at run time
EXACT = {"INFERENCE_PRECISION_HINT": "f32"}  # OpenVINO's CPU and GPU devices compute as the model says


class ProviderError(Exception):
    """A provider that cannot serve here: its package, its device, or what the sandbox allows."""


@dataclasses.dataclass(frozen=True)
class ProviderSpec:
    """A provider, its device and options, as the configuration names them (hashable: a lane's sessions key)."""
    name: str = CPU
    device: str = ""                       # openvino: CPU/GPU/NPU/AUTO; cuda/tensorrt: the device id; cpu: ""
    options: tuple[tuple[str, str], ...] = ()  # openvino: the device's properties; others: provider options

    @property
    def label(self) -> str:
        """How it is said: `cpu`, `openvino:GPU`, `cuda:0` (metrics, logs, status)."""
        return self.name if not self.device else f"{self.name}:{self.device}"

    @property
    def said(self) -> str:
        """The label with its options, `openvino:GPU (INFERENCE_PRECISION_HINT=f16)`: what a rollout is of, and
        what a rollback refuses (the same device at another precision is another candidate)."""
        return self.label + (f" ({', '.join(f'{k}={v}' for k, v in self.options)})" if self.options else "")

    @property
    def jit(self) -> bool:
        """Its kernels are compiled at run time into memory that is written, then executed."""
        return self.name in JIT

    @property
    def is_cpu(self) -> bool:
        return self.name == CPU


CPU_SPEC = ProviderSpec()


def to_record(spec: ProviderSpec) -> dict:
    """`spec` as a known-good entry keeps it: {"provider": ...}, or nothing for the CPU, so that a CPU model's
    record stays byte for byte what 0.2.0 wrote (an upgrade leaves the file as it was)."""
    if spec.is_cpu:
        return {}
    return {"provider": {"name": spec.name, "device": spec.device, "options": [list(kv) for kv in spec.options]}}


def from_record(entry: dict) -> ProviderSpec | None:
    """The provider a known-good entry names: the CPU where it names none (to_record's CPU, and every record from
    before providers: those served on the CPU); None if its provider field is damaged."""
    if "provider" not in entry:
        return CPU_SPEC
    data = entry["provider"]
    try:
        spec = ProviderSpec(data["name"], data["device"], tuple(sorted((str(k), str(v)) for k, v in data["options"])))
    except (TypeError, KeyError, ValueError):
        return None
    return spec if spec.name in NAMES and isinstance(spec.device, str) else None


_registered: dict[str, str] = {}  # provider name → the EP name registered in this process
_failed: dict[str, str] = {}      # provider name → why it could not be registered in this process


def _openvino():
    try:
        import onnxruntime_ep_openvino as ov
    except ImportError as e:
        raise ProviderError(f"the OpenVINO execution provider is not installed on this host ({e}): install "
                            f"{OPENVINO_PACKAGE} (docs/operations/providers.md)") from None
    return ov


def load(spec: ProviderSpec) -> None:
    """The provider's library registered with ONNX Runtime in this process (once); ProviderError if it cannot be."""
    import onnxruntime as ort
    if spec.name != OPENVINO or OPENVINO in _registered:
        return
    cpu_vendor()  # for check's message, read while files may be read
    if OPENVINO in _failed:  # never tried twice: in a lane, a second try would run under its seccomp filter
        raise ProviderError(_failed[OPENVINO])
    try:
        ov = _openvino()
        name = ov.get_ep_name()
        try:
            ort.register_execution_provider_library(name, ov.get_library_path())
        except Exception as e:
            if "already registered" not in str(e):
                raise ProviderError(f"ONNX Runtime could not load the OpenVINO execution provider "
                                    f"({ov.get_library_path()}): {e}") from None
    except ProviderError as e:
        _failed[OPENVINO] = str(e)
        raise
    _registered[OPENVINO] = name


def ready(spec: ProviderSpec) -> bool:
    """Whether `spec` needs nothing loaded into this process any more (a lane loads only before its sandbox)."""
    return spec.name != OPENVINO or OPENVINO in _registered or OPENVINO in _failed


def _ep_devices(meta: bool = False) -> list:
    """The OpenVINO EP's devices as ONNX Runtime enumerates them: its real devices, or (meta) its meta-devices
    (AUTO). The EP must be loaded."""
    import onnxruntime as ort
    name = _registered[OPENVINO]
    return [d for d in ort.get_ep_devices()
            if d.ep_name.split(".")[0] == name and ("ov_meta_device" in d.ep_metadata) == meta]


def _openvino_devices(spec: ProviderSpec) -> list:
    """The EP devices that are `spec.device` (AUTO: OpenVINO's meta-device over what it finds)."""
    if spec.device == "AUTO":
        return [d for d in _ep_devices(meta=True) if d.ep_metadata.get("ov_meta_device") == "AUTO"][:1]
    return [d for d in _ep_devices() if d.ep_metadata.get("ov_device") == spec.device]


def openvino_devices() -> list[str]:
    """The devices the OpenVINO EP enumerates on this host (CPU, GPU, GPU.1, NPU, ...); loads it."""
    load(ProviderSpec(OPENVINO, "CPU"))
    return sorted({d.ep_metadata.get("ov_device", "") for d in _ep_devices()} - {""})


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor as the kernel says it (GenuineIntel, AuthenticAMD, ...); "" if it does not. Read once,
    by `load` (a lane reads no file under its seccomp filter)."""
    return cpuinfo_field("vendor_id")


def write_execute_allowed() -> bool:
    """Whether this process may map memory written and then executed: not under systemd's
    MemoryDenyWriteExecute=yes (a seccomp filter: the mapping fails with EPERM), nor a lane's filter without jit."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = mmap.PAGESIZE
    page = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if page in (None, ctypes.c_void_p(-1).value):
        return False
    try:  # as OpenVINO's code buffers are made: written, then read+write+execute
        return libc.mprotect(page, size, mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC) == 0
    finally:
        libc.munmap(page, size)


def check(spec: ProviderSpec) -> str | None:
    """Why `spec` cannot serve in this process on this host; None: it can (its library is then loaded)."""
    import onnxruntime as ort
    if spec.is_cpu:
        return None
    if spec.name in INBOX:
        have = ort.get_available_providers()
        if INBOX[spec.name] not in have:
            return (f"{INBOX[spec.name]} is not in this ONNX Runtime build (it has {', '.join(have)}): it comes "
                    f"with onnxruntime-gpu and an NVIDIA driver")
        return None
    try:
        load(spec)
    except ProviderError as e:
        return str(e)
    if not _openvino_devices(spec):
        vendor = cpu_vendor()
        if spec.device in ("CPU", "AUTO") and vendor != "GenuineIntel":
            return (f"OpenVINO finds no {spec.device} device on this host: its ONNX Runtime plugin offers devices on "
                    f"Intel hardware only, and this CPU is {vendor or 'of an unknown vendor'} "
                    f"(docs/operations/providers.md)")
        return (f"OpenVINO finds no {spec.device} device on this host (it has: "
                f"{', '.join(openvino_devices()) or 'none'}; a GPU or NPU needs its driver and the service's access "
                f"to /dev/dri or /dev/accel: docs/operations/providers.md)")
    if spec.jit and not write_execute_allowed():
        return ("OpenVINO compiles its kernels at run time into write+execute memory, which this process may not map "
                "(systemd's MemoryDenyWriteExecute=yes): the drop-in in docs/operations/providers.md lifts it")
    return None


def session_options(spec: ProviderSpec, so: ort.SessionOptions, threads: int) -> dict:
    """Puts `spec` on the session options `so` (sized for `threads` intra-op threads); returns the keyword
    arguments of InferenceSession (`providers=` for in-box ones). ProviderError if it cannot serve here."""
    if spec.is_cpu:
        return {"providers": ["CPUExecutionProvider"]}
    why = check(spec)
    if why:
        raise ProviderError(why)
    if spec.name in INBOX:
        options = {"device_id": spec.device or "0", **dict(spec.options)}
        return {"providers": [(INBOX[spec.name], options), "CPUExecutionProvider"]}
    # OpenVINO's own threads sized like ORT's (a lane's CPUs), its cache and properties per device: load_config
    # (the plugin ignores num_of_threads and cache_dir as provider options)
    # FP32 unless the operator asks otherwise: OpenVINO's CPU plugin runs bf16 by default where the CPU has AMX
    # (|Δ| 0.008 on the classifier's scores, 0.026 on the detector's, here) and its GPU plugin f16; a precision
    # is the operator's choice, never a side effect of the provider (NPU: f16 is all it has)
    config: dict[str, dict[str, str]] = {"CPU": {"INFERENCE_NUM_THREADS": str(threads), **EXACT}}  # AUTO's too
    if spec.device == "GPU":
        config["GPU"] = dict(EXACT)
    config.setdefault(spec.device, {}).update(dict(spec.options))
    so.add_provider_for_devices(_openvino_devices(spec), {"load_config": json.dumps(config)})
    return {}


def serves_on(session: ort.InferenceSession, spec: ProviderSpec) -> bool:
    """Whether a session built for `spec` took it (ORT puts what a provider refuses on the CPU)."""
    if spec.is_cpu:
        return True
    want = INBOX.get(spec.name) or _registered.get(OPENVINO, "")
    return want in session.get_providers()


def host_listing() -> list[tuple[str, str]]:
    """(provider label, what this host says of it) for every provider edgeinfer knows: `edgeinferctl model bench
    --providers`."""
    import onnxruntime as ort
    rows = [(CPU, "available (ONNX Runtime " + ort.__version__ + ")")]
    try:
        load(ProviderSpec(OPENVINO, "CPU"))
        have = openvino_devices()
        version = importlib.metadata.version(OPENVINO_PACKAGE)
        for device in OPENVINO_DEVICES:
            why = check(ProviderSpec(OPENVINO, device))
            rows.append((f"{OPENVINO}:{device}", why or f"available ({OPENVINO_PACKAGE} {version}, devices: "
                                                        f"{', '.join(have)})"))
    except ProviderError as e:
        rows.append((OPENVINO, str(e)))
    for name in INBOX:
        rows.append((name, check(ProviderSpec(name, "0")) or "available"))
    return rows
