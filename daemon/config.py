"""The daemon's configuration (/etc/edgeinfer/edgeinferd.yaml): schema and loading.

Every key is documented in etc/edgeinfer/edgeinferd.yaml with its default.
Unknown keys are errors; every error names the key and its line.
"""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgeinfer.yamlconf import ConfigError, load_yaml_file  # noqa: F401  (ConfigError re-exported)

_STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    bundle: str = Field(description="directory of the model bundle (model.onnx + model.yaml + model.sig)")
    warmup_runs: int = Field(3, ge=0, le=1000)
    trust_dir: str = "/etc/edgeinfer/trust"   # public keys (PEM) whose signatures are accepted
    state_dir: str = "/var/lib/edgeinfer"     # anti-rollback record (highest accepted version per model)
    watch_interval_s: float = Field(1.0, ge=0)  # reload when the bundle path's target changes (0: off)


class StreamConfig(_Strict):
    name: str
    segment: str | None = None  # default: edgeinfer.<name>
    max_age_ms: float = Field(200.0, gt=0)
    priority: int = Field(0, ge=0, le=99)
    pixel_format: Literal["gray8", "rgb24", "bgr24", "rgba32", "bgra32"] = "bgr24"
    width: int | None = Field(None, ge=1, le=16384)   # declare to build and warm the session at start
    height: int | None = Field(None, ge=1, le=16384)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _STREAM_NAME.match(v):
            raise ValueError("stream names are 1-64 letters, digits, '_' or '-'")
        return v

    @model_validator(mode="after")
    def _size_pair(self):
        if (self.width is None) != (self.height is None):
            raise ValueError("give both width and height, or neither")
        return self

    @property
    def segment_name(self) -> str:
        return self.segment or f"edgeinfer.{self.name}"

    @property
    def results_name(self) -> str:
        return f"edgeinfer.{self.name}.results"


class RuntimeConfig(_Strict):
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
    idle_timeout_ms: int = Field(100, ge=1, le=10000)

    @field_validator("loop_cpus", "ort_cpus")
    @classmethod
    def _available(cls, cpus: list[int]) -> list[int]:
        available = os.sched_getaffinity(0)
        bad = [c for c in cpus if c not in available]
        if bad:
            raise ValueError(f"CPUs {bad} are not available to this process (have {sorted(available)})")
        return cpus

    @model_validator(mode="after")
    def _cpus(self):
        if self.ort_cpus and len(self.ort_cpus) < self.ort_threads - 1:
            raise ValueError(f"ort_cpus lists {len(self.ort_cpus)} CPUs for {self.ort_threads - 1} extra ORT threads")
        return self


class ShmConfig(_Strict):
    dir: str = "/dev/shm"
    allowed_uids: list[int] = Field(default_factory=list)  # empty: any owner
    result_records: int = Field(64, ge=2, le=65536)
    result_group: str | None = None                         # group of the result rings (default: ours)


class MetricsConfig(_Strict):
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


class Config(_Strict):
    model: ModelConfig
    streams: list[StreamConfig] = Field(min_length=1, max_length=64)
    runtime: RuntimeConfig = RuntimeConfig()
    shm: ShmConfig = ShmConfig()
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _unique(self):
        names = [s.name for s in self.streams]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"stream names must be unique; repeated: {dup}")
        return self


def load_config(path: str) -> Config:
    """Reads and validates a config file; raises ConfigError listing every problem."""
    return load_yaml_file(Config, path)
