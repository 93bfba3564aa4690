"""The MQTT bridge's configuration (/etc/edgeinfer/mqtt.yaml): schema and loading.

Same discipline as edgeinferd.yaml and gateway.yaml: unknown keys are errors, every error names its key and
line. The streams are listed here (docs/decisions/0026-mqtt-bridge-streams-listed.md): the bridge publishes
what its operator names, and the daemon still decides, by each stream's `readers`, whether it may read it.
"""
from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edgeinfer.abi import constants
from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import load_yaml_file

MQTT_CONFIG = "/etc/edgeinfer/mqtt.yaml"


class BrokerTls(StrictModel):
    ca: str | None = None     # PEM CA bundle that signed the broker's certificate (default: the system's)
    cert: str | None = None   # a client certificate (PEM), for brokers that require one
    key: str | None = None    # its private key

    @field_validator("key")
    @classmethod
    def _key(cls, v, info):
        if (v is None) != (info.data.get("cert") is None):
            raise ValueError("cert and key go together")
        return v


class Broker(StrictModel):
    host: str = "localhost"
    port: int = Field(1883, ge=1, le=65535)
    tls: BrokerTls | None = None
    username: str | None = None
    password_file: str | None = None   # read at start; refused if others may read it (mode & 0o004)
    client_id: str = ""                # default: edgeinfer-mqtt-NODE
    protocol: Literal["5", "3.1.1"] = "5"  # 5 falls back to 3.1.1 when the broker refuses 5 (logged)
    keepalive: int = Field(30, ge=5, le=3600)
    reconnect_min_s: float = Field(1.0, gt=0, le=60)
    reconnect_max_s: float = Field(30.0, gt=0, le=600)

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol(cls, v):
        return str(v) if isinstance(v, (int, float)) else v


class Rule(StrictModel):
    """An event rule (rules.py): which items of a decoded result match, how many frames start an episode, how long
    without a match ends it. Boxes and the region are in frame pixels (docs/decisions/0026-*)."""
    labels: list[str] | None = Field(None, min_length=1)  # label names (or class ids as text); None: any label
    threshold: float = Field(0.5, ge=0.0, le=1.0)         # an item's score at or above this
    min_area: float = Field(0.0, ge=0.0)                  # detections: box width × height, pixels², at least
    region: tuple[float, float, float, float] | None = None  # detections: [x1, y1, x2, y2] the box centre lies in
    min_frames: int = Field(1, ge=1, le=1_000_000)        # consecutive matching frames that start an event
    end_after_frames: int | None = Field(None, ge=1, le=1_000_000)  # frames without a match that end it
    end_after_ms: float | None = Field(None, gt=0, le=86_400_000)   # or: capture time without a match

    @field_validator("region")
    @classmethod
    def _region(cls, v):
        if v is not None and not (v[0] < v[2] and v[1] < v[3]):
            raise ValueError("region is [x1, y1, x2, y2] in frame pixels with x1 < x2 and y1 < y2")
        return v

    @model_validator(mode="after")
    def _end(self):
        if (self.end_after_frames is None) == (self.end_after_ms is None):
            raise ValueError("give exactly one of end_after_frames and end_after_ms")
        return self


class StreamOut(StrictModel):
    results: bool = True                      # publish <prefix>/<stream>/result per result
    max_rate_hz: float = Field(0.0, ge=0.0)   # result messages per second at most (0: no limit); the rest dropped
    rules: dict[str, Rule] = {}               # events on <prefix>/<stream>/event, state on .../state (retained)

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: dict) -> dict:
        for name in v:
            if not constants.stream_name_ok(name):
                raise ValueError(f"{name!r} is not a rule name (letters, digits, '_' or '-', as a stream's)")
        return v


class Queue(StrictModel):
    max_messages: int = Field(1000, ge=1, le=1_000_000)
    max_bytes: int = Field(4 << 20, ge=1024, le=1 << 30)


class Qos(StrictModel):
    availability: Literal[0, 1, 2] = 1
    result: Literal[0, 1, 2] = 0
    event: Literal[0, 1, 2] = 1
    state: Literal[0, 1, 2] = 1


class MetricsSettings(StrictModel):
    """metrics: the bridge's /metrics and /healthz listener (its collectors: bridges/bridgemetrics.BridgeMetrics)."""
    enabled: bool = True
    listen: str = "127.0.0.1:9466"

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("listen is HOST:PORT (e.g. 127.0.0.1:9466)")
        return v


class Decisions(StrictModel):
    """The decision log on the host (bridges/decisionlog.py; docs/decisions/0027-decision-log-format.md)."""
    enabled: bool = True
    path: str = "/var/lib/edgeinfer-mqtt/decisions.db"
    results: bool = False                                   # every result too, not only the rules' events
    fsync_interval_ms: float = Field(200, ge=0, le=60_000)  # what a power cut may lose, at most (plus one turn)
    max_bytes: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    max_age_days: float = Field(30, gt=0, le=3650)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("the decision log's path is absolute")
        return v


class MqttConfig(StrictModel):
    daemon_config: str = "/etc/edgeinfer/edgeinferd.yaml"  # the results socket and the bundles (labels, digests)
    broker: Broker = Broker()
    prefix: str = "edgeinfer"
    node: str = Field(default_factory=socket.gethostname)
    streams: dict[str, StreamOut] = Field(min_length=1)
    queue: Queue = Queue()
    qos: Qos = Qos()
    metrics: MetricsSettings = MetricsSettings()
    decisions: Decisions = Decisions()

    @field_validator("streams")
    @classmethod
    def _streams(cls, v: dict) -> dict:
        for name in v:
            if not constants.stream_name_ok(name):
                raise ValueError(f"{name!r} is not a stream name (ring.h's rule: letters, digits, '_' or '-')")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v or any(c in v for c in "+#\0") or v.startswith("/") or v.endswith("/"):
            raise ValueError("the prefix is a topic without wildcards (+ #) and without a leading or trailing /")
        return v


def read_password(path: str) -> str:
    """The broker password, from a file only its owner and group may read (refused otherwise)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o004:
            raise PermissionError(f"{path}: readable by every user (mode {st.st_mode & 0o777:04o}); "
                                  "make it 0640 root:edgeinfer-mqtt or 0600")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return data.decode("utf-8").rstrip("\r\n")


def load_mqtt_config(path: str = MQTT_CONFIG) -> MqttConfig:
    """Reads and validates the bridge's file; raises ConfigError listing every problem with its line."""
    return load_yaml_file(MqttConfig, path)
