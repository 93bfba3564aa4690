"""The daemon's configuration (/etc/edgeinfer/edgeinferd.yaml): schema and loading.

Every key is documented in etc/edgeinfer/edgeinferd.yaml with its default.
Unknown keys are errors; every error names the key and its line. Keys of ABI 1
that a 0.1 configuration may still carry are accepted with a warning (also
with its line), so an upgraded host starts; see `Config.warnings`.
"""
from __future__ import annotations

import os
import re

from pydantic import Field, PrivateAttr, field_validator, model_validator

from edgeinfer.abi import constants
from edgeinfer.config.identity import Acl, Identity, LegacyUids, user_id
from edgeinfer.abi.vocabulary import FrameFormat, Geometry
# The sections, re-exported: importers name them as schema's (schema.RuntimeConfig, ...).
from edgeinfer.config.sections import (LEGACY_MODEL_NAME, SUN_PATH_MAX, DriftConfig, IngressConfig,  # noqa: F401
                                       LaneConfig, MetricsConfig, ModelConfig, ModelEntry, RuntimeConfig, ShmConfig,
                                       _MODEL_NAME)
from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import ConfigError, load_yaml_file  # noqa: F401  (ConfigError re-exported)

# ABI 1 segment names (deprecated key): a plain file name, never a path.
_SEGMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class StreamConfig(StrictModel):
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


# The group whose every member 0.1 trusted with a stream that names no producer: refused since 0.2 unless the
# file says so (producer: {group: edgeinfer, trust_any_member: true}) or names the uids (shm.allowed_uids).
LEGACY_PRODUCER_GROUP = "edgeinfer"


POOL_STREAMS_MAX = 32
_POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


class PoolConfig(StrictModel):
    """pools.NAME: the streams of a front (the gateway, docs/operations/gateway.md): `streams` rings of one model, named
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


# A lane sleeps on every stream it may serve and its mailbox's doorbell in one wait of at most MAX_WAIT rings
# (ring.h's ei_wait_any: a 64-bit mask), and a lane may serve every stream: so at most MAX_WAIT - 1 streams.
STREAMS_MAX = constants.MAX_WAIT - 1


class Config(StrictModel):
    model: ModelConfig = ModelConfig()
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    lanes: list[LaneConfig] | None = None  # None: one lane per usable CPU (see lane_plan)
    streams: list[StreamConfig] = Field(default_factory=list)  # at most STREAMS_MAX with the pools' (_unique)
    pools: dict[str, PoolConfig] | None = None  # the fronts' streams (pool_streams); None: no front
    runtime: RuntimeConfig = RuntimeConfig()
    ingress: IngressConfig = IngressConfig()
    shm: ShmConfig = ShmConfig()
    metrics: MetricsConfig = MetricsConfig()
    drift: DriftConfig = DriftConfig()
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
                             f"{STREAMS_MAX} (a lane waits on all its streams and its mailbox at once, "
                             f"{constants.MAX_WAIT} rings at most)")
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
