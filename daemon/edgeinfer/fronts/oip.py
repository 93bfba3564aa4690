"""The Open Inference Protocol (KServe v2) over gRPC: `inference.GRPCInferenceService`.

Served with grpcio and the protocol's generated modules as tritonclient ships
them (Triton's service is KServe's v2 with extensions; those extensions
answer UNIMPLEMENTED here, with a message and no traceback in the journal,
but for the repository index, which Triton's tools ask first: the models
served, each with its version and state READY or UNAVAILABLE). Every model of the gateway's plan is a model of
the protocol, its version the bundle's. Its one input is the frame, UINT8
[H, W, 3] or [1, H, W, 3] in the pixel format its name says (frame_rgb24 or
frame_bgr24), in `raw_input_contents` or typed as `uint_contents`; its
outputs are the decoder's (outputs.py). Each request is answered with its
result or a status code a client can act on: INVALID_ARGUMENT (with what was
expected), NOT_FOUND, RESOURCE_EXHAUSTED (the front sheds rather than queue
without bound, or the client is at its limit), DEADLINE_EXCEEDED (its frame
was then never run), UNAVAILABLE (edgeinferd is restarting).
"""
from __future__ import annotations

import collections
import grp
import heapq
import itertools
import logging
import os
import threading
import time
from concurrent import futures

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from edgeinfer.fronts.frontmetrics import FrontMetrics
from edgeinfer.fronts.outputs import declared_outputs
from edgeinfer.fronts.pool import FrontError, Timing
from edgeinfer.fronts.served import ServedModels, ServedModel
from edgeinfer.fronts.gatewayconfig import GrpcConfig, UnixListener

log = logging.getLogger("edgeinfer-gateway")

FRONT = "grpc"
SERVER_NAME = "edgeinfer"
MAX_DIM = 16384  # a frame side the daemon accepts at most (config: width/height)
# A refusal's retry hint: a client whose channel has a retry policy for RESOURCE_EXHAUSTED waits this long before
# its retry (gRPC's A6 retry design honours it); a client retrying by hand may read it from the trailing metadata.
RETRY_PUSHBACK = "grpc-retry-pushback-ms"
SHED_AT_HEADERS = "every ring of the model is busy and its line is full: retry later (after grpc-retry-pushback-ms)"
DEADLINE_SHORT = ("every ring of the model is busy: an answer would take longer than the request's deadline leaves "
                  "(it was not run): retry later (after grpc-retry-pushback-ms), or with a longer deadline")
MESSAGE_MARGIN = 1 << 20  # a request's bytes besides its frame (names, shape, parameters) at most
RECEIVE_FACTOR = 8  # gRPC's own limit: the largest frame as FP64/INT64, the widest numeric type a client may send


def request_limit(max_frame_bytes: int) -> int:
    """The largest request that can succeed: the largest frame a ring takes and the message around it."""
    return max_frame_bytes + MESSAGE_MARGIN


def receive_limit(max_frame_bytes: int) -> int:
    """grpcio's max_receive_message_length, the hard cap (memory): above request_limit, so that a request that can
    never succeed (the frame sent as FP32, too large a frame) reaches the handler and is answered INVALID_ARGUMENT
    with the limit, not RESOURCE_EXHAUSTED by gRPC itself, which tells a client to back off and retry."""
    return RECEIVE_FACTOR * max_frame_bytes + MESSAGE_MARGIN


_NOT_SERVED = {
    "model load": "the models are edgeinferd.yaml's signed bundles and the gateway's pools (docs/operations/models-and-trust.md, "
                  "\"Updating a model\")",
    "model unload": "the models are edgeinferd.yaml's signed bundles and the gateway's pools",
    "model config": "ModelMetadata says the input and outputs",
    "model statistics": "the gateway's Prometheus metrics say it",
    "streaming inference": "use ModelInfer",
    "trace settings": "not settable over gRPC",
    "log settings": "the gateway logs to the journal",
    "shared memory": "frames travel in the request",
}


def input_name(pixel_format: str) -> str:
    return f"frame_{pixel_format}"


class ClientLimit:
    """Requests in flight per client: its certificate's subject under mutual TLS, else its address; a Unix socket's
    clients are the socket (grpcio shows no peer credentials: decision 0031)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    @staticmethod
    def client_of(context) -> str:
        names = context.auth_context().get("x509_common_name")
        if names:
            return "cn:" + names[0].decode(errors="replace")
        peer = context.peer()  # ipv4:127.0.0.1:40000, ipv6:[::1]:40000, unix:...
        return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer

    def take(self, client: str) -> None:
        with self.lock:
            if self.held[client] >= self.limit:
                raise FrontError("RESOURCE_EXHAUSTED", f"this client has {self.limit} requests in flight already "
                                 "(grpc.max_inflight_per_client): wait for an answer", "client_limit")
            self.held[client] += 1

    def give(self, client: str) -> None:
        with self.lock:
            self.held[client] -= 1
            if self.held[client] <= 0:
                del self.held[client]


class RpcAdmission:
    """What a request costs before its handler: its client's share from its HEADERS on, and a bound on the time its
    message may take to arrive.

    Every method is registered stream-unary on the server's side (the wire is the same for a unary client), so
    grpcio calls it at the HEADERS rather than after the message: the client's slot is taken first (over its
    limit: RESOURCE_EXHAUSTED, the message never read), then the message is awaited for at most
    request_timeout_ms (a stream that sends no message, or trickles it, is cancelled then and counted as
    refusal `request_timeout`). One thread keeps those deadlines."""

    def __init__(self, cfg: GrpcConfig, metrics: FrontMetrics):
        self.clients = ClientLimit(cfg.max_inflight_per_client)
        self.timeout_s = cfg.request_timeout_ms / 1e3
        self.metrics = metrics
        self._due: list = []  # heap of [deadline, seq, context, settled]
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._keep, name="grpc-admission", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(5.0)

    def wrap(self, handler: grpc.RpcMethodHandler, client_of, full=None) -> grpc.RpcMethodHandler:
        """The unary-unary `handler` as a stream-unary one behind admission; client_of(context) names the client;
        full() (ModelInfer's): every model would shed a request now, so it is shed at its HEADERS."""
        if handler.unary_unary is None:
            return handler  # a streaming method of the protocol: UNIMPLEMENTED here, at its HEADERS
        behavior = handler.unary_unary
        failed = self.metrics.failed

        def admitted(requests, context):
            if full is not None:  # the cheapest refusals grpcio allows: no message read, no lock taken
                if full():
                    failed(FRONT, "(any)", "RESOURCE_EXHAUSTED", "shed")
                    context.set_trailing_metadata(((RETRY_PUSHBACK, str(full.retry_ms())),))
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, SHED_AT_HEADERS)
                if full.hopeless(context.time_remaining()):  # its deadline (grpc-timeout) is known at the HEADERS
                    failed(FRONT, "(any)", "RESOURCE_EXHAUSTED", "deadline_short")
                    context.set_trailing_metadata(((RETRY_PUSHBACK, str(full.retry_ms())),))
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, DEADLINE_SHORT)
            client = client_of(context)
            try:
                self.clients.take(client)
            except FrontError as e:
                self.metrics.failed(FRONT, "(any)", e.code, e.reason)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            try:
                entry = [time.monotonic() + self.timeout_s, next(self._seq), context, False]
                with self._cv:
                    heapq.heappush(self._due, entry)
                    if self._due[0] is entry:
                        self._cv.notify()
                request, more = None, None
                try:  # the message, then the client's half-close (gRPC keeps a stream not read to its end)
                    request = next(requests, None)
                    more = next(requests, None) if request is not None else None
                except grpc.RpcError:  # cancelled: by the client, or by _keep
                    request = None
                with self._cv:
                    late = entry[3]
                    entry[2:] = [None, True]  # a call referenced is a stream gRPC still counts open
                if late:
                    self.metrics.failed(FRONT, "(any)", "CANCELLED", "request_timeout")
                    # The call is cancelled already: nothing goes back. (Returning None instead made grpcio log an
                    # ERROR with a traceback per call, "Exception serializing message!".)
                    context.abort(grpc.StatusCode.CANCELLED, "request_timeout_ms passed before its message")
                if request is None or more is not None:
                    if context.is_active():
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one request message is required")
                    context.abort(grpc.StatusCode.CANCELLED, "cancelled before its message")  # nothing goes back
                return behavior(request, context)
            finally:
                self.clients.give(client)

        return grpc.stream_unary_rpc_method_handler(admitted, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    def _keep(self) -> None:
        with self._cv:
            while not self._stopped:
                now = time.monotonic()
                late = []
                while self._due and (self._due[0][3] or self._due[0][0] <= now):
                    entry = heapq.heappop(self._due)
                    if not entry[3]:
                        entry[3] = True
                        late.append(entry[2])
                if late:
                    self._cv.release()
                    try:
                        for context in late:
                            context.cancel()
                    finally:
                        self._cv.acquire()
                    continue
                self._cv.wait(self._due[0][0] - now if self._due else None)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models: ServedModels, cfg: GrpcConfig, metrics: FrontMetrics, version: str):
        self.models, self.cfg, self.metrics, self.version = models, cfg, metrics, version
        self.max_frame_bytes = models.largest_frame_bytes()
        self.max_request_bytes = request_limit(self.max_frame_bytes)

    # ---------------------------------------------------------------- health and metadata

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=all(m.ready for m in self.models.served.values()))

    def ModelReady(self, request, context):
        m = self._model(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=m.ready)

    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self.version, extensions=[])

    def RepositoryIndex(self, request, context):
        """Triton's repository extension: the models served, each READY or UNAVAILABLE (with why). The repository's
        name is ignored (there is one); ready=True lists only the ready ones, as Triton does."""
        out = pb.RepositoryIndexResponse()
        for name in sorted(self.models.served):
            m = self.models.served[name]
            if m.ready:
                out.models.add(name=name, version=m.version or "", state="READY")
            elif not request.ready:
                reason = (m.warm_error or "waiting for edgeinferd") if not m.warm else "edgeinferd not reachable"
                out.models.add(name=name, version=m.version or "", state="UNAVAILABLE", reason=reason)
        return out

    def ModelMetadata(self, request, context):
        m = self._model(request.name, request.version, context)
        plan = m.plan
        (w, h), = plan.sizes if len(plan.sizes) == 1 else ((-1, -1),)
        inputs = [pb.ModelMetadataResponse.TensorMetadata(name=input_name(plan.pixel_format), datatype="UINT8",
                                                          shape=[h, w, 3])]
        outputs = [pb.ModelMetadataResponse.TensorMetadata(name=n, datatype=d, shape=list(s))
                   for n, d, s in declared_outputs(plan.kind, m.outputs)]
        return pb.ModelMetadataResponse(name=plan.name, versions=[m.version] if m.version else [],
                                        platform="edgeinfer", inputs=inputs, outputs=outputs)

    def _model(self, name: str, version: str, context) -> ServedModel:
        try:
            m = self.models.get(name)
            self.models.check_version(m, version)
            return m
        except FrontError as e:
            context.abort(getattr(grpc.StatusCode, e.code), str(e))

    # ---------------------------------------------------------------- Triton's extensions not served

    def _unimplemented(self, what: str, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not served by edgeinfer's gateway: " + _NOT_SERVED[what])

    def RepositoryModelLoad(self, request, context):
        self._unimplemented("model load", context)

    def RepositoryModelUnload(self, request, context):
        self._unimplemented("model unload", context)

    def ModelConfig(self, request, context):
        self._unimplemented("model config", context)

    def ModelStatistics(self, request, context):
        self._unimplemented("model statistics", context)

    def ModelStreamInfer(self, request_iterator, context):
        self._unimplemented("streaming inference", context)

    def TraceSetting(self, request, context):
        self._unimplemented("trace settings", context)

    def LogSettings(self, request, context):
        self._unimplemented("log settings", context)

    def SystemSharedMemoryStatus(self, request, context):
        self._unimplemented("shared memory", context)

    SystemSharedMemoryRegister = SystemSharedMemoryUnregister = SystemSharedMemoryStatus

    def CudaSharedMemoryStatus(self, request, context):
        self._unimplemented("shared memory", context)

    CudaSharedMemoryRegister = CudaSharedMemoryUnregister = CudaSharedMemoryStatus

    # ---------------------------------------------------------------- inference

    def ModelInfer(self, request, context):
        timing = Timing()
        model = request.model_name if request.model_name in self.models.served else "(unknown)"
        try:
            size = request.ByteSize()
            if size > self.max_request_bytes:
                raise FrontError("INVALID_ARGUMENT", f"the request is {size} bytes; the largest this server takes is "
                                 f"{self.max_request_bytes} bytes (its largest frame, {self.max_frame_bytes} bytes of "
                                 "UINT8, and 1 MiB): send one UINT8 frame of a size the model takes", "too_large")
            m = self.models.get(request.model_name)
            self.models.check_version(m, request.model_version)
            frame, width, height = self._frame(m, request)
            wanted = [o.name for o in request.outputs]
            deadline = self._deadline(context, timing.received)
            gauge = self.metrics.in_flight.labels(FRONT, model)
            gauge.inc()
            try:
                rec = self.models.infer(m, frame, width, height, deadline, timing)
            finally:
                gauge.dec()
            outs = self.models.outputs(m, rec)
            if wanted:
                known = {o.name: o for o in outs}
                missing = [n for n in wanted if n not in known]
                if missing:
                    raise FrontError("INVALID_ARGUMENT", f"no output {', '.join(missing)} (outputs: "
                                     f"{', '.join(known)})", "output")
                outs = [known[n] for n in wanted]
        except FrontError as e:
            self.metrics.failed(FRONT, model, e.code, e.reason)
            if e.retry_ms is not None:
                context.set_trailing_metadata(((RETRY_PUSHBACK, str(e.retry_ms)),))
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        response = pb.ModelInferResponse(model_name=m.plan.name, model_version=rec.model_version, id=request.id)
        for o in outs:
            response.outputs.add(name=o.name, datatype=o.datatype, shape=list(o.shape))
            response.raw_output_contents.append(o.data)
        self.metrics.answered(FRONT, model, timing)
        return response

    def _deadline(self, context, received_ns: int) -> int:
        left = context.time_remaining()
        cap = self.cfg.max_deadline_ms / 1e3
        budget = min(left, cap) if left is not None else self.cfg.default_deadline_ms / 1e3
        return received_ns + int(max(0.0, budget) * 1e9)

    @staticmethod
    def _frame(m: ServedModel, request) -> tuple[np.ndarray, int, int]:
        """The request's frame as flat uint8, with its width and height; INVALID_ARGUMENT says what was expected."""
        plan = m.plan
        name = input_name(plan.pixel_format)
        expected = f"one input {name}, UINT8 [H, W, 3] or [1, H, W, 3] with H x W one of {m.sizes_said}"
        if len(request.inputs) != 1:
            raise FrontError("INVALID_ARGUMENT", f"{len(request.inputs)} inputs; model {plan.name} takes {expected}",
                             "inputs")
        t = request.inputs[0]
        if t.name != name:
            raise FrontError("INVALID_ARGUMENT", f"input {t.name[:64]!r}; model {plan.name} takes {expected}", "inputs")
        if t.datatype != "UINT8":
            raise FrontError("INVALID_ARGUMENT", f"datatype {t.datatype[:16]!r}; model {plan.name} takes {expected}",
                             "dtype")
        shape = list(t.shape)
        if len(shape) == 4 and shape[0] == 1:
            shape = shape[1:]
        if len(shape) != 3 or shape[2] != 3 or not all(0 < d <= MAX_DIM for d in shape[:2]):
            raise FrontError("INVALID_ARGUMENT", f"shape {list(t.shape)[:8]}; model {plan.name} takes {expected}",
                             "shape")
        height, width = shape[0], shape[1]
        if (width, height) not in m.pools:
            raise FrontError("INVALID_ARGUMENT", f"a {width}x{height} frame; model {plan.name} takes frames of "
                             f"{m.sizes_said} ({plan.pixel_format})", "size")
        need = width * height * 3
        if request.raw_input_contents:
            if len(request.raw_input_contents) != 1 or len(request.raw_input_contents[0]) != need:
                got = [len(b) for b in request.raw_input_contents][:4]
                raise FrontError("INVALID_ARGUMENT", f"raw_input_contents of {got} bytes; a {width}x{height}x3 UINT8 "
                                 f"frame is {need} bytes, in one raw_input_contents entry", "data")
            return np.frombuffer(request.raw_input_contents[0], np.uint8), width, height
        values = t.contents.uint_contents
        if len(values) != need:
            raise FrontError("INVALID_ARGUMENT", f"{len(values)} values in contents.uint_contents (and no "
                             f"raw_input_contents); a {width}x{height}x3 frame has {need}", "data")
        array = np.asarray(values, np.uint32)
        if int(array.max(initial=0)) > 255:
            raise FrontError("INVALID_ARGUMENT", "a UINT8 value above 255 in contents.uint_contents", "data")
        return array.astype(np.uint8), width, height


class GrpcFront:
    """The gRPC front's servers: one on grpc.listen, one per Unix socket of grpc.sockets (each socket its own client
    budget), sharing one pool of worker threads and one admission."""

    def __init__(self, service: InferenceService, cfg: GrpcConfig, metrics: FrontMetrics, max_frame_bytes: int):
        self.service, self.cfg = service, cfg
        self.admission = RpcAdmission(cfg, metrics)
        self.pool = futures.ThreadPoolExecutor(cfg.workers, thread_name_prefix="grpc-front")
        self.servers: list[grpc.Server] = []
        self.options = [
            ("grpc.max_receive_message_length", receive_limit(max_frame_bytes)),  # the hard cap; see request_limit
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),  # advertised, and enforced, per connection
        ]

    def _server(self, client_of) -> grpc.Server:
        server = grpc.server(self.pool, maximum_concurrent_rpcs=self.cfg.max_concurrent_rpcs, options=self.options)
        full = _Full(self.service.models, self.cfg)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.service, _Admitted(server, self.admission, client_of,
                                                                                   full))
        self.servers.append(server)
        return server

    def start(self) -> None:
        """Listening; raises OSError when it cannot listen where configured."""
        cfg = self.cfg
        try:
            server = self._server(ClientLimit.client_of)
            if cfg.tls is not None:
                port = server.add_secure_port(cfg.listen, _tls(cfg))
            else:
                port = server.add_insecure_port(cfg.listen)
            if not port:
                raise OSError(f"grpc.listen {cfg.listen}: cannot listen there (in use, or not an address of this host)")
            for sock in cfg.sockets:
                self._listen_unix(sock)
            for s in self.servers:
                s.start()
        except BaseException:
            self.stop(0)
            raise
        log.info("gRPC front (Open Inference Protocol v2%s) on %s%s", ", TLS" + (" with client certificates" if
                 cfg.tls and cfg.tls.client_ca else "") if cfg.tls else "", cfg.listen,
                 "".join(f", unix:{s.path}" for s in cfg.sockets))

    def _listen_unix(self, sock: UnixListener) -> None:
        key = "unix:" + sock.path
        server = self._server(lambda context: key)
        old = os.umask(0o177)  # nobody but the gateway's user reaches it before its mode and group are set
        try:
            port = server.add_insecure_port("unix:" + sock.path)
        finally:
            os.umask(old)
        if not port:
            raise OSError(f"grpc.sockets {sock.path}: cannot listen there (its directory missing or not ours?)")
        if sock.group is not None:
            gid = sock.group if isinstance(sock.group, int) else grp.getgrnam(sock.group).gr_gid
            os.chown(sock.path, -1, gid)
        os.chmod(sock.path, int(sock.mode, 8))

    def stop(self, grace: float | None = 1.0) -> None:
        for event in [s.stop(grace) for s in self.servers]:
            event.wait(5.0)
        self.servers = []
        self.admission.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)


class _Admitted:
    """What pb_grpc's add_..._to_server sees as the server: each method it registers goes in behind RpcAdmission."""

    def __init__(self, server: grpc.Server, admission: RpcAdmission, client_of, full=None):
        self.server, self.admission, self.client_of, self.full = server, admission, client_of, full

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same methods come to add_registered_method_handlers, where they are wrapped

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        wrapped = {name: self.admission.wrap(h, self.client_of, self.full if name == "ModelInfer" else None)
                   for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        self.server.add_registered_method_handlers(service, wrapped)


class _Full:
    """RpcAdmission's full() for ModelInfer: the models would shed any request now; hopeless(): its deadline is shorter
    than the wait any model would make it expect; retry_ms() the retry hint of either."""

    def __init__(self, models: ServedModels, cfg: GrpcConfig):
        self.models = models
        self.cap_s = cfg.max_deadline_ms / 1e3
        self.default_ns = int(cfg.default_deadline_ms * 1e6)

    def __call__(self) -> bool:
        return self.models.full()

    def hopeless(self, left: float | None) -> bool:
        """left: context.time_remaining() (None: no deadline); the deadline as InferenceService._deadline takes it."""
        budget = self.default_ns if left is None else int(max(0.0, min(left, self.cap_s)) * 1e9)
        return self.models.hopeless(budget)

    def retry_ms(self) -> int:
        return self.models.retry_ms()


def _tls(cfg: GrpcConfig) -> grpc.ServerCredentials:
    ca = None
    if cfg.tls.client_ca:
        with open(cfg.tls.client_ca, "rb") as f:
            ca = f.read()
    with open(cfg.tls.key, "rb") as f:
        key = f.read()
    with open(cfg.tls.cert, "rb") as f:
        cert = f.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def start_server(service: InferenceService, cfg: GrpcConfig, metrics: FrontMetrics, max_frame_bytes: int) -> GrpcFront:
    """The gRPC front, listening; raises OSError when it cannot listen where configured."""
    front = GrpcFront(service, cfg, metrics, max_frame_bytes)
    front.start()
    return front
