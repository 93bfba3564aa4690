"""The Frigate front without a daemon: what parse_request takes and refuses (with the reason counted), that an
error reply is never mistaken for detections, which model it serves, and its socket thread's hello, upload
refusal and framing refusals, with a model that needs no ring."""
from __future__ import annotations

import json
import os
import stat
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from edgeinfer.fronts import frigate
from edgeinfer.fronts.frigate import FrigateFront, choose_model
from edgeinfer.fronts.frigate_protocol import REPLY_BYTES, error_reply, parse_request, split_envelope
from edgeinfer.fronts.frontmetrics import FrontMetrics
from edgeinfer.fronts.plan import PlanError
from edgeinfer.fronts.pool import FrontError
from edgeinfer.fronts.gatewayconfig import FrigateConfig

SIZES = [(416, 416), (320, 240)]


def _header(**kw) -> bytes:
    return json.dumps({"shape": [1, 416, 416, 3], "dtype": "uint8", "model_type": "ssd", **kw}).encode()


def test_a_detection_request_as_frigate_sends_it():
    tensor = np.zeros((1, 416, 416, 3), np.uint8).tobytes()
    req = parse_request([_header(), tensor], SIZES)
    assert (req.kind, req.width, req.height, req.tensor) == ("detect", 416, 416, tensor)
    req = parse_request([_header(shape=[240, 320, 3]), bytes(320 * 240 * 3)], SIZES)  # [H, W, 3], another size
    assert (req.kind, req.width, req.height) == ("detect", 320, 240)


def test_hello_and_upload():
    req = parse_request([json.dumps({"model_request": True, "model_name": "yolo.onnx"}).encode()], SIZES)
    assert (req.kind, req.model_name) == ("hello", "yolo.onnx")
    req = parse_request([json.dumps({"model_data": True, "model_name": "yolo.onnx"}).encode(), b"\0" * 10], SIZES)
    assert (req.kind, req.model_name) == ("upload", "yolo.onnx")


@pytest.mark.parametrize("body, reason, says", [
    ([], "frames", "0 frames"),
    ([_header(), b"", b""], "frames", "3 frames"),
    ([_header()], "frames", "without its tensor"),
    ([b"{not json", bytes(416 * 416 * 3)], "header", "not JSON"),
    ([b"\xff\xfe", bytes(416 * 416 * 3)], "header", "not JSON"),
    ([b"[1, 2]", bytes(416 * 416 * 3)], "header", "not a JSON object"),
    ([b"x" * 5000, bytes(416 * 416 * 3)], "header", "5000 bytes"),
    ([_header(dtype="float32"), bytes(416 * 416 * 12)], "dtype", "'float32'"),
    ([_header(dtype=None), bytes(416 * 416 * 3)], "dtype", "None"),
    ([_header(shape=[1, 3, 416, 416]), bytes(416 * 416 * 3)], "shape", "nhwc"),
    ([_header(shape=[2, 416, 416, 3]), bytes(416 * 416 * 6)], "shape", "[2, 416, 416, 3]"),
    ([_header(shape="416x416"), bytes(416 * 416 * 3)], "shape", "416x416"),
    ([_header(shape=[416.0, 416, 3]), bytes(416 * 416 * 3)], "shape", "416.0"),
    ([_header(shape=[1, 0, 416, 3]), b""], "shape", "[1, 0, 416, 3]"),
    ([_header(shape=[1, 320, 320, 3]), bytes(320 * 320 * 3)], "size", "416x416, 320x240"),
    ([_header(), bytes(416 * 416 * 3 - 1)], "data", "519167 bytes"),
    ([_header(), bytes(416 * 416 * 3 + 1)], "data", "519169 bytes"),
])
def test_what_is_refused_and_why(body, reason, says):
    with pytest.raises(FrontError) as e:
        parse_request(body, SIZES)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.reason == reason
    assert says in str(e.value)


def test_an_error_reply_is_json_and_never_480_bytes():
    e = FrontError("INVALID_ARGUMENT", "bad", "shape")
    assert json.loads(error_reply(e)) == {"error": "bad", "code": "INVALID_ARGUMENT"}
    base = len(error_reply(FrontError("INTERNAL", "")))
    exact = FrontError("INTERNAL", "x" * (REPLY_BYTES - base))
    assert len(json.dumps({"error": str(exact), "code": "INTERNAL"})) == REPLY_BYTES
    assert len(error_reply(exact)) == REPLY_BYTES + 1 and json.loads(error_reply(exact))["code"] == "INTERNAL"


def test_the_envelope_is_up_to_the_empty_delimiter():
    assert split_envelope([b"id", b"", b"h", b"t"]) == ([b"id", b""], [b"h", b"t"])
    assert split_envelope([b"id", b"h"]) is None


# ---------------------------------------------------------------- the socket thread, with a model that needs no daemon

def _fake_models(kind: str = "detection", ready: bool = True, names=("det",)):
    plan = {n: SimpleNamespace(name=n, kind=kind, sizes=((416, 416),), pixel_format="rgb24", bundle=f"/b/{n}")
            for n in names}
    return SimpleNamespace(served={n: SimpleNamespace(plan=plan[n], pools={}, sizes_said="416x416", ready=ready,
                                                      warm_error=None) for n in names})


def test_the_model_is_the_one_detector_or_the_named_one():
    assert choose_model(_fake_models(), FrigateConfig()).plan.name == "det"
    assert choose_model(_fake_models(names=("a", "b")), FrigateConfig(model="b")).plan.name == "b"
    with pytest.raises(PlanError, match="models a, b detect: name one"):
        choose_model(_fake_models(names=("a", "b")), FrigateConfig())
    with pytest.raises(PlanError, match="no detection model"):
        choose_model(_fake_models(kind="classification"), FrigateConfig())
    with pytest.raises(PlanError, match="frigate.model: c is not served"):
        choose_model(_fake_models(), FrigateConfig(model="c"))
    with pytest.raises(PlanError, match="a classification model"):
        choose_model(_fake_models(kind="classification"), FrigateConfig(model="det"))


@pytest.fixture
def front(tmp_path):
    made = []

    def start(models=None, **cfg):
        sock = tmp_path / "run" / "f.sock"
        f = FrigateFront(models or _fake_models(), FrigateConfig(enabled=True, endpoint=f"ipc://{sock}", **cfg),
                         FrontMetrics())
        f.start()
        made.append(f)
        return f, f"ipc://{sock}", sock
    yield start
    for f in made:
        f.stop()


def _ask(endpoint: str, *frames: bytes, timeout_ms: int = 5000) -> list[bytes]:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send_multipart(list(frames))
        return s.recv_multipart()
    finally:
        s.close()


def test_the_socket_hello_upload_and_refusals_without_a_daemon(front, tmp_path):
    f, endpoint, sock = front(socket_mode="0640")
    assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o640
    hello = json.dumps({"model_request": True, "model_name": "x.onnx"}).encode()
    assert json.loads(_ask(endpoint, hello)[0]) == {"model_available": True, "model_loaded": True}
    up = json.loads(_ask(endpoint, json.dumps({"model_data": True, "model_name": "x.onnx"}).encode(), b"m")[0])
    assert up["model_saved"] is False and up["model_loaded"] is False and "signed" in up["error"]
    bad = _ask(endpoint, _header(dtype="float32"), bytes(416 * 416 * 12))
    assert len(bad) == 1 and json.loads(bad[0])["code"] == "INVALID_ARGUMENT"
    for reason in ("dtype", "upload"):
        assert f.metrics.registry.get_sample_value("edgeinfer_front_refusals_total",
                                                   {"front": "frigate", "reason": reason}) == 1
    # The path is taken while it serves; a file that is not a socket is never replaced.
    with pytest.raises(OSError, match="is in use"):
        front()
    f.stop()
    assert not f.thread.is_alive() and not os.path.exists(sock)
    sock.write_text("")
    with pytest.raises(OSError, match="not a socket"):
        front()


def test_a_hello_waits_for_the_model_and_says_when_it_is_not_ready(front, monkeypatch):
    models = _fake_models(ready=False)
    _, endpoint, _ = front(models)
    hello = json.dumps({"model_request": True, "model_name": "x.onnx"}).encode()
    ready_at = []

    def warm():
        ready_at.append(time.monotonic())
        models.served["det"].ready = True
    threading.Timer(0.5, warm).start()
    assert json.loads(_ask(endpoint, hello)[0]) == {"model_available": True, "model_loaded": True}
    assert ready_at and time.monotonic() >= ready_at[0]  # the answer waited for the model (an order, not a time)
    models.served["det"].ready = False
    monkeypatch.setattr(frigate, "HELLO_WAIT_S", 0.3)
    assert json.loads(_ask(endpoint, hello)[0]) == {"model_available": True, "model_loaded": False}
