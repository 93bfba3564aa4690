"""A network client at its worst, against edgeinfer-gateway's gRPC front (tests/reliability/test_fronts.py).

    grpc_flood.py ADDRESS malformed N     N malformed ModelInfer requests (wrong dtype, shapes, negative and huge
                                          dims, truncated and oversized raw contents, unknown model and version,
                                          bytes that are no protobuf); prints one JSON line: answers by status
                                          code, and how many got no answer at all
    grpc_flood.py ADDRESS idle N          holds N TCP connections: half of them silent, half with half of
                                          HTTP/2's preface; prints "HELD n", then holds them until killed
    grpc_flood.py ADDRESS unread N        sends N valid requests, reads none of the answers (stops itself
                                          with SIGSTOP once they are sent); prints "SENT n" first
"""
import json
import os
import resource
import signal
import socket
import sys

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
