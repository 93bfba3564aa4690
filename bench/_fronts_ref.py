#!/usr/bin/env python3
"""bench/fronts.py's references: what a user would write instead of edgeinfer-gateway, as a process of its own.

  grpc   a plain grpcio servicer (GRPCInferenceServiceServicer.ModelInfer from tritonclient's generated modules)
         in a ThreadPoolExecutor of --workers threads, one ONNX Runtime session on the bundle's model.onnx with one
         intra-op thread (several runs at once, one per worker: one CPU each, like a lane). Each request: the
         frame from raw_input_contents, resized (nearest neighbour, only when its size is not the model's) and
         normalised in numpy as tests/integration/test_daemon.py's reference() does, session.run, the bundle's
         decoder (the daemon's own, so both sides decode alike), answered as the gateway answers: the rows
         (classes or detections, FP32) and their labels (BYTES).
  zmq    the design of Frigate's reference zmq detector: one thread, a REP socket bound on --endpoint, one ONNX
         Runtime session with its default threads; each request [JSON header, tensor] answered with Frigate's
         480 bytes, float32 [20, 6] rows of [class_id, score, ymin, xmin, ymax, xmax] (the same conversion as
         the gateway's Frigate front, fronts/outputs.frigate_rows); a malformed request with one JSON frame.

Prints "ready" on stdout once it serves; runs until SIGTERM or SIGINT.
Usage: bench/_fronts_ref.py {grpc --port P [--workers N] | zmq --endpoint E} --bundle DIR
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from edgeinfer.fronts.outputs import bytes_tensor, frigate_rows  # noqa: E402
from edgeinfer.models.bundle import load_unverified_bundle  # noqa: E402
from edgeinfer.models.decoders import make_decoder  # noqa: E402


class Model:
    """The bundle's model.onnx, numpy preprocessing, the bundle's decoder: frame (H, W, 3 uint8) → rows, count."""

    def __init__(self, bundle: str, intra_op_threads: int):
        b = load_unverified_bundle(bundle)
        so = ort.SessionOptions()
        if intra_op_threads:
            so.intra_op_num_threads = intra_op_threads
            so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(b.model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
        m = self.meta = b.meta
        self.w, self.h = m.input.width, m.input.height
        self.bgr = m.input.pixel_format == "bgr24"
        self.scale = np.float32(m.preprocess.scale)
        self.mean = np.asarray(m.preprocess.mean, np.float32)
        self.std = np.asarray(m.preprocess.std, np.float32)
        self.labels = list(b.meta.labels or [])
        shapes = [[d if isinstance(d, int) else 1 for d in o.shape] for o in self.sess.get_outputs()]
        self.decoder = make_decoder(m.decoder.model_dump(), self.labels, self.w, self.h, shapes)
        self.kind = m.decoder.type

    def run(self, frame_rgb: np.ndarray) -> tuple[np.ndarray, int]:
        h, w = frame_rgb.shape[:2]
        x = frame_rgb
        if (w, h) != (self.w, self.h):  # nearest neighbour: rows, then columns
            x = x[(np.arange(self.h) * h // self.h)][:, (np.arange(self.w) * w // self.w)]
        if self.bgr:
            x = x[:, :, ::-1]
        x = (x.astype(np.float32) * self.scale - self.mean) / self.std
        out = self.sess.run(None, {self.meta.input.name: np.ascontiguousarray(x.transpose(2, 0, 1)[None])})
        payload, n = self.decoder.decode(out, w, h)
        width = 2 if self.kind == "classification" else 6
        return np.frombuffer(payload, np.float32, n * width).reshape(n, width), n


def serve_grpc(model: Model, port: int, workers: int) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    name = "classes" if model.kind == "classification" else "detections"

    class Servicer(pb_grpc.GRPCInferenceServiceServicer):
        def ServerReady(self, request, context):
            return pb.ServerReadyResponse(ready=True)

        def ServerLive(self, request, context):
            return pb.ServerLiveResponse(live=True)

        def ModelInfer(self, request, context):
            t = request.inputs[0]
            shape = list(t.shape)[-3:]
            if t.datatype != "UINT8" or len(shape) != 3 or shape[2] != 3 or not request.raw_input_contents:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one UINT8 [H, W, 3] input in raw_input_contents")
            frame = np.frombuffer(request.raw_input_contents[0], np.uint8).reshape(shape)
            rows, n = model.run(frame)
            ids = rows[:, 0] if model.kind == "classification" else rows[:, 5]
            labels = [model.labels[int(i)] if 0 <= int(i) < len(model.labels) else "" for i in ids]
            resp = pb.ModelInferResponse(model_name=request.model_name, model_version=model.meta.version,
                                         id=request.id)
            resp.outputs.add(name=name, datatype="FP32", shape=list(rows.shape))
            resp.raw_output_contents.append(rows.tobytes())
            resp.outputs.add(name="labels", datatype="BYTES", shape=[n])
            resp.raw_output_contents.append(bytes_tensor(labels))
            return resp

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    if not server.add_insecure_port(f"127.0.0.1:{port}"):
        raise SystemExit(f"cannot listen on 127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(0)


def serve_zmq(model: Model, endpoint: str) -> None:
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))
    print("ready", flush=True)
    while not stopping:
        if not sock.poll(200):
            continue
        frames = sock.recv_multipart()
        try:
            header = json.loads(frames[0])
            h, w = header["shape"][-3:-1]
            frame = np.frombuffer(frames[1], np.uint8).reshape(h, w, 3)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            continue
        rows, n = model.run(frame)
        sock.send(frigate_rows(rows.tobytes(), n, w, h).tobytes())
    sock.close(0)
    ctx.term()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["grpc", "zmq"])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--port", type=int)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--endpoint")
    a = ap.parse_args()
    if a.kind == "grpc":
        serve_grpc(Model(a.bundle, intra_op_threads=1), a.port, a.workers)
    else:
        serve_zmq(Model(a.bundle, intra_op_threads=0), a.endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
