"""edgeinfer-gateway's gRPC front (Open Inference Protocol v2) driven by tritonclient, unmodified, against the real
daemon: the same fused graph as a camera's frame, every error code as a client meets it."""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import ROOT
from daemon_helpers import camera, daemon_log, results, start_daemon, stop_daemon, wait_for, write_config
from edgeinfer import __version__
from edgeinfer.cameras.synthetic import make_frames
from gateway_helpers import gateway_metrics_url, metric, start_gateway, write_gateway_config

tc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt)")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture
def served(tmp_path, children, bundles):
    """The daemon with the orientation classifier and the detector, a camera stream of each (the local ABI path)
    and a pool of each for the gateway (this process's user), and the gateway in front of them."""
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation"), "det": bundles("detector")},
                          streams=[{"name": "cam-o", "model": "orient"}, {"name": "cam-d", "model": "det"}],
                          pools={"gw-o": {"model": "orient", "user": uid, "streams": 2},
                                 "gw-d": {"model": "det", "user": uid, "streams": 2}},
                          runtime={"fault_injection": "true"})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, models={"orient": {"sizes": ["224x224", "320x240"]}})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    client = tc.InferenceServerClient(address)
    yield daemon, gateway, client, address, config, tmp_path
    client.close()


def test_a_normal_start_refuses_nothing(served):
    """Issue 35: every gateway start (and daemon restart) logged max_pending_per_user refusals: the gateway connects
    all its pools' streams at once (4 here, one user), more than the per-user cap of handshakes (2). A uid named
    for N streams may now hold N handshakes: the start refuses nothing and the daemon logs no refusal."""
    daemon, *_ = served
    pool = [f"gw-{m}-{i}" for m in "od" for i in range(2)]
    wait_for(lambda: all(metric(daemon.metrics_url, "edgeinfer_stream_connected", stream=s) == 1 for s in pool),
             timeout=30, what="the gateway's four pool streams connected")
    assert metric(daemon.metrics_url, "edgeinfer_ingress_refusals_total", reason="too_many_pending") == 0
    log = daemon_log(daemon)
    assert "refused" not in log and "max_pending" not in log, log


def _infer(client, model, frame, fmt="rgb24", **kw):
    inp = tc.InferInput(f"frame_{fmt}", list(frame.shape), "UINT8")
    inp.set_data_from_numpy(frame)
    return client.infer(model, [inp], **kw)


def _local(daemon, stream, frame, fmt="rgb24"):
    """The same frame bytes through the local ABI path: a camera's ring and its result ring."""
    h, w = frame.shape[:2]
    reader = results(daemon, stream)
    writer = camera(daemon, stream, w, h, fmt)
    try:
        writer.begin()[:] = frame
        fid = writer.publish()
        rec = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rec = reader.read(1.0)
            if rec is not None and rec.frame_id == fid:
                return rec
        pytest.fail(f"no result for stream {stream}")
    finally:
        writer.close()
        reader.close()


def test_tritonclient_gets_what_the_local_abi_path_publishes_bit_for_bit(served):
    daemon, gateway, client, *_ = served
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("orient") and client.is_model_ready("det")
    meta = client.get_model_metadata("orient", as_json=True)
    assert meta["inputs"] == [{"name": "frame_rgb24", "datatype": "UINT8", "shape": ["-1", "-1", "3"]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == \
        [("classes", "FP32", ["-1", "2"]), ("labels", "BYTES", ["-1"])]
    assert meta["versions"] == ["0.0.11"]
    det_meta = client.get_model_metadata("det", as_json=True)
    assert det_meta["inputs"][0]["shape"] == ["416", "416", "3"]
    server = client.get_server_metadata(as_json=True)
    assert (server["name"], server["version"]) == ("edgeinfer", __version__), server

    for (frame, _truth) in make_frames(224, 224, pages=1)[:4]:
        got = _infer(client, "orient", frame)
        local = _local(daemon, "cam-o", frame)
        rows = np.frombuffer(local.payload, np.float32, local.item_count * 2).reshape(-1, 2)
        assert got.as_numpy("classes").tobytes() == rows.tobytes()  # bit for bit
        labels = ["0", "90", "180", "270"]
        assert [b.decode() for b in got.as_numpy("labels")] == [labels[int(c)] for c in rows[:, 0]]
        assert got.get_response().model_version == local.model_version == "0.0.11"
    # Batched as [1, H, W, 3], another accepted size, and the typed contents instead of raw bytes.
    frame = make_frames(320, 240, pages=1)[1][0]
    local = _local(daemon, "cam-o", frame)
    got = _infer(client, "orient", frame[None])
    assert got.as_numpy("classes").tobytes() == \
        np.frombuffer(local.payload, np.float32, local.item_count * 2).tobytes()

    frame = make_frames(416, 416, pages=1)[0][0]
    got = _infer(client, "det", frame)
    local = _local(daemon, "cam-d", frame)
    rows = np.frombuffer(local.payload, np.float32, local.item_count * 6).reshape(-1, 6)
    assert len(rows) > 0 and got.as_numpy("detections").tobytes() == rows.tobytes()
    assert {b.decode() for b in got.as_numpy("labels")} == {"text"}


# ------------------------------------------------------------------ every error code, as a client meets it

def _status(call) -> tuple[str, str]:
    """(status code name, message) of a tritonclient call that must fail."""
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value.status(), e.value.message()


def _raw_infer(address: str, request) -> tuple[str, str]:
    """A hand-made ModelInferRequest (what tritonclient would refuse to build) through grpcio."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(request, timeout=10)
        except grpc.RpcError as e:
            return e.code().name, e.details()
    pytest.fail("a malformed request was answered")


def test_invalid_argument_and_not_found_say_what_was_expected(served):
    from tritonclient.grpc import service_pb2 as pb
    daemon, gateway, client, address, *_ = served
    frame = np.zeros((224, 224, 3), np.uint8)
    code, msg = _status(lambda: _infer(client, "orient", np.zeros((168, 224, 3), np.uint8)))
    assert code == "StatusCode.INVALID_ARGUMENT"  # 224x168: a size it does not take
    assert "224x168" in msg and "224x224, 320x240" in msg
    inp = tc.InferInput("frame_rgb24", [224, 224, 3], "FP32")
    inp.set_data_from_numpy(frame.astype(np.float32))
    code, msg = _status(lambda: client.infer("orient", [inp]))
    assert code == "StatusCode.INVALID_ARGUMENT" and "datatype 'FP32'" in msg and "UINT8" in msg
    code, msg = _status(lambda: _infer(client, "orient", np.zeros((224, 224, 4), np.uint8)))
    assert code == "StatusCode.INVALID_ARGUMENT" and "shape [224, 224, 4]" in msg
    code, msg = _status(lambda: _infer(client, "orient", frame, fmt="bgr24"))
    assert code == "StatusCode.INVALID_ARGUMENT" and "frame_rgb24" in msg
    code, msg = _status(lambda: _infer(client, "orient", frame,
                                       outputs=[tc.InferRequestedOutput("scores")]))
    assert code == "StatusCode.INVALID_ARGUMENT" and "no output scores" in msg and "classes" in msg
    # What tritonclient would not send: shapes and bytes that disagree.
    req = pb.ModelInferRequest(model_name="orient")
    req.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[224, 224, 3])
    req.raw_input_contents.append(b"\0" * (224 * 224 * 3 - 1))
    code, msg = _raw_infer(address, req)
    assert code == "INVALID_ARGUMENT" and "[150527] bytes" in msg and "150528 bytes" in msg
    req = pb.ModelInferRequest(model_name="orient")
    req.inputs.add(name="frame_rgb24", datatype="UINT8", shape=[224, -224, 3])
    assert _raw_infer(address, req)[0] == "INVALID_ARGUMENT"
    code, msg = _status(lambda: _infer(client, "nope", frame))
    assert code == "StatusCode.NOT_FOUND" and "orient" in msg and "det" in msg
    code, msg = _status(lambda: _infer(client, "orient", frame, model_version="9.9"))
    assert code == "StatusCode.NOT_FOUND" and "0.0.11" in msg
    code, _ = _status(lambda: client.get_model_metadata("nope"))
    assert code == "StatusCode.NOT_FOUND"
    assert _infer(client, "orient", frame, model_version="0.0.11").as_numpy("classes").shape[1] == 2
    url = gateway_metrics_url(gateway)
    assert metric(url, "edgeinfer_front_requests_total", front="grpc", code="INVALID_ARGUMENT") >= 7
    assert metric(url, "edgeinfer_front_refusals_total", front="grpc", reason="size") >= 1


def test_deadline_shedding_and_client_limit_when_the_lanes_stall(served):
    """While every lane stalls (the daemon's fault hook): a request whose deadline passes gets DEADLINE_EXCEEDED
    and its frame is never run (the daemon counts it stale, not processed); requests beyond the rings and their
    waiting room are shed at once (RESOURCE_EXHAUSTED); the front stays up and serves after."""
    daemon, gateway, client, address, *_ = served
    frame = np.zeros((416, 416, 3), np.uint8)
    processed_before = sum(metric(daemon.metrics_url, "edgeinfer_frames_total", stream=f"gw-d-{i}",
                                  outcome="processed") for i in range(2))
    # A pool's streams are marked (the p99 alert leaves them out: their latency is the request's age), a camera's not.
    assert metric(daemon.metrics_url, "edgeinfer_stream_pool", stream="gw-d-1", pool="gw-d") == 1
    assert metric(daemon.metrics_url, "edgeinfer_stream_pool", stream="cam-d") == 0
    daemon.send_signal(signal.SIGUSR1)  # every lane stops for a while (then is killed and restarted)
    time.sleep(0.3)
    outcomes, threads = [], []

    def one(timeout):
        try:
            _infer(client, "det", frame, client_timeout=timeout)
            outcomes.append("OK")
        except InferenceServerException as e:
            outcomes.append(e.status())
    url = gateway_metrics_url(gateway)
    for _ in range(2):  # both rings of the detector's pool, each frame waiting for a lane
        threads.append(threading.Thread(target=one, args=(1.5,)))
        threads[-1].start()
    wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="det") == 2, 10, "2 in flight")
    for _ in range(3):  # two more wait for a ring (the pool's streams: 2), the third is shed at once
        threads.append(threading.Thread(target=one, args=(1.5,)))
        threads[-1].start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes).count("StatusCode.DEADLINE_EXCEEDED") == 4, outcomes
    assert outcomes.count("StatusCode.RESOURCE_EXHAUSTED") == 1, outcomes
    assert metric(url, "edgeinfer_front_refusals_total", front="grpc", reason="shed") == 1
    # Served again once the lanes are back; the two frames that waited past their deadline were never run.
    wait_for(lambda: _ok(client, "det", frame), 60, "the detector answering again")
    stale = sum(metric(daemon.metrics_url, "edgeinfer_frames_total", stream=f"gw-d-{i}", outcome=o)
                for i in range(2) for o in ("stale", "overload"))
    processed = sum(metric(daemon.metrics_url, "edgeinfer_frames_total", stream=f"gw-d-{i}", outcome="processed")
                    for i in range(2))
    assert stale >= 2
    assert processed - processed_before == 1  # the answer above, nothing of the requests that timed out


def _http(url: str) -> int:
    import urllib.error
    import urllib.request
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def _ok(client, model, frame) -> bool:
    try:
        _infer(client, model, frame, client_timeout=5)
        return True
    except InferenceServerException:
        return False


def test_unavailable_while_the_daemon_restarts_then_served_again(served, children):
    daemon, gateway, client, address, config, tmp_path = served
    frame = np.zeros((224, 224, 3), np.uint8)
    assert _ok(client, "orient", frame)
    url = gateway_metrics_url(gateway)
    assert _http(url + "/readyz") == 200 and _http(url + "/healthz") == 200
    assert stop_daemon(daemon) == 0
    code, msg = _status(lambda: _infer(client, "orient", frame, client_timeout=5))
    assert code == "StatusCode.UNAVAILABLE" and "retry" in msg
    assert gateway.poll() is None  # the front is not taken down with the daemon
    wait_for(lambda: not client.is_model_ready("orient"), 10, "ModelReady false while the daemon is gone")
    assert _http(url + "/readyz") == 503 and _http(url + "/healthz") == 200  # alive, not ready
    start_daemon(children, config, log_file=str(tmp_path / "daemon2.log"))
    wait_for(lambda: _ok(client, "orient", frame), 60, "the gateway serving through the new daemon")
    wait_for(lambda: client.is_model_ready("orient"), 15, "every ring of the model reconnected")
    # /readyz is every served model's (this gateway serves two): the other's rings reconnect on their own turn.
    wait_for(lambda: _http(url + "/readyz") == 200, 15, "/readyz once every model's rings reconnected")
    assert metric(url, "edgeinfer_front_requests_total", front="grpc", code="UNAVAILABLE") >= 1


def _stalled_pool(tmp_path, children, bundles, streams: int, **gateway_options):
    """A daemon serving model orient to the gateway through a pool of `streams` rings, its lanes stalled
    (fault injection: SIGUSR1), and a gateway in front (`gateway_options`: its file's sections). Returns the
    gateway's process, its gRPC address and a tritonclient on it."""
    config = write_config(tmp_path, None, models={"orient": bundles("orientation")}, streams=[],
                          pools={"gw": {"model": "orient", "user": os.getuid(), "streams": streams}},
                          runtime={"fault_injection": "true"})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, **gateway_options)
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    client = tc.InferenceServerClient(address)
    daemon.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    return gateway, address, client


def test_client_limit(tmp_path, children, bundles):
    """A client (by address here; by certificate subject under mTLS) with max_inflight_per_client requests in
    flight gets RESOURCE_EXHAUSTED for the next, while another model's rings are free."""
    gateway, address, client = _stalled_pool(tmp_path, children, bundles, 4, grpc={"max_inflight_per_client": 2})
    frame = np.zeros((224, 224, 3), np.uint8)
    outcomes = []

    def one():
        try:
            _infer(client, "orient", frame, client_timeout=2.0)
            outcomes.append("OK")
        except InferenceServerException as e:
            outcomes.append((e.status(), e.message()))
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    url = gateway_metrics_url(gateway)
    wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 2, 10, "2 in flight")
    code, msg = _status(lambda: _infer(client, "orient", frame, client_timeout=2.0))
    for t in threads:
        t.join(30)
    assert code == "StatusCode.RESOURCE_EXHAUSTED" and "max_inflight_per_client" in msg, (code, msg, outcomes)
    assert metric(url, "edgeinfer_front_refusals_total", reason="client_limit") == 1
    client.close()


def test_a_full_pool_sheds_at_the_headers_with_a_retry_hint(tmp_path, children, bundles):
    """Issue 35 item 11: a shed request cost the gateway its message (read, parsed, a handler thread), enough that
    clients retrying at once ate the capacity shedding protects. When every model's rings are busy and their line
    is full, ModelInfer is refused at its HEADERS: a call whose message has not even been sent gets
    RESOURCE_EXHAUSTED, with grpc-retry-pushback-ms (the hint gRPC's retry policy honours); metadata calls are
    still served. A model with room sheds nothing at the headers (test_deadline_shedding_...: the handler's shed,
    which carries the same hint)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    # The lanes stall: the one ring stays busy with the holder's frame.
    gateway, address, client = _stalled_pool(tmp_path, children, bundles, 1, models={"orient": {"max_waiting": 0}})
    frame = np.zeros((224, 224, 3), np.uint8)
    outcomes = []

    def hold():
        try:
            _infer(client, "orient", frame, client_timeout=3.0)
            outcomes.append("OK")
        except InferenceServerException as e:
            outcomes.append(e.status())
    holder = threading.Thread(target=hold)
    holder.start()
    url = gateway_metrics_url(gateway)
    never = threading.Event()
    try:
        wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 1, 10, "1 held")
        with grpc.insecure_channel(address) as channel:
            call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                                        request_serializer=pb.ModelInferRequest.SerializeToString,
                                        response_deserializer=pb.ModelInferResponse.FromString)

            def no_message():  # the request's HEADERS go out; its message never does
                never.wait(10)
                return
                yield
            with pytest.raises(grpc.RpcError) as e:
                call(no_message(), timeout=5)
            trailers = dict(e.value.trailing_metadata() or ())
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
            assert "busy" in e.value.details() and not never.is_set()
            assert int(trailers["grpc-retry-pushback-ms"]) >= 1, trailers
        assert client.is_server_live() and client.get_model_metadata("orient").name == "orient"
        assert metric(url, "edgeinfer_front_refusals_total", front="grpc", reason="shed") == 1
    finally:
        never.set()
        holder.join(30)
        client.close()
    assert outcomes == ["StatusCode.DEADLINE_EXCEEDED"], outcomes


def _process_tree(pid: int) -> list[int]:
    """pid and its descendants (the daemon's lanes are processes of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], []))
    return out


def test_a_request_whose_deadline_is_shorter_than_its_wait_is_refused_at_once_never_run(tmp_path, children,
                                                                                       bundles):
    """Issue 35 item 11: under overload most lost goodput was DEADLINE_EXCEEDED: requests admitted with less
    deadline left than the line ahead needed waited, then held a ring, for an answer nobody read. A request whose
    deadline (grpc-timeout, known at its HEADERS) is shorter than its expected wait and run (the line ahead on the
    rings, at the pace the pool measured) is refused at once: RESOURCE_EXHAUSTED (retry later, with
    grpc-retry-pushback-ms; DEADLINE_EXCEEDED is kept for a deadline that passed), its message unread, never run.
    The daemon is stopped (SIGSTOP, its lanes too) so that the ring stays busy: a first request held it until its
    deadline, which sets the pool's pace; then one holds the ring and one waits (there is room in the line)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation")}, streams=[],
                          pools={"gw": {"model": "orient", "user": uid, "streams": 1}},
                          runtime={"lane_hang_s": 60})  # stopped for ~7 s: no lane is taken for hung after
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, models={"orient": {"max_waiting": 4}})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    client = tc.InferenceServerClient(address)
    frame = np.zeros((224, 224, 3), np.uint8)
    url = gateway_metrics_url(gateway)
    wait_for(lambda: _ok(client, "orient", frame), 60, "the classifier answering")

    def processed() -> float:
        return metric(daemon.metrics_url, "edgeinfer_frames_total", stream="gw-0", outcome="processed")
    # The daemon's counts lag its answers: every frame so far (the warm-up and the answers) counted first.
    wait_for(lambda: processed() >= 1 + metric(url, "edgeinfer_front_requests_total", front="grpc", code="OK"), 15,
             "the daemon's count of the frames answered")
    processed_before = processed()
    outcomes = []

    def one(timeout):
        try:
            _infer(client, "orient", frame, client_timeout=timeout)
            outcomes.append("OK")
        except InferenceServerException as e:
            outcomes.append(e.status())
    stopped = _process_tree(daemon.pid)
    never = threading.Event()
    threads = []
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        one(3.0)  # holds the ring until its deadline (and the grace): the pool's pace is now a large share of 3 s
        wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 0, 10, "released")
        for n in (1, 2):  # one holds the ring, one waits for it: an answer now is (1/1 + 1) x the pace away
            threads.append(threading.Thread(target=one, args=(3.0,)))
            threads[-1].start()
            wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == n, 10,
                     f"{n} in flight")
        # At its HEADERS: the message of this call is never even sent.
        with grpc.insecure_channel(address) as channel:
            call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                                        request_serializer=pb.ModelInferRequest.SerializeToString,
                                        response_deserializer=pb.ModelInferResponse.FromString)

            def no_message():
                never.wait(10)
                return
                yield
            with pytest.raises(grpc.RpcError) as e:
                call(no_message(), timeout=0.3)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
            assert "deadline" in e.value.details() and not never.is_set()
            assert int(dict(e.value.trailing_metadata() or ())["grpc-retry-pushback-ms"]) >= 1
        # The same for tritonclient as a user calls it.
        code, msg = _status(lambda: _infer(client, "orient", frame, client_timeout=0.3))
        assert code == "StatusCode.RESOURCE_EXHAUSTED" and "deadline" in msg, (code, msg)
        assert metric(url, "edgeinfer_front_refusals_total", front="grpc", reason="deadline_short") == 2
        assert metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 2  # nobody else got in
    finally:
        never.set()
        for t in threads:
            t.join(30)
        try:  # the gateway's side done too (it waits out the deadline's grace after the client's gave up)
            wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 0, 10,
                     "the held requests answered")
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    assert outcomes == ["StatusCode.DEADLINE_EXCEEDED"] * 3, outcomes
    wait_for(lambda: _ok(client, "orient", frame), 60, "the classifier answering again")
    # Nothing of the requests refused or timed out was run: the answers after are all the daemon processed.
    answers_after = metric(url, "edgeinfer_front_requests_total", front="grpc", code="OK") - (processed_before - 1)
    wait_for(lambda: processed() - processed_before >= answers_after, 15, "the daemon's count of the answer")
    assert processed() - processed_before == answers_after == 1
    client.close()


# ------------------------------------------------------------------ TLS and mutual TLS

def _pki(tmp_path):
    """A CA, the server's certificate (for 127.0.0.1 / localhost), and two clients' (CN alice, CN bob), as PEM files;
    and a client certificate of another CA."""
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, ca=False, sans=()):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(stem, key, crt):
        (tmp_path / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                                 serialization.PrivateFormat.PKCS8,
                                                                 serialization.NoEncryption()))
        (tmp_path / f"{stem}.crt").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    out = {}
    for ca_name in ("ca", "other-ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        write(ca_name, ca_key, cert(ca_name, ca_key, ca_name, ca_key, ca=True))
        out[ca_name] = ca_key
    ca_key = out["ca"]
    key = ec.generate_private_key(ec.SECP256R1())
    write("server", key, cert("edgeinfer", key, "ca", ca_key, sans=(x509.DNSName("localhost"),
                                                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1")))))
    for cn, issuer in (("alice", "ca"), ("bob", "ca"), ("mallory", "other-ca")):
        key = ec.generate_private_key(ec.SECP256R1())
        write(cn, key, cert(cn, key, issuer, out[issuer]))
    return {k: str(tmp_path / k) for k in ("ca", "server", "alice", "bob", "mallory")}


def test_mutual_tls_serves_clients_the_ca_signed_and_no_other(tmp_path, children, bundles):
    pki = _pki(tmp_path)
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation")}, streams=[],
                          pools={"gw": {"model": "orient", "user": uid, "streams": 2}},
                          runtime={"fault_injection": "true"})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, grpc={
        "tls": {"cert": pki["server"] + ".crt", "key": pki["server"] + ".key", "client_ca": pki["ca"] + ".crt"},
        "max_inflight_per_client": 1})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"), wait_ready=0)
    frame = np.zeros((224, 224, 3), np.uint8)

    def client(who):
        kw = {"root_certificates": pki["ca"] + ".crt"}
        if who:
            kw.update(private_key=pki[who] + ".key", certificate_chain=pki[who] + ".crt")
        return tc.InferenceServerClient(address, ssl=True, **kw)
    alice = client("alice")
    wait_for(lambda: _ready(alice), 90, "the gateway ready over mutual TLS")
    # docs/operations/gateway.md's TLS client, word for word (its address and files made this test's).
    doc = (ROOT / "docs/operations/gateway.md").read_text()
    snippet = doc[doc.index("With `grpc.tls` set in gateway.yaml"):]
    snippet = snippet[snippet.index("```python\n") + 10:]
    snippet = snippet[:snippet.index("```")]
    for was, now in (("gateway.example:8001", address), ('"ca.crt"', repr(pki["ca"] + ".crt")),
                     ('"client.key"', repr(pki["alice"] + ".key")), ('"client.crt"', repr(pki["alice"] + ".crt"))):
        assert was in snippet, was
        snippet = snippet.replace(was, now)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "gateway.md", "exec"), {})
    assert printed.getvalue() == "True\n", printed.getvalue()
    assert alice.infer("orient", [_input(frame)]).as_numpy("classes").shape[1] == 2
    for who in (None, "mallory"):  # no certificate; a certificate of another CA
        c = client(who)
        code, _ = _status(lambda: c.infer("orient", [_input(frame)], client_timeout=5))
        assert code == "StatusCode.UNAVAILABLE"  # the TLS handshake fails: nothing reaches the front
        c.close()
    plain = tc.InferenceServerClient(address)
    assert _status(lambda: plain.is_server_live(client_timeout=5))[0] == "StatusCode.UNAVAILABLE"
    plain.close()
    # The per-client limit counts by certificate subject: alice and bob (one address) each get their one request.
    url = gateway_metrics_url(gateway)
    bob = client("bob")
    daemon.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    outcomes = []

    def one(c):
        try:
            c.infer("orient", [_input(frame)], client_timeout=3)
            outcomes.append("OK")
        except InferenceServerException as e:
            outcomes.append(e.status())
    threads = [threading.Thread(target=one, args=(c,)) for c in (alice, bob)]
    for th in threads:
        th.start()
    wait_for(lambda: metric(url, "edgeinfer_front_in_flight", front="grpc", model="orient") == 2, 10,
             "alice and bob in flight at once")
    code, msg = _status(lambda: alice.infer("orient", [_input(frame)], client_timeout=3))
    assert code == "StatusCode.RESOURCE_EXHAUSTED" and "max_inflight_per_client" in msg
    for th in threads:
        th.join(30)
    alice.close()
    bob.close()


def _ready(client) -> bool:
    try:
        return client.is_server_ready(client_timeout=2)
    except InferenceServerException:
        return False


def _input(frame):
    inp = tc.InferInput("frame_rgb24", list(frame.shape), "UINT8")
    inp.set_data_from_numpy(frame)
    return inp


# ------------------------------------------------------------------ batching across a front's rings

def test_a_batching_model_batches_the_fronts_ready_requests(tmp_path, children, bundles):
    """batch: 4 on one lane; 8 clients at once: the lane runs the pool's ready frames of one size as one batch
    (counted), and every answer equals that frame's answer alone (compared with the gateway's own, unbatched)."""
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": {"bundle": bundles("orientation"), "batch": 4}},
                          streams=[], pools={"gw": {"model": "orient", "user": uid, "streams": 4}},
                          lanes=[{"cpus": [sorted(os.sched_getaffinity(0))[-1]]}])
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config)
    start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    frames = [f for f, _ in make_frames(224, 224, pages=2)]
    alone = []
    with tc.InferenceServerClient(address) as c:
        for f in frames:  # one at a time: no batch can form
            alone.append(_infer(c, "orient", f).as_numpy("classes"))
    batches_before = metric(daemon.metrics_url, "edgeinfer_lane_batches_total")
    got: dict[int, list] = {i: [] for i in range(len(frames))}

    def client(k: int):
        with tc.InferenceServerClient(address) as c:
            for i in range(12):
                j = (i + k) % len(frames)
                got[j].append(_infer(c, "orient", frames[j], client_timeout=30).as_numpy("classes"))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(len(v) for v in got.values()) == 96
    for j, answers in got.items():
        for a in answers:
            assert (a[:, 0] == alone[j][:, 0]).all()  # the same classes, in the same order
            np.testing.assert_allclose(a[:, 1], alone[j][:, 1], atol=1e-5)
    assert metric(daemon.metrics_url, "edgeinfer_lane_batches_total") > batches_before


def _launch(children, cfg: str, fds: list[tuple[int, str]], env: dict, log: str):
    """edgeinferd started as systemd starts it: `fds` [(fd, name)] from fd 3 on (the socket unit's listeners, then
    the fd store), NOTIFY_SOCKET in env, its log to `log`."""
    from test_systemd_notify import LAUNCH_WITH_FDS
    from daemon_helpers import edgeinferd_args
    with open(log, "a") as f:
        return children.spawn([sys.executable, "-c", LAUNCH_WITH_FDS, ",".join(str(fd) for fd, _ in fds),
                               ":".join(name for _, name in fds), *edgeinferd_args(cfg)[1:]], env=env,
                              pass_fds=[fd for fd, _ in fds], stdout=subprocess.DEVNULL, stderr=f)


def test_a_daemon_stopped_and_restarted_under_load_is_unavailable_at_once_never_a_deadline(tmp_path, children,
                                                                                           bundles):
    """systemctl restart edgeinferd as it happens on a host: the daemon's sockets held by its socket unit, the
    gateway's frame rings and their connections held by the fd store (so the gateway's producer connections never
    close), the daemon stopped (SIGTERM) under load from tritonclient clients (deadline 30 s, longer than the gap) and a
    Frigate REQ client, then started again with the stored fds. Every request is answered OK or UNAVAILABLE (at
    once, with a message), none DEADLINE_EXCEEDED; Frigate's client gets its error frame, never a timeout; answers
    resume after the restart. The gap is printed (timing is not asserted)."""
    import socket as socketlib

    import zmq
    from test_systemd_notify import FakeSystemd
    from daemon_helpers import sockets
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation"), "det": bundles("detector")},
                          streams=[{"name": "cam-o", "model": "orient"}],
                          pools={"gw-o": {"model": "orient", "user": uid, "streams": 2},
                                 "gw-d": {"model": "det", "user": uid, "streams": 2}})
    sd = FakeSystemd(tmp_path / "notify")
    listeners = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        for path in sockets(config):  # edgeinferd.socket: the listeners outlive the daemon
            s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET)
            s.bind(path)
            s.listen(128)
            listeners.append(s)
        unit_fds = [(s.fileno(), "edgeinferd.socket") for s in listeners]
        env = {**os.environ, "NOTIFY_SOCKET": sd.path}

        def pump():  # as systemd, always reading: a notify socket left full blocks the daemon's sends
            while not stop.is_set():
                sd.pump(0.1)
        threads.append(threading.Thread(target=pump))
        threads[-1].start()
        first = _launch(children, config, unit_fds, env, str(tmp_path / "daemon.log"))
        wait_for(lambda: sd.times("READY=1"), 90, "the first daemon READY=1")
        endpoint = f"ipc://{tmp_path}/fr.sock"
        gw_config, address = write_gateway_config(tmp_path, config, frigate={"enabled": True, "endpoint": endpoint,
                                                                              "model": "det", "timeout_ms": 5000})
        gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
        client = tc.InferenceServerClient(address)
        frame = np.zeros((224, 224, 3), np.uint8)
        region = np.zeros((1, 416, 416, 3), np.uint8)
        wait_for(lambda: _ok(client, "orient", frame) and _ok(client, "det", np.zeros((416, 416, 3), np.uint8)),
                 60, "both models answering")
        stored = [f"{k}.gw-{m}-{i}" for k in ("ring", "conn") for m in "od" for i in range(2)]
        deadline = time.monotonic() + 30
        while not all(sd.fds_named(n) for n in stored):  # every ring of the gateway's, in the fd store
            assert time.monotonic() < deadline, [m for _, m, _ in sd.stored]
            time.sleep(0.1)

        log: list[tuple[str, float, float, str, str]] = []  # (front, sent, answered, outcome, message)

        def grpc_client(model, shape):
            c = tc.InferenceServerClient(address)
            f = np.zeros(shape, np.uint8)
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    _infer(c, model, f, client_timeout=30)
                    log.append(("grpc", sent, time.monotonic(), "OK", ""))
                except InferenceServerException as e:
                    log.append(("grpc", sent, time.monotonic(), str(e.status()), e.message()))
                    time.sleep(0.02)
            c.close()

        def frigate_client():
            with zmq.Context() as ctx:
                s = None
                while not stop.is_set():
                    if s is None:  # as Frigate: a new REQ after any error
                        s = ctx.socket(zmq.REQ)
                        for opt in (zmq.RCVTIMEO, zmq.SNDTIMEO):
                            s.setsockopt(opt, 10000)
                        s.setsockopt(zmq.LINGER, 0)
                        s.connect(endpoint)
                    sent = time.monotonic()
                    try:
                        s.send_multipart([json.dumps({"shape": [1, 416, 416, 3], "dtype": "uint8"}).encode(),
                                          region.tobytes()])
                        reply = s.recv_multipart()
                    except zmq.Again:
                        log.append(("frigate", sent, time.monotonic(), "TIMEOUT", ""))
                        s.close()
                        s = None
                        continue
                    if len(reply) == 1 and len(reply[0]) == 480:
                        log.append(("frigate", sent, time.monotonic(), "OK", ""))
                    else:
                        said = json.loads(reply[0])
                        log.append(("frigate", sent, time.monotonic(), said.get("code", "?"), said.get("error", "")))
                        time.sleep(0.02)
                if s is not None:
                    s.close()

        clients = [threading.Thread(target=grpc_client, args=a) for a in
                   [("orient", (224, 224, 3)), ("orient", (224, 224, 3)), ("det", (416, 416, 3))]]
        clients.append(threading.Thread(target=frigate_client))
        for t in clients:
            t.start()
        threads += clients
        time.sleep(1.0)
        killed = time.monotonic()
        first.send_signal(signal.SIGTERM)  # systemctl restart: stop (the fd store keeps the rings), then start
        assert first.wait(30) == 0
        gone = time.monotonic()
        time.sleep(1.5)  # down a while, as systemd's stop and start take
        fds = [(sd.fds_named(n)[-1][0], n) for n in stored]
        started = time.monotonic()
        _launch(children, config, [*unit_fds, *fds], env, str(tmp_path / "daemon2.log"))
        ready_at = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(0.05)
            ready_at = next((t for t in sd.times("READY=1", since=started)), None)
            back = {front for front, sent, _, outcome, _ in list(log) if sent > started and outcome == "OK"}
            if ready_at is not None and back == {"grpc", "frigate"}:
                break
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(40)
        client.close()
        after = [x for x in log if x[2] > killed]
        outcomes = collections.Counter((front, outcome) for front, _, _, outcome, _ in after)
        unavailable = [x for x in after if x[3] in ("StatusCode.UNAVAILABLE", "UNAVAILABLE")]
        first_ok = min((x[2] for x in after if x[3] == "OK" and x[1] > gone), default=float("nan"))
        slowest_unavailable = max((x[2] - x[1] for x in unavailable), default=float("nan"))
        print(f"\nrestart under load: outcomes {dict(outcomes)}; SIGTERM → daemon exited {gone - killed:.2f} s; gap "
              f"(exited → first answer to a request sent after) {first_ok - gone:.2f} s, of which down "
              f"{started - gone:.2f} s and the new daemon's start to READY=1 "
              f"{(ready_at or float('nan')) - started:.2f} s; READY=1 → first answer "
              f"{first_ok - (ready_at or float('nan')):.2f} s; slowest UNAVAILABLE answer {slowest_unavailable:.3f} s")
        assert not [x for x in after if "DEADLINE" in x[3] or x[3] == "TIMEOUT"], outcomes
        assert outcomes[("grpc", "StatusCode.UNAVAILABLE")] >= 1 and outcomes[("frigate", "UNAVAILABLE")] >= 1, outcomes
        assert all("retry" in x[4] and "edgeinferd" in x[4] for x in unavailable), unavailable[:3]
        assert {o for _, o in outcomes} <= {"OK", "StatusCode.UNAVAILABLE", "UNAVAILABLE"}, outcomes
        assert ready_at is not None and {f for f, s, _, o, _ in after if o == "OK" and s > started} == \
            {"grpc", "frigate"}, outcomes
        assert gateway.poll() is None
    finally:
        stop.set()
        for t in threads:
            t.join(40)
        sd.close()
        for s in listeners:
            s.close()


def test_repository_index_and_the_extensions_not_served_answer_without_a_traceback(served):
    """Triton's tools ask get_model_repository_index() first: the models served with their version and state.
    Load and unload, not served, are UNIMPLEMENTED with a message; none of it logs an error or a traceback."""
    daemon, gateway, client, *_ = served
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"]: m["state"] for m in index} == {"det": "READY", "orient": "READY"}, index
    assert all(m.get("version") for m in index) and {m["name"]: m["version"] for m in index}["orient"] == "0.0.11"
    for call in (lambda: client.load_model("orient"), lambda: client.unload_model("orient"),
                 lambda: client.get_model_config("orient"), lambda: client.get_inference_statistics("orient")):
        code, msg = _status(call)
        assert code == "StatusCode.UNIMPLEMENTED" and "not served by edgeinfer's gateway" in msg, (code, msg)
    from gateway_helpers import gateway_log
    text = gateway_log(gateway)
    assert "Traceback" not in text and " ERROR " not in text, text[-2000:]


def test_a_request_that_can_never_succeed_is_invalid_argument_with_the_limit(served):
    """A wrong datatype is INVALID_ARGUMENT for the classifier and for the detector alike, though the detector's
    FP32 frame is larger than any request it takes (it reaches the handler: gRPC's own limit is higher, and gRPC's
    RESOURCE_EXHAUSTED would tell the client to retry); the message says the limit. So is a frame too large."""
    daemon, gateway, client, *_ = served
    for model, shape in (("orient", (224, 224, 3)), ("det", (416, 416, 3))):
        inp = tc.InferInput("frame_rgb24", list(shape), "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        code, msg = _status(lambda: client.infer(model, [inp]))
        assert code == "StatusCode.INVALID_ARGUMENT", (model, code, msg)
        assert "datatype 'FP32'" in msg or "the largest this server takes is" in msg, msg
    code, msg = _status(lambda: _infer(client, "det", np.zeros((800, 800, 3), np.uint8)))
    limit = 416 * 416 * 3 + (1 << 20)
    assert code == "StatusCode.INVALID_ARGUMENT" and f"the largest this server takes is {limit} bytes" in msg, msg
    assert _ok(client, "det", np.zeros((416, 416, 3), np.uint8))
