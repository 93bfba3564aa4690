"""The gateway's configuration (/etc/edgeinfer/gateway.yaml): schema and loading.

The gateway serves the daemon's models to network clients through the
daemon's *pools* (edgeinferd.yaml `pools:`): each pool is a set of streams
produced and read by the gateway's user alone. This file says which fronts
listen where, and, per model, which frame sizes they accept. It names no
stream: the streams are the pool's. Unknown keys are errors; every error names
its key and line (the schema discipline of edgeinferd.yaml).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgeinfer.support.yamlconf import load_yaml_file

GATEWAY_CONFIG = "/etc/edgeinfer/gateway.yaml"
_SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")
FRONT_FORMATS = ("rgb24", "bgr24")  # what a network client sends: packed 8-bit colour


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFront(_Strict):
    """models.NAME: how the fronts serve one model of the daemon's `models:`."""

    pool: str | None = None   # the pool of edgeinferd.yaml serving it (default: the one pool of this model and user)
    # Frame sizes accepted, "WxH" (default: the model input's own size). Each gets its own rings, at least one;
    # a request of another size is refused (INVALID_ARGUMENT, naming these): never a new session per request.
    sizes: list[str] = Field(default_factory=list, max_length=8)
    pixel_format: Literal["rgb24", "bgr24"] = "rgb24"  # the channel order clients send
    max_waiting: int | None = Field(None, ge=0, le=4096)  # requests waiting for a ring (default: the pool's streams)

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[str]) -> list[str]:
        for s in v:
            if not _SIZE.fullmatch(s):
                raise ValueError(f"a size is WIDTHxHEIGHT, e.g. 640x480: {s!r}")
        if len(set(v)) != len(v):
            raise ValueError("a size is listed twice")
        return v

    def size_list(self) -> list[tuple[int, int]]:
        return [tuple(int(x) for x in _SIZE.fullmatch(s).groups()) for s in self.sizes]


class TlsConfig(_Strict):
    cert: str                     # PEM certificate chain of the server
    key: str                      # its private key (readable by the gateway's user only)
    client_ca: str | None = None  # PEM CA bundle: set, every client must present a certificate it signed (mTLS)


class GrpcConfig(_Strict):
    enabled: bool = True
    listen: str = "127.0.0.1:8001"
    tls: TlsConfig | None = None
    max_inflight_per_client: int = Field(16, ge=1, le=4096)  # requests of one client at once (over: RESOURCE_EXHAUSTED)
    max_deadline_ms: int = Field(10000, ge=1, le=600000)     # a longer client deadline is cut to this
    default_deadline_ms: int = Field(5000, ge=1, le=600000)  # for a request without a deadline
    max_concurrent_rpcs: int = Field(256, ge=1, le=65536)    # RPCs held at once (over: RESOURCE_EXHAUSTED by gRPC)
    workers: int = Field(64, ge=1, le=4096)                  # threads serving RPCs

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("listen is HOST:PORT (e.g. 127.0.0.1:8001, [::1]:8001, 0.0.0.0:8001)")
        return v

    @model_validator(mode="after")
    def _deadlines(self):
        if self.default_deadline_ms > self.max_deadline_ms:
            raise ValueError("default_deadline_ms is above max_deadline_ms")
        return self

    def loopback(self) -> bool:
        return _is_loopback(self.listen.rpartition(":")[0].strip("[]"))


class FrigateConfig(_Strict):
    enabled: bool = False
    endpoint: str = "ipc:///run/edgeinfer-gateway/frigate.sock"  # Frigate's `endpoint:` (ipc:// or tcp://)
    model: str | None = None      # the detection model it serves (default: the one detection model)
    socket_mode: str = "0660"     # of an ipc:// socket
    socket_group: str | int | None = None  # of an ipc:// socket (Frigate's group, so its user may connect)
    allow_remote: bool = False    # tcp:// on an address other than loopback (Frigate's client has no authentication)
    timeout_ms: int = Field(200, ge=10, le=60000)  # Frigate's request_timeout_ms: later answers are never sent

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v.startswith("ipc://"):
            if not v[6:].startswith("/") or len(v[6:].encode()) > 107:
                raise ValueError("an ipc:// endpoint is an absolute socket path of at most 107 bytes")
        elif v.startswith("tcp://"):
            host, _, port = v[6:].rpartition(":")
            if not host or not port.isdigit():
                raise ValueError("a tcp:// endpoint is tcp://HOST:PORT")
        else:
            raise ValueError("the endpoint is ipc:///PATH or tcp://HOST:PORT")
        return v

    @field_validator("socket_mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if not re.fullmatch(r"0?[0-7]{3}", v) or int(v, 8) & 0o007:
            raise ValueError("socket_mode is octal, e.g. \"0660\", and gives others nothing")
        return v

    @model_validator(mode="after")
    def _remote(self):
        if self.endpoint.startswith("tcp://") and not self.allow_remote and \
                not _is_loopback(self.endpoint[6:].rpartition(":")[0].strip("[]")):
            raise ValueError(f"{self.endpoint} is not a loopback address: Frigate's detector client has no "
                             "authentication, so anyone who reaches it may use the model. To accept that, set "
                             "allow_remote: true (warned at every start)")
        return self


class GatewayMetrics(_Strict):
    enabled: bool = True
    listen: str = "127.0.0.1:9465"


class GatewayConfig(_Strict):
    daemon_config: str = "/etc/edgeinfer/edgeinferd.yaml"  # the pools, the models and the daemon's sockets
    models: dict[str, ModelFront] = Field(default_factory=dict)  # default: every model with a pool of ours
    grpc: GrpcConfig = GrpcConfig()
    frigate: FrigateConfig = FrigateConfig()
    metrics: GatewayMetrics = GatewayMetrics()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_gateway_config(path: str = GATEWAY_CONFIG) -> GatewayConfig:
    """Reads and validates the gateway's file; raises ConfigError listing every problem with its line."""
    return load_yaml_file(GatewayConfig, path)
