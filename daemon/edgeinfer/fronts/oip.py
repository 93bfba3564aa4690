"""The Open Inference Protocol (KServe v2) over gRPC: `inference.GRPCInferenceService`.

Served with grpcio and the protocol's generated modules as tritonclient ships
them (Triton's service is KServe's v2 with extensions; those extensions
answer UNIMPLEMENTED here). Every model of the gateway's plan is a model of
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
import logging
import threading
from concurrent import futures

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from edgeinfer.fronts.metrics import FrontMetrics
from edgeinfer.fronts.outputs import declared_outputs
from edgeinfer.fronts.pool import FrontError, Timing
from edgeinfer.fronts.service import Models, ServedModel
from edgeinfer.fronts.settings import GrpcConfig

log = logging.getLogger("edgeinfer-gateway")

FRONT = "grpc"
SERVER_NAME = "edgeinfer"
MAX_DIM = 16384  # a frame side the daemon accepts at most (config: width/height)


def input_name(pixel_format: str) -> str:
    return f"frame_{pixel_format}"


class ClientLimit:
    """Requests in flight per client: its certificate's subject under mutual TLS, else its address."""

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


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models: Models, cfg: GrpcConfig, metrics: FrontMetrics, version: str):
        self.models, self.cfg, self.metrics, self.version = models, cfg, metrics, version
        self.clients = ClientLimit(cfg.max_inflight_per_client)

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

    # ---------------------------------------------------------------- inference

    def ModelInfer(self, request, context):
        timing = Timing()
        model = request.model_name if request.model_name in self.models.served else "(unknown)"
        client = None
        try:
            m = self.models.get(request.model_name)
            self.models.check_version(m, request.model_version)
            frame, width, height = self._frame(m, request)
            wanted = [o.name for o in request.outputs]
            deadline = self._deadline(context, timing.received)
            client = ClientLimit.client_of(context)
            self.clients.take(client)
            gauge = self.metrics.in_flight.labels(FRONT, model)
            gauge.inc()
            try:
                rec = self.models.infer(m, frame, width, height, deadline, timing)
            finally:
                gauge.dec()
                self.clients.give(client)
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


def start_server(service: InferenceService, cfg: GrpcConfig, max_frame_bytes: int) -> grpc.Server:
    """The gRPC server, listening; raises OSError when it cannot listen where configured."""
    limit = max_frame_bytes + (1 << 20)  # the largest frame and the message around it
    server = grpc.server(futures.ThreadPoolExecutor(cfg.workers, thread_name_prefix="grpc-front"),
                         maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
                         options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    if cfg.tls is not None:
        ca = None
        if cfg.tls.client_ca:
            with open(cfg.tls.client_ca, "rb") as f:
                ca = f.read()
        with open(cfg.tls.key, "rb") as f:
            key = f.read()
        with open(cfg.tls.cert, "rb") as f:
            cert = f.read()
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
        port = server.add_secure_port(cfg.listen, creds)
    else:
        port = server.add_insecure_port(cfg.listen)
    if not port:
        raise OSError(f"grpc.listen {cfg.listen}: cannot listen there (in use, or not an address of this host)")
    server.start()
    log.info("gRPC front (Open Inference Protocol v2%s) on %s", ", TLS" + (" with client certificates" if
             cfg.tls and cfg.tls.client_ca else "") if cfg.tls else "", cfg.listen)
    return server


