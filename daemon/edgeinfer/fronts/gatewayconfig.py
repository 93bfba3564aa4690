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

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import load_yaml_file

GATEWAY_CONFIG = "/etc/edgeinfer/gateway.yaml"
_SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")
FRONT_FORMATS = ("rgb24", "bgr24")  # what a network client sends: packed 8-bit colour


def _socket_mode(v: str, info: ValidationInfo) -> str:
    """A socket's mode (grpc.sockets[].mode, frigate.socket_mode): octal, and nothing for others."""
    if not re.fullmatch(r"0?[0-7]{3}", v) or int(v, 8) & 0o007:
        raise ValueError(f"{info.field_name} is octal, e.g. \"0660\", and gives others nothing")
    return v


class ModelFront(StrictModel):
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


class TlsConfig(StrictModel):
    cert: str                     # PEM certificate chain of the server
    key: str                      # its private key (readable by the gateway's user only)
    client_ca: str | None = None  # PEM CA bundle: set, every client must present a certificate it signed (mTLS)


class UnixListener(StrictModel):
    """grpc.sockets[]: a Unix socket the gRPC front also listens on, for co-located clients. Each socket is one
    client to max_inflight_per_client (grpcio shows a server no peer credentials, so the socket that a user may
    open stands for them: one socket per user or group that should not share a budget; decision 0031)."""

    path: str                     # absolute, at most 107 bytes (e.g. /run/edgeinfer-gateway/grpc-nvr.sock)
    mode: str = "0660"            # octal; others get nothing
    group: str | int | None = None  # the socket's group (the gateway's user must be in it); unset: the gateway's

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or len(v.encode()) > 107:
            raise ValueError("a socket path is absolute and at most 107 bytes")
        return v

    _mode = field_validator("mode")(_socket_mode)


class GrpcConfig(StrictModel):
    enabled: bool = True
    listen: str = "127.0.0.1:8001"
    tls: TlsConfig | None = None
    sockets: list[UnixListener] = Field(default_factory=list, max_length=64)  # Unix sockets, a client budget each
    # Requests of one client at once, from their HEADERS on (whether their message arrived or not); over:
    # RESOURCE_EXHAUSTED before the message is read. A client: its certificate's subject under mutual TLS, else
    # its address (every loopback client is one), or the Unix socket it came through.
    max_inflight_per_client: int = Field(16, ge=1, le=4096)
    # Streams open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; over: REFUSED_STREAM). gRPC
    # counts a stream until both ends closed it, so keep it twice max_inflight_per_client or more.
    max_streams_per_connection: int = Field(32, ge=1, le=1024)
    request_timeout_ms: int = Field(5000, ge=10, le=600000)  # from a request's HEADERS to its whole message
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
        if len({s.path for s in self.sockets}) != len(self.sockets):
            raise ValueError("a socket path is listed twice")
        return self

    def loopback(self) -> bool:
        return _is_loopback(self.listen.rpartition(":")[0].strip("[]"))


class FrigateConfig(StrictModel):
    enabled: bool = False
    endpoint: str = "ipc:///run/edgeinfer-gateway/frigate.sock"  # Frigate's `endpoint:` (ipc:// or tcp://)
    model: str | None = None      # the detection model it serves (default: the one detection model)
    socket_mode: str = "0660"     # of an ipc:// socket
    socket_group: str | int | None = None  # of an ipc:// socket (Frigate's group, so its user may connect)
    allow_remote: bool = False    # tcp:// on an address other than loopback (Frigate's client has no authentication)
    timeout_ms: int = Field(200, ge=10, le=60000)  # Frigate's request_timeout_ms: later answers are never sent
    # Connections at once, of one peer (its uid on ipc://, its address on tcp://) and in all; one more is shut.
    max_connections_per_peer: int = Field(32, ge=1, le=4096)
    max_connections: int = Field(256, ge=1, le=65536)

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

    _mode = field_validator("socket_mode")(_socket_mode)

    @model_validator(mode="after")
    def _remote(self):
        if self.endpoint.startswith("tcp://") and not self.allow_remote and \
                not _is_loopback(self.endpoint[6:].rpartition(":")[0].strip("[]")):
            raise ValueError(f"{self.endpoint} is not a loopback address: Frigate's detector client has no "
                             "authentication, so anyone who reaches it may use the model. To accept that, set "
                             "allow_remote: true (warned at every start)")
        return self


class GatewayMetrics(StrictModel):
    enabled: bool = True
    listen: str = "127.0.0.1:9465"


class GatewayConfig(StrictModel):
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
