"""The daemon's configuration, its leaf sections: `model`, `models.NAME`, `lanes[]`, `runtime`, `ingress`, `shm`,
`metrics`, `drift` (schema.py joins them with the streams and pools into `Config`, and loads the file).

Every key is documented in etc/edgeinfer/edgeinferd.yaml with its default; unknown keys are errors.
"""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from edgeinfer.abi import constants
from edgeinfer.models import providers
from edgeinfer.models.bundle import SizeLimits
from edgeinfer.config.identity import group_id, user_id
from edgeinfer.support.strictmodel import StrictModel

SUN_PATH_MAX = 107  # a Unix socket path, without its NUL


def _clean_path(v: str, what: str) -> str:
    """No control characters (a newline in a path is never what an operator meant)."""
    if not v or any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"{what} must be a non-empty path without control characters (newline, tab, NUL)")
    if len(v.encode()) > 4095:
        raise ValueError(f"{what} is longer than PATH_MAX")
    return v


class ModelConfig(StrictModel):
    """Trust and state for every model; `bundle` is the one model of a 0.2 configuration (use `models:`)."""
    bundle: str | None = Field(None, description="directory of the model bundle (model.onnx + model.yaml + model.sig)")
    warmup_runs: int = Field(3, ge=0, le=1000)
    trust_dir: str = "/etc/edgeinfer/trust"   # public keys (PEM) whose signatures are accepted
    state_dir: str = "/var/lib/edgeinfer"     # anti-rollback record (highest accepted version per model)
    watch_interval_s: float = Field(1.0, ge=0)  # reload when the bundle path's target changes (0: off)
    # Size limits of a bundle, checked before any of its files is read (SizeLimits).
    max_model_mib: int = Field(SizeLimits.model >> 20, ge=1, le=1 << 16)      # model.onnx
    max_meta_kib: int = Field(SizeLimits.meta >> 10, ge=1, le=1 << 16)       # model.yaml and model.sig, each
    max_file_mib: int = Field(SizeLimits.other >> 20, ge=1, le=1 << 16)      # each other file
    max_bundle_mib: int = Field(SizeLimits.bundle >> 20, ge=1, le=1 << 17)   # all files together

    @field_validator("bundle", "trust_dir", "state_dir")
    @classmethod
    def _paths(cls, v: str | None, info) -> str | None:
        return v if v is None else _clean_path(v, f"model.{info.field_name}")

    def size_limits(self) -> SizeLimits:
        return SizeLimits(model=self.max_model_mib << 20, meta=self.max_meta_kib << 10,
                          other=self.max_file_mib << 20, bundle=self.max_bundle_mib << 20)


# A model entry's name: also a Prometheus label value and part of log lines.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
LEGACY_MODEL_NAME = "default"  # the name of model.bundle when a configuration has no `models:`


class RolloutWindow(StrictModel):
    """What a rollout measures before it decides: both at least (docs/operations/rollouts.md, "Rollouts")."""
    min_frames: int = Field(200, ge=10, le=10_000_000)   # frames compared (shadow) or served by each version (canary)
    min_seconds: float = Field(60.0, ge=1.0, le=7 * 86400.0)
    # A window not full by then rolls the candidate back (a lane too busy to compare, or cameras gone).
    max_seconds: float = Field(3600.0, ge=1.0, le=30 * 86400.0)

    @model_validator(mode="after")
    def _ordered(self):
        if self.max_seconds < self.min_seconds:
            raise ValueError(f"max_seconds ({self.max_seconds:g}) is shorter than min_seconds ({self.min_seconds:g})")
        return self


class RolloutGates(StrictModel):
    """A candidate is promoted when every gate passes over the window, rolled back when one fails."""
    # Agreement with the serving version (models/agreement.py, the quantize gate's measure): top-1 for
    # classifiers, boxes matched at IoU >= 0.5 for detectors. None: the quantize gate's default for the kind.
    min_agreement: float | None = Field(None, ge=0.0, le=1.0)
    # The median of the paired run-time ratios candidate ÷ serving (both versions on the same frame, same thread,
    # back to back). max_p99_ratio: its name before the ratios were paired, still read.
    max_time_ratio: float = Field(1.25, ge=1.0, le=100.0,
                                  validation_alias=AliasChoices("max_time_ratio", "max_p99_ratio"))
    max_error_rate: float = Field(0.01, ge=0.0, le=1.0)   # candidate runs that failed or were cancelled
    # How sure a decision must be: agreement's Wilson interval and the median ratio's interval at this two-sided
    # confidence; a gate whose interval straddles its bar leaves the window open (up to window.max_seconds).
    confidence: float = Field(0.95, ge=0.5, le=0.9999)


class Rollout(StrictModel):
    """How a new version of this model's bundle is taken into service (docs/operations/rollouts.md, "Rollouts")."""
    policy: Literal["immediate", "shadow", "canary"] = "immediate"
    sample: float = Field(0.1, gt=0.0, le=1.0)   # shadow: share of the serving frames also run by the candidate
    share: float = Field(0.5, gt=0.0, lt=1.0)    # canary: share of the model's streams the candidate serves
    window: RolloutWindow = RolloutWindow()
    gates: RolloutGates = RolloutGates()


class Provider(StrictModel):
    """The execution provider a model's sessions run on (models/providers.py; docs/operations/providers.md).
    Written `cpu`, `openvino:GPU`, `cuda:0`, or as this mapping (with the provider's options)."""
    name: Literal["cpu", "openvino", "cuda", "tensorrt"] = "cpu"
    device: str = ""   # openvino: CPU, GPU, NPU or AUTO (required); cuda, tensorrt: the device id (default 0)
    options: dict[str, str] = Field(default_factory=dict)  # openvino: the device's properties; else EP options

    @model_validator(mode="before")
    @classmethod
    def _short(cls, v):
        if isinstance(v, str):
            name, _, device = v.partition(":")
            return {"name": name, "device": device}
        return v

    @model_validator(mode="after")
    def _device(self):
        if self.name == "cpu" and (self.device or self.options):
            raise ValueError("the cpu provider takes no device and no options")
        if self.name == "openvino" and self.device not in providers.OPENVINO_DEVICES:
            raise ValueError(f"openvino needs its device: one of {', '.join(providers.OPENVINO_DEVICES)} (e.g. "
                             f"provider: openvino:GPU), not {self.device!r}")
        if self.name in ("cuda", "tensorrt") and self.device and not self.device.isdigit():
            raise ValueError(f"{self.name}'s device is a device id (0, 1, ...), not {self.device!r}")
        for k, v in self.options.items():
            if not k or any(ord(c) < 32 for c in k + v):
                raise ValueError("a provider option's name and value are non-empty text without control characters")
        return self

    def spec(self) -> providers.ProviderSpec:
        device = self.device or ("0" if self.name in ("cuda", "tensorrt") else "")
        return providers.ProviderSpec(self.name, device, tuple(sorted(self.options.items())))


class ModelEntry(StrictModel):
    """One model the daemon serves: its bundle and how each lane runs it."""
    bundle: str = Field(description="directory of the model bundle (model.onnx + model.yaml + model.sig)")
    ort_threads: int = Field(1, ge=1, le=256)  # intra-op threads per lane for this model, the lane's loop included
    batch: int = Field(1, ge=1, le=64)         # ready frames of one geometry a lane runs as one batch (1: none)
    provider: Provider = Provider()            # cpu: ONNX Runtime's CPU provider; openvino:DEVICE, cuda, tensorrt
    rollout: Rollout = Rollout()               # immediate: a verified new version serves every stream at once

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, v: str) -> str:
        return _clean_path(v, "bundle")


class LaneConfig(StrictModel):
    """An inference loop in its own process, pinned to `cpus`, serving `models` (default: all)."""
    cpus: list[int] = Field(min_length=1)
    models: list[str] | None = None

    @field_validator("cpus")
    @classmethod
    def _available(cls, cpus: list[int]) -> list[int]:
        return _cpus_available(cpus)


def _cpus_available(cpus: list[int]) -> list[int]:
    available = os.sched_getaffinity(0)
    bad = [c for c in cpus if c not in available]
    if bad:
        raise ValueError(f"CPUs {bad} are not available to this process (have {sorted(available)})")
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"CPUs listed twice: {cpus}")
    return cpus


class RuntimeConfig(StrictModel):
    loop_cpus: list[int] = Field(default_factory=list)   # empty: the process's CPUs
    ort_threads: int = Field(1, ge=1, le=256)             # intra-op threads, the loop thread included
    ort_cpus: list[int] = Field(default_factory=list)     # CPUs for the extra ORT threads
    scheduling: Literal["fifo", "rr", "other"] = "fifo"
    priority: int = Field(50, ge=1, le=99)
    duty_ceiling: float = Field(0.9, gt=0.0, le=1.0)
    spin_us: int = Field(0, ge=0, le=100000)
    run_deadline_ms: float = Field(1000.0, gt=0)  # a single inference running longer is cancelled
    status_interval_s: float = Field(5.0, gt=0)   # how often STATUS= is sent to systemd
    fault_injection: bool = False  # test-only hooks (SIGUSR1 stalls the loop); never enable in production
    # test only, with fault_injection: {model: raise|hang|stuck|drift}: how its provider's runs fail once warmed up
    fault_provider: dict[str, Literal["raise", "hang", "stuck", "drift"]] = Field(default_factory=dict)
    idle_timeout_ms: int = Field(100, ge=1, le=10000)
    max_sessions: int = Field(8, ge=1, le=256)        # model sessions (one per frame geometry) kept, LRU
    geometry_changes: int = Field(4, ge=1, le=1000)   # geometry changes a stream may make per window...
    geometry_window_s: float = Field(60.0, gt=0)      # ...before it is refused for geometry_cooldown_s
    geometry_cooldown_s: float = Field(60.0, ge=0)
    handovers: int = Field(30, ge=1, le=100000)  # rings a stream may be handed per geometry_window_s (any ring,
    #                                              the same one again included); beyond, refused for the cooldown

    lane_user: str | None = None  # who lanes run as when edgeinferd starts as root (default: edgeinfer, else nobody)
    lane_hang_s: float = Field(5.0, gt=0)  # a lane making no progress this long is killed and restarted
    lane_restarts: int = Field(5, ge=0, le=1000)  # restarts of one lane per lane_restart_window_s before the
    lane_restart_window_s: float = Field(60.0, gt=0)  # watchdog stops being fed (systemd restarts the daemon)

    @field_validator("loop_cpus", "ort_cpus")
    @classmethod
    def _available(cls, cpus: list[int]) -> list[int]:
        return _cpus_available(cpus)

    @field_validator("lane_user")
    @classmethod
    def _lane_user(cls, user: str | None) -> str | None:
        if user is not None and user_id(user) == 0:  # user_id: "no such user" for a typo
            raise ValueError(f"{user!r} is root: lanes never run as root")
        return user

    @model_validator(mode="after")
    def _cpus(self):
        if self.fault_provider and not self.fault_injection:
            raise ValueError("fault_provider is a test hook: it needs fault_injection: true")
        if self.ort_cpus and len(self.ort_cpus) < self.ort_threads - 1:
            raise ValueError(f"ort_cpus lists {len(self.ort_cpus)} CPUs for {self.ort_threads - 1} extra ORT threads")
        return self


class IngressConfig(StrictModel):
    socket: str = constants.INGRESS_SOCKET           # where cameras hand over their rings
    results_socket: str = constants.RESULTS_SOCKET   # where readers ask for result rings
    socket_group: str | int | None = None       # group of sockets the daemon binds itself (default: its own)
    handshake_timeout_ms: int = Field(1000, ge=10, le=60000)  # a client silent this long after connecting is dropped
    # Caps per party: a uid of the host's user database or named in this file, or else every other uid (a user
    # namespace's subordinate uids) as one party (docs/abi.md, "Who is a party").
    max_pending: int = Field(16, ge=1, le=1024)   # connections in their handshake, per socket; more are refused
    max_pending_per_user: int = Field(2, ge=1, le=1024)  # ...and per party (named producers/readers: one more)
    max_readers: int = Field(256, ge=1, le=4096)  # reader connections held at once (a stream's first 4 pass)
    max_readers_per_stream: int = Field(64, ge=1, le=4096)  # ...on one stream
    max_readers_per_user: int = Field(32, ge=1, le=4096)  # ...and by one party
    reader_idle_s: float = Field(60.0, gt=0, le=86400)  # a reader connection held this long gives way to a new
    #                                                     reader when a cap it shares is full (the biggest holder's)
    max_ring_mib: int = Field(1024, ge=1, le=65536)  # largest frame ring accepted

    @field_validator("socket", "results_socket")
    @classmethod
    def _socket(cls, v: str, info) -> str:
        _clean_path(v, f"ingress.{info.field_name}")
        if not v.startswith("/") or len(v.encode()) > SUN_PATH_MAX:
            raise ValueError(f"an absolute path of at most {SUN_PATH_MAX} bytes (a Unix socket)")
        return v

    @field_validator("socket_group")
    @classmethod
    def _group(cls, v):
        if v is not None:
            group_id(v)  # exists
        return v


class ShmConfig(StrictModel):
    result_records: int = Field(64, ge=2, le=65536)  # records kept per result ring
    dir: str | None = None                # ABI 1 (deprecated): ignored, rings are memfds
    allowed_uids: list[int] | None = None  # ABI 1 (deprecated): producer uids of streams that name no producer
    result_group: str | None = None       # ABI 1 (deprecated): ignored, readers are per stream (streams[].readers)


class MetricsConfig(StrictModel):
    enabled: bool = True
    listen: str = "127.0.0.1:9464"        # host:port of /metrics, /healthz, /readyz (loopback by default)
    ready_requires_stream: bool = True   # /readyz also needs at least one stream attached
    health_deadline_s: float = Field(2.0, gt=0)  # /healthz fails when the loop made no progress for this long

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("expected host:port, e.g. 127.0.0.1:9464 (port 0: any free port)")
        return v


class DriftConfig(StrictModel):
    """How far each model's outputs drift from its version's reference (control/drift.py; docs/operations/metrics-and-alerts.md)."""
    enabled: bool = True
    reference_frames: int = Field(1000, ge=10, le=1_000_000)  # a version's first frames (all its streams): its
    #                                                           reference, unless its bundle carries one
    window_s: float = Field(300.0, gt=0, le=86400)           # each stream's window: its last window_s seconds
    min_window_frames: int = Field(300, ge=1, le=1_000_000)   # a window's frames before its figure is published
    interval_s: float = Field(1.0, ge=0.05, le=60)           # how often the result rings are read
    score_bins: int = Field(10, ge=2, le=100)                # score bins (the reference's quantiles)
