"""edgeinfer-gateway's gRPC front (Open Inference Protocol v2) driven by tritonclient, unmodified, against the real
daemon: the same fused graph as a camera's frame, every error code as a client meets it."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from daemon_helpers import camera, results, start_daemon, stop_daemon, wait_for, write_config
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
    assert client.get_server_metadata(as_json=True)["name"] == "edgeinfer"

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
    assert _http(url + "/readyz") == 200
    assert metric(url, "edgeinfer_front_requests_total", front="grpc", code="UNAVAILABLE") >= 1


def test_client_limit(tmp_path, children, bundles):
    """A client (by address here; by certificate subject under mTLS) with max_inflight_per_client requests in
    flight gets RESOURCE_EXHAUSTED for the next, while another model's rings are free."""
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation")}, streams=[],
                          pools={"gw": {"model": "orient", "user": uid, "streams": 4}},
                          runtime={"fault_injection": "true"})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, grpc={"max_inflight_per_client": 2})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    client = tc.InferenceServerClient(address)
    frame = np.zeros((224, 224, 3), np.uint8)
    daemon.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
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
