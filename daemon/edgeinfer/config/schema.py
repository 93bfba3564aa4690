"""The daemon's configuration (/etc/edgeinfer/edgeinferd.yaml): schema and loading.

Every key is documented in etc/edgeinfer/edgeinferd.yaml with its default.
Unknown keys are errors; every error names the key and its line. Keys of ABI 1
that a 0.1 configuration may still carry are accepted with a warning (also
with its line), so an upgraded host starts; see `Config.warnings`.
"""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from edgeinfer.abi import constants
from edgeinfer.models.bundle import SizeLimits
from edgeinfer.config.identity import Acl, Identity, LegacyUids, group_id, user_id
from edgeinfer.abi.vocabulary import FrameFormat, Geometry
from edgeinfer.support.yamlconf import ConfigError, load_yaml_file  # noqa: F401  (ConfigError re-exported)

# ABI 1 segment names (deprecated key): a plain file name, never a path.
_SEGMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SUN_PATH_MAX = 107  # a Unix socket path, without its NUL


def _clean_path(v: str, what: str) -> str:
    """No control characters (a newline in a path is never what an operator meant)."""
    if not v or any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"{what} must be a non-empty path without control characters (newline, tab, NUL)")
    if len(v.encode()) > 4095:
        raise ValueError(f"{what} is longer than PATH_MAX")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
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


class ModelEntry(_Strict):
    """One model the daemon serves: its bundle and how each lane runs it."""
    bundle: str = Field(description="directory of the model bundle (model.onnx + model.yaml + model.sig)")
    ort_threads: int = Field(1, ge=1, le=256)  # intra-op threads per lane for this model, the lane's loop included
    batch: int = Field(1, ge=1, le=64)         # ready frames of one geometry a lane runs as one batch (1: none)

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, v: str) -> str:
        return _clean_path(v, "bundle")


class LaneConfig(_Strict):
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


class StreamConfig(_Strict):
    name: str
    model: str | None = None  # the entry of `models:` serving it (may be left out when there is one model)
    # Who may produce this stream: the peer credentials (SO_PEERCRED) of the camera's connection.
    producer: Identity | None = None
    # Who may read its results (any of these users or groups).
    readers: Acl = Acl(groups=["edgeinfer"])
    segment: str | None = None  # ABI 1 (deprecated): ignored, with a warning
    max_age_ms: float = Field(200.0, gt=0)
    priority: int = Field(0, ge=0, le=99)
    pixel_format: FrameFormat = "bgr24"
    width: int | None = Field(None, ge=1, le=16384)   # declare to build and warm the session at start
    height: int | None = Field(None, ge=1, le=16384)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not constants.stream_name_ok(v):  # ring.h's rule, so the daemon and every client agree
            raise ValueError(f"stream names are 1-{constants.STREAM_NAME_MAX} letters, digits, '_' or '-', starting "
                             f"with a letter or digit (nothing else: no path characters, no newline)")
        return v

    @field_validator("producer", "readers")
    @classmethod
    def _names_exist(cls, v):
        if v is not None:
            v.resolve()  # a user or group that does not exist is an error here, with its line
        if isinstance(v, Identity):
            if v.user is None and not v.trust_any_member:
                raise ValueError(f"a producer without a user lets any member of group {v.group} take the stream "
                                 f"before its camera does. Name the camera's user (producer: {{user: CAMERA-USER}}), "
                                 f"or, to trust every member, say so: producer: {{group: {v.group}, "
                                 f"trust_any_member: true}} (warned at every start)")
            if v.user is not None and v.trust_any_member:
                raise ValueError("trust_any_member is for a producer that names only a group; this one names "
                                 f"user {v.user}: leave it out")
        return v

    @field_validator("segment")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        if v is not None and not _SEGMENT_NAME.fullmatch(v):
            raise ValueError("a segment is a plain name (letters, digits, '.', '_', '-'; no '/', no leading '.', "
                             "at most 200): and since ABI 2 it is ignored")
        return v

    @model_validator(mode="after")
    def _size_pair(self):
        if (self.width is None) != (self.height is None):
            raise ValueError("give both width and height, or neither")
        return self


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
        if self.ort_cpus and len(self.ort_cpus) < self.ort_threads - 1:
            raise ValueError(f"ort_cpus lists {len(self.ort_cpus)} CPUs for {self.ort_threads - 1} extra ORT threads")
        return self


class IngressConfig(_Strict):
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


class ShmConfig(_Strict):
    result_records: int = Field(64, ge=2, le=65536)  # records kept per result ring
    dir: str | None = None                # ABI 1 (deprecated): ignored, rings are memfds
    allowed_uids: list[int] | None = None  # ABI 1 (deprecated): producer uids of streams that name no producer
    result_group: str | None = None       # ABI 1 (deprecated): ignored, readers are per stream (streams[].readers)


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


# The group whose every member 0.1 trusted with a stream that names no producer: refused since 0.2 unless the
# file says so (producer: {group: edgeinfer, trust_any_member: true}) or names the uids (shm.allowed_uids).
LEGACY_PRODUCER_GROUP = "edgeinfer"


POOL_STREAMS_MAX = 32
_POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


class PoolConfig(_Strict):
    """pools.NAME: the streams of a front (the gateway, docs/operations.md): `streams` rings of one model, named
    NAME-0 … NAME-(streams-1), each produced and read by `user` alone. The front keeps one request in flight per
    stream, so a pool's share of the lanes is its streams' share, whatever the network sends."""

    model: str | None = None  # the entry of `models:` (may be left out when there is one model)
    user: str | int           # the front's user: the only producer and the only reader of the pool's streams
    streams: int = Field(4, ge=1, le=POOL_STREAMS_MAX)
    max_age_ms: float = Field(10000.0, gt=0, le=600000)  # at least the longest deadline the front accepts
    priority: int = Field(0, ge=0, le=99)

    @field_validator("user")
    @classmethod
    def _user_exists(cls, v):
        user_id(v)  # a user that does not exist is an error here, with its line
        return v

    def stream_names(self, pool: str) -> list[str]:
        return [f"{pool}-{i}" for i in range(self.streams)]


STREAMS_MAX = 64


class Config(_Strict):
    model: ModelConfig = ModelConfig()
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    lanes: list[LaneConfig] | None = None  # None: one lane per usable CPU (see lane_plan)
    streams: list[StreamConfig] = Field(default_factory=list, max_length=STREAMS_MAX)
    pools: dict[str, PoolConfig] | None = None  # the fronts' streams (pool_streams); None: no front
    runtime: RuntimeConfig = RuntimeConfig()
    ingress: IngressConfig = IngressConfig()
    shm: ShmConfig = ShmConfig()
    metrics: MetricsConfig = MetricsConfig()
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, v: dict | None) -> dict | None:
        bad = [n for n in v or {} if not _POOL_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"pool names are 1-32 letters, digits, '_' or '-', starting with a letter or digit: "
                             f"{bad}")
        return v

    @model_validator(mode="after")
    def _unique(self):
        if not self.streams and not self.pools:
            raise ValueError("configure at least one stream (streams:) or pool (pools:)")
        names = [s.name for s in self.all_streams()]
        if len(names) > STREAMS_MAX:
            raise ValueError(f"{len(names)} streams with the pools' ({len(self.streams)} in streams:), more than "
                             f"{STREAMS_MAX}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"stream names must be unique; repeated: {dup}")
        declared = {Geometry(s.pixel_format, s.height, s.width) for s in self.streams if s.width is not None}
        if len(declared) > self.runtime.max_sessions:
            raise ValueError(f"{len(declared)} different frame geometries are declared, more than runtime."
                             f"max_sessions ({self.runtime.max_sessions}) sessions can hold")
        return self

    def model_entries(self) -> dict[str, ModelEntry]:
        """The models served, by name (a 0.2 configuration's model.bundle is named LEGACY_MODEL_NAME)."""
        if self.models:
            return dict(self.models)
        if self.model.bundle is None:
            return {}
        return {LEGACY_MODEL_NAME: ModelEntry(bundle=self.model.bundle, ort_threads=self.runtime.ort_threads)}

    def pool_streams(self) -> list[StreamConfig]:
        """Every pool's streams, as stream entries: NAME-i, produced and read by the pool's user alone."""
        return [StreamConfig(name=name, model=pool.model, producer=Identity(user=pool.user),
                             readers=Acl(users=[pool.user]), max_age_ms=pool.max_age_ms, priority=pool.priority)
                for pname, pool in (self.pools or {}).items() for name in pool.stream_names(pname)]

    def all_streams(self) -> list[StreamConfig]:
        """The streams the daemon serves: those of `streams:`, then the pools' (pool_streams)."""
        return [*self.streams, *self.pool_streams()]

    def model_of(self, stream: StreamConfig) -> str:
        if stream.model is not None:
            return stream.model
        return next(iter(self.model_entries()))

    def lane_plan(self) -> list[LaneConfig]:
        """The lanes to run, each with its models spelled out. Given `lanes:` as written; else the 0.2 keys
        (runtime.loop_cpus, or runtime.ort_threads > 1: one lane as before); else one lane per usable CPU,
        leaving the first to the control plane when there are more than two."""
        every = list(self.model_entries())
        if self.lanes is not None:
            return [LaneConfig(cpus=lane.cpus, models=lane.models if lane.models is not None else every)
                    for lane in self.lanes]
        rt = self.runtime
        usable = sorted(os.sched_getaffinity(0))
        if rt.loop_cpus or (not self.models and rt.ort_threads > 1):
            cpus = list(dict.fromkeys([*rt.loop_cpus, *rt.ort_cpus])) if rt.loop_cpus else usable
            return [LaneConfig(cpus=cpus, models=every)]
        lane_cpus = usable[1:] if len(usable) > 2 else usable
        return [LaneConfig(cpus=[c], models=every) for c in lane_cpus]

    def control_cpus(self) -> set[int]:
        """CPUs left to the control plane: those no lane has, else all of them."""
        usable = set(os.sched_getaffinity(0))
        taken = {c for lane in self.lane_plan() for c in lane.cpus}
        return (usable - taken) or usable

    def cross_checks(self) -> list[tuple[tuple, str]]:
        """(key path, message) of every inconsistency between sections (reported with their lines)."""
        out = []
        entries = self.model_entries()
        if self.models and self.model.bundle is not None:
            out.append((("model", "bundle"), "give the model under `models:` (model.bundle is the 0.2 form); not both"))
        if not entries:
            out.append((("models",), "no model configured: add `models: {NAME: {bundle: DIR}}`"))
            return out
        for name in self.models:
            if not _MODEL_NAME.fullmatch(name):
                out.append((("models", name), "a model name is 1-63 letters, digits, '_' or '-', starting with a "
                            "letter or digit"))
        for name, pool in (self.pools or {}).items():
            if pool.model is not None and pool.model not in entries:
                out.append((("pools", name, "model"), f"no model {pool.model!r} is configured (models: "
                            f"{', '.join(sorted(entries))})"))
            elif pool.model is None and len(entries) > 1:
                out.append((("pools", name), f"pool {name} names no model, and {len(entries)} are configured: "
                            f"add model: NAME"))
        for i, s in enumerate(self.streams):
            if s.model is not None and s.model not in entries:
                out.append((("streams", i, "model"), f"no model {s.model!r} is configured (models: "
                            f"{', '.join(sorted(entries))})"))
            elif s.model is None and len(entries) > 1:
                out.append((("streams", i, "name"), f"stream {s.name} names no model, and {len(entries)} are "
                            f"configured: add model: NAME"))
        if self.lanes is not None:
            seen: dict[int, int] = {}
            for i, lane in enumerate(self.lanes):
                for c in lane.cpus:
                    if c in seen:
                        out.append((("lanes", i, "cpus"), f"CPU {c} is also lane {seen[c]}'s: lanes may not share "
                                    f"CPUs"))
                    seen.setdefault(c, i)
                for m in lane.models or []:
                    if m not in entries:
                        out.append((("lanes", i, "models"), f"no model {m!r} is configured"))
        plan = self.lane_plan()
        served = {m for lane in plan for m in lane.models}
        for name in entries:
            if name not in served:
                out.append((("models", name) if self.models else ("model", "bundle"), f"model {name} is served by "
                            f"no lane (lanes[].models)"))
        for i, lane in enumerate(plan):
            for m in lane.models:
                threads = entries[m].ort_threads if m in entries else 1
                if threads > len(lane.cpus):
                    where = ("lanes", i, "cpus") if self.lanes is not None else ("models", m, "ort_threads")
                    out.append((where, f"lane {i} has {len(lane.cpus)} CPU(s) for model {m}'s {threads} ORT threads"))
        return out

    def producer_of(self, stream: StreamConfig) -> Identity | LegacyUids:
        """Who may produce `stream`: its `producer`, else the uids of a 0.1 file's shm.allowed_uids (a file with
        neither is refused: `refusals`)."""
        if stream.producer is not None:
            return stream.producer
        if self.shm.allowed_uids:
            return LegacyUids(tuple(self.shm.allowed_uids))
        raise ValueError(f"stream {stream.name} names no producer")

    def refusals(self) -> list[tuple[tuple, str]]:
        """(key path, message) of every rule across sections this file breaks: a stream that names no producer,
        in a file that does not name its uids either (shm.allowed_uids), would let any member of group
        edgeinfer take it before its camera does (0.1's trust): refused unless the file says so."""
        if self.shm.allowed_uids:
            return []
        return [(("streams", i, "name"),
                 f"stream {s.name} names no producer: any member of group {LEGACY_PRODUCER_GROUP} could take it "
                 f"before its camera does (0.1 trusted that; 0.2 does not). Name the camera's user: "
                 f"producer: {{user: CAMERA-USER}}; or, to trust every member, say so: producer: "
                 f"{{group: {LEGACY_PRODUCER_GROUP}, trust_any_member: true}} (warned at every start)")
                for i, s in enumerate(self.streams) if s.producer is None]

    def deprecations(self) -> list[tuple[tuple, str]]:
        """(key path, message) of every key kept only for configurations written for ABI 1, and of every
        producer trusted by group alone (trust_any_member): warned at every start."""
        out = []
        for i, s in enumerate(self.streams):
            if s.producer is not None and s.producer.trust_any_member:
                out.append((("streams", i, "producer"), f"stream {s.name}: any member of group {s.producer.group} "
                            f"may produce it (trust_any_member): the first to connect takes the stream, its camera "
                            f"is then refused as busy. Name the camera's user: producer: {{user: CAMERA-USER}}"))
            if s.producer is None:  # else refused (refusals)
                out.append((("streams", i, "name"), f"stream {s.name} names no producer: one of shm.allowed_uids "
                            f"{self.shm.allowed_uids} may produce it (the trust of 0.1). Name the camera's user: "
                            f"producer: {{user: CAMERA-USER}}"))
            if s.segment is not None:
                out.append((("streams", i, "segment"), "ignored since ABI 2 (rings are handed over by fd)"))
        for key in ("dir", "result_group"):
            if getattr(self.shm, key) is not None:
                out.append((("shm", key), "ignored since ABI 2 (rings are memfds; readers are per stream: "
                            "streams[].readers)"))
        if self.shm.allowed_uids is not None:
            out.append((("shm", "allowed_uids"), "deprecated since ABI 2: it only sets the producers of streams "
                        "that name none (streams[].producer)"))
        return out

    @property
    def warnings(self) -> list[str]:
        """Deprecation warnings, each as 'file:line: key: message' (set by the loader)."""
        return list(self._warnings)


def load_config(path: str) -> Config:
    """Reads and validates a config file; raises ConfigError listing every problem."""
    return load_yaml_file(Config, path)
