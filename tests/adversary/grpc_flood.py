"""A network client at its worst, against edgeinfer-gateway's gRPC front (tests/reliability/test_fronts.py).

    grpc_flood.py ADDRESS malformed N     N malformed ModelInfer requests (wrong dtype, shapes, negative and huge
                                          dims, truncated and oversized raw contents, unknown model and version,
                                          bytes that are no protobuf); prints one JSON line: answers by status
                                          code, and how many got no answer at all
    grpc_flood.py ADDRESS idle N          holds N TCP connections: half of them silent, half with half of
                                          HTTP/2's preface; prints "HELD n", then holds them until killed
    grpc_flood.py ADDRESS unread N        sends N valid requests, reads none of the answers (stops itself
                                          with SIGSTOP once they are sent); prints "SENT n" first
    grpc_flood.py ADDRESS headers N       one raw HTTP/2 connection opening N ModelInfer streams at once with
                                          HEADERS only (never a message, no deadline, ignoring the server's
                                          SETTINGS); prints "OPENED n", then one JSON line once every stream
                                          was ended by the server or 60 s passed: how each ended
    grpc_flood.py ADDRESS trickle N       N streams on one raw connection, each sending a valid request at 1
                                          byte/s; the same JSON line (and the bytes each got out)
    grpc_flood.py ADDRESS inflight N      N valid requests in flight at once, again as each is answered, until
                                          killed (threads of one process: one local client); prints "LOADING"
"""
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

address, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
H, W = 224, 224


def request(i: int) -> pb.ModelInferRequest | bytes:
    kind = i % 10
    r = pb.ModelInferRequest(model_name="orient")
    if kind == 0:  # wrong datatype
        r.inputs.add(name="frame_rgb24", datatype="FP32", shape=[H, W, 3])
        r.raw_input_contents.append(b"\0" * (H * W * 3 * 4))
    elif kind == 1:  # wrong shape
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 4])
        r.raw_input_contents.append(b"\0" * (H * W * 4))
    elif kind == 2:  # negative dims
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[-H, W, 3])
    elif kind == 3:  # huge dims (their product overflows)
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[1 << 40, 1 << 40, 3])
    elif kind == 4:  # truncated raw contents
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
        r.raw_input_contents.append(b"\0" * (H * W * 3 - 7))
    elif kind == 5:  # oversized raw contents
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
        r.raw_input_contents.append(b"\0" * (H * W * 3 + 4096))
    elif kind == 6:  # unknown model
        r.model_name = "no-such-model"
    elif kind == 7:  # unknown version
        r.model_version = "99"
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
    elif kind == 8:  # two inputs, no data
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
        r.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
    else:  # bytes that are no protobuf
        return os.urandom(64) + b"\xff" * 64
    return r


if mode == "malformed":
    codes, unanswered = {}, 0
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)]) as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for i in range(n):
            req = request(i)
            try:
                (raw if isinstance(req, bytes) else stub.ModelInfer)(req, timeout=10)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    unanswered += 1
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
    print(json.dumps({"codes": codes, "unanswered": unanswered}), flush=True)
elif mode == "idle":
    host, port = address.rsplit(":", 1)
    held = []
    for i in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.send(b"PRI * HTTP/2.0\r\n")  # ...and the rest of the preface never comes
            held.append(s)
        except OSError:
            pass
    print(f"HELD {len(held)}", flush=True)
    signal.pause()
elif mode == "unread":
    channel = grpc.insecure_channel(address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    good = pb.ModelInferRequest(model_name="orient")
    good.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
    good.raw_input_contents.append(b"\x80" * (H * W * 3))
    calls = [stub.ModelInfer.future(good, timeout=600) for _ in range(n)]
    print(f"SENT {len(calls)}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # never reads an answer


# ---------------------------------------------------------------- raw HTTP/2 (RFC 9113), the client's side only

def _int(value: int, prefix: int) -> bytes:  # HPACK integer (RFC 7541 5.1), first byte's flags 0
    top = (1 << prefix) - 1
    if value < top:
        return bytes([value])
    out, value = [top], value - top
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes(out + [value])


def _headers(authority: str) -> bytes:  # literal fields without indexing, no Huffman
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
              (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")]
    return b"".join(b"\0" + _int(len(k), 7) + k.encode() + _int(len(v), 7) + v.encode() for k, v in fields)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Raw:
    """One HTTP/2 connection that opens streams regardless of the server's SETTINGS; a thread reads frames, acks
    SETTINGS and PING, and notes how each stream ended (RST_STREAM code, or trailers)."""

    def __init__(self):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.settimeout(None)
        self.lock = threading.Lock()
        self.ended: dict[int, str] = {}
        self.goaway = False
        self.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise EOFError
            out += got
        return out

    def _read(self) -> None:
        names = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
                 11: "ENHANCE_YOUR_CALM"}
        try:
            while True:
                head = self._exactly(9)
                length, kind, flags, stream = int.from_bytes(head[:3], "big"), head[3], head[4], \
                    int.from_bytes(head[5:], "big") & 0x7FFFFFFF
                payload = self._exactly(length)
                if kind == 4 and not flags & 1:
                    self.send(_frame(4, 1, 0))
                elif kind == 6 and not flags & 1:
                    self.send(_frame(6, 1, 0, payload))
                elif kind == 3:
                    code = int.from_bytes(payload[:4], "big")
                    self.ended.setdefault(stream, "RST_" + names.get(code, str(code)))
                elif kind == 1 and flags & 1:
                    self.ended.setdefault(stream, "ANSWERED")  # trailers: a grpc-status (HPACK, not decoded)
                elif kind == 7:
                    self.goaway = True
        except (EOFError, OSError):
            self.goaway = True

    def open(self, stream: int) -> None:
        self.send(_frame(1, 4, stream, _headers(address)))  # END_HEADERS, no END_STREAM

    def report(self, streams: list[int], extra: dict) -> None:
        codes: dict[str, int] = {}
        for s in streams:
            k = self.ended.get(s, "CLOSED_WITH_CONNECTION" if self.goaway else "OPEN")
            codes[k] = codes.get(k, 0) + 1
        print(json.dumps({"codes": codes, **extra}), flush=True)


def _valid() -> bytes:
    good = pb.ModelInferRequest(model_name="orient")
    good.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[H, W, 3])
    good.raw_input_contents.append(b"\x80" * (H * W * 3))
    body = good.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


if mode == "headers":
    raw = Raw()
    streams = [1 + 2 * i for i in range(n)]
    for s in streams:
        raw.open(s)
    print(f"OPENED {len(streams)}", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not raw.goaway and len(raw.ended) < n:
        time.sleep(0.1)
    raw.report(streams, {})
    signal.pause()
elif mode == "trickle":
    raw = Raw()
    streams = [1 + 2 * i for i in range(n)]
    message = _valid()
    for s in streams:
        raw.open(s)
    print(f"OPENED {len(streams)}", flush=True)
    sent = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not raw.goaway and len(raw.ended) < n:
        for s in streams:
            if s not in raw.ended:
                try:
                    raw.send(_frame(0, 0, s, message[sent:sent + 1]))
                except OSError:
                    break
        sent += 1
        time.sleep(1.0)
    raw.report(streams, {"bytes_each": sent, "of": len(message)})
    signal.pause()
elif mode == "inflight":
    stop = threading.Event()
    channel = grpc.insecure_channel(address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    good = pb.ModelInferRequest.FromString(_valid()[5:])

    def loop():
        while not stop.is_set():
            try:
                stub.ModelInfer(good, timeout=30)
            except grpc.RpcError:
                pass
    for _ in range(n):
        threading.Thread(target=loop, daemon=True).start()
    print("LOADING", flush=True)
    signal.pause()
