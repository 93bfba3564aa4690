"""edgeinfer-gateway's Frigate front against the real daemon and the real detector, driven by a client of our own
written from the protocol of Frigate's `zmq` detector (REQ: hello, upload, detection; the reply one frame of
float32 [20, 6] rows of [class_id, score, ymin, xmin, ymax, xmax]), and by a raw DEALER where a REQ would hide
what the front sends."""
from __future__ import annotations

import grp
import json
import os
import re
import signal
import stat
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
import zmq

from daemon_helpers import camera, daemon_log, results, start_daemon, wait_for, write_config
from edgeinfer.cameras.synthetic import make_frames
from gateway_helpers import gateway_log, start_gateway, write_gateway_config

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt): start_gateway waits "
                    "with it")

REPLY = 20 * 6 * 4
RINGS = 3  # the gateway's pool: requests in flight at once
W = H = 416  # the detector bundle's input


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def served(tmp_path, children, bundles):
    """served(timeout_ms): the daemon with the detector, a camera stream of it (the local ABI path) and a pool of 3
    streams for the gateway; the gateway with its Frigate front on an ipc:// socket in a directory it makes."""
    def start(timeout_ms: int = 2000):
        uid = os.getuid()
        config = write_config(tmp_path, None, models={"det": bundles("detector")},
                              streams=[{"name": "cam-d", "model": "det"}],
                              pools={"gw-d": {"model": "det", "user": uid, "streams": RINGS}},
                              runtime={"fault_injection": "true", "lane_hang_s": 2.0})
        daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
        sock = tmp_path / "frigate-run" / "detector.sock"
        assert len(str(sock)) <= 107
        endpoint = f"ipc://{sock}"
        gw_config, address = write_gateway_config(tmp_path, config, frigate={
            "enabled": True, "endpoint": endpoint, "timeout_ms": timeout_ms, "socket_mode": "0660",
            "socket_group": _other_group()})
        gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
        # Ready is one ring answering; the pool's others may still wait their turn at the daemon's ingress (a
        # request landing there meanwhile is answered UNAVAILABLE). Requests one after another take the rings in
        # turn: once RINGS in a row are answered, each ring is.
        frame = make_frames(W, H, pages=1)[0][0]
        answered, deadline = 0, time.monotonic() + 60
        with zmq.Context() as ctx:
            while answered < RINGS:
                assert time.monotonic() < deadline, f"the gateway's rings did not all answer: {gateway_log(gateway)}"
                s = _req(ctx, endpoint)
                try:
                    s.send_multipart(_request(frame[None]))
                    reply = s.recv_multipart()
                    answered = answered + 1 if len(reply) == 1 and len(reply[0]) == REPLY else 0
                except zmq.Again:
                    answered = 0
                finally:
                    s.close()
        gateway.baseline = _metrics(gateway)  # what the tests count, they count from here
        return daemon, gateway, endpoint
    return start


def _other_group() -> str:
    for name in ("nogroup", "nobody", "daemon", "bin"):
        try:
            grp.getgrnam(name)
            return name
        except KeyError:
            pass
    return grp.getgrgid(os.getgid()).gr_name


def _req(ctx, endpoint: str, timeout_ms: int = 10000):
    """A REQ socket as Frigate's detector makes one: send and receive time out, nothing lingers."""
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    s.setsockopt(zmq.SNDTIMEO, timeout_ms)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _request(frame: np.ndarray) -> list[bytes]:
    header = {"shape": list(frame.shape), "dtype": str(frame.dtype), "model_type": "ssd"}
    return [json.dumps(header).encode(), np.ascontiguousarray(frame).tobytes()]


def _rows(reply: list[bytes]) -> np.ndarray:
    assert len(reply) == 1 and len(reply[0]) == REPLY, [len(f) for f in reply]
    return np.frombuffer(reply[0], np.float32).reshape(20, 6)


def _json(reply: list[bytes]) -> dict:
    assert len(reply) == 1 and len(reply[0]) != REPLY
    return json.loads(reply[0])


def _local(daemon, frame: np.ndarray):
    """The same frame through the local ABI path: a camera's ring on the detector and its result ring."""
    reader = results(daemon, "cam-d")
    writer = camera(daemon, "cam-d", W, H, "rgb24")
    try:
        writer.begin()[:] = frame
        fid = writer.publish()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rec = reader.read(1.0)
            if rec is not None and rec.frame_id == fid:
                return rec
        pytest.fail("no result for stream cam-d")
    finally:
        writer.close()
        reader.close()


def _expected(rec, width: int, height: int) -> np.ndarray:
    """Frigate's rows from a detection record, as the protocol says: rows (x1, y1, x2, y2, score, class) in pixels
    become [class, score, ymin, xmin, ymax, xmax] normalised to the frame, highest score first, 20 rows, zeros
    after the last."""
    rows = np.frombuffer(rec.payload, np.float32, rec.item_count * 6).reshape(-1, 6).astype(np.float64)
    rows = sorted(rows.tolist(), key=lambda r: -r[4])[:20]
    out = np.zeros((20, 6), np.float64)
    for i, (x1, y1, x2, y2, score, cls) in enumerate(rows):
        out[i] = [cls, score, min(max(y1 / height, 0), 1), min(max(x1 / width, 0), 1),
                  min(max(y2 / height, 0), 1), min(max(x2 / width, 0), 1)]
    return out


def _metrics(gateway) -> dict[tuple[str, tuple], float]:
    """The gateway's /metrics (its address from its log) as {(name, sorted labels): value}."""
    m = re.search(r"gateway metrics and health on (http://\S+)", gateway_log(gateway))
    assert m, gateway_log(gateway)
    text = urllib.request.urlopen(m.group(1) + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        hit = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        if hit:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', hit.group(2))))
            out[(hit.group(1), labels)] = float(hit.group(3))
    return out


def _count(metrics, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def _since(gateway, name: str, **labels) -> float:
    """A counter of the gateway's /metrics since the fixture's warm-up."""
    return _count(_metrics(gateway), name, **labels) - _count(gateway.baseline, name, **labels)


def test_hello_socket_and_three_frigate_detectors_at_once(served, zctx):
    _, gateway, endpoint = served()
    path = endpoint[6:]
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == grp.getgrnam(_other_group()).gr_gid

    # (b) The hello of each detector process, whatever its model file: available and loaded. Logged once a name.
    s = _req(zctx, endpoint)
    for _ in range(2):
        s.send_multipart([json.dumps({"model_request": True, "model_name": "yolov9-t-320.onnx"}).encode()])
        assert _json(s.recv_multipart()) == {"model_available": True, "model_loaded": True}
    s.close()
    log = gateway_log(gateway)
    assert log.count("Frigate's model 'yolov9-t-320.onnx' is served by model det") == 1, log

    # (a) Three detector processes at once, each its REQ socket: each gets its answer, the same for the same frame.
    frame = make_frames(W, H, pages=1)[0][0]
    answers: dict[int, object] = {}
    barrier = threading.Barrier(3)

    def detector(i: int) -> None:
        sock = _req(zctx, endpoint)
        try:
            barrier.wait(10)
            sock.send_multipart([json.dumps({"model_request": True, "model_name": "m.onnx"}).encode()])
            hello = _json(sock.recv_multipart())
            sock.send_multipart(_request(frame[None]))
            answers[i] = (hello, sock.recv_multipart())
        except Exception as e:  # noqa: BLE001 — reported below
            answers[i] = e
        finally:
            sock.close()
    threads = [threading.Thread(target=detector, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(answers) == [0, 1, 2], answers
    got = []
    for i, a in answers.items():
        assert not isinstance(a, Exception), (i, a)
        assert a[0] == {"model_available": True, "model_loaded": True}
        got.append(_rows(a[1]))
    assert got[0].any() and all(np.array_equal(g, got[0]) for g in got)
    assert _since(gateway, "edgeinfer_front_requests_total", front="frigate", model="det", code="OK") == 3


def test_an_upload_is_refused_and_said_in_the_log(served, zctx):
    _, gateway, endpoint = served()
    s = _req(zctx, endpoint)
    s.send_multipart([json.dumps({"model_data": True, "model_name": "custom.onnx"}).encode(), os.urandom(4096)])
    answer = _json(s.recv_multipart())
    assert answer["model_saved"] is False and answer["model_loaded"] is False and "signed" in answer["error"]
    # The same socket goes on: the hello still says the model is there.
    s.send_multipart([json.dumps({"model_request": True, "model_name": "custom.onnx"}).encode()])
    assert _json(s.recv_multipart()) == {"model_available": True, "model_loaded": True}
    s.close()
    log = gateway_log(gateway)
    assert re.search(r"Frigate sent model file 'custom.onnx' \(4096 bytes\) to be loaded: refused\. edgeinfer serves "
                     r"only signed bundles: configure the model in edgeinferd.yaml", log), log
    assert _since(gateway, "edgeinfer_front_refusals_total", front="frigate", reason="upload") == 1


def test_the_rows_are_the_local_abi_paths_detections_normalised_and_sorted(served, zctx):
    daemon, _, endpoint = served()
    s = _req(zctx, endpoint)
    seen = 0
    for frame, _ in make_frames(W, H, pages=1)[:3]:
        s.send_multipart(_request(frame[None]))
        got = _rows(s.recv_multipart())
        rec = _local(daemon, frame)
        assert rec.item_count > 0
        want = _expected(rec, W, H)
        n = min(rec.item_count, 20)
        np.testing.assert_array_equal(got[:, :2], want[:, :2].astype(np.float32))  # class and score: the record's
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert not got[n:].any()                                                    # unused rows zero
        assert np.all(np.diff(got[:n, 1]) <= 0)                                     # highest score first
        assert np.all((got[:n, 2:] >= 0) & (got[:n, 2:] <= 1))
        assert np.all(got[:n, 0] == 0)                                              # "text", the one label
        seen += n
    # [H, W, 3] without the batch dimension is the same request.
    frame = make_frames(W, H, pages=1)[0][0]
    s.send_multipart(_request(frame[None]))
    first = _rows(s.recv_multipart())
    s.send_multipart(_request(frame))
    assert np.array_equal(_rows(s.recv_multipart()), first)
    s.close()
    assert seen > 0


def test_malformed_requests_get_an_error_and_the_front_keeps_serving(served, zctx):
    _, gateway, endpoint = served()
    frame = make_frames(W, H, pages=1)[0][0]
    good = _request(frame[None])
    bad = {
        "header": [b"{\"shape\": [1, 416", good[1]],
        "dtype": [json.dumps({"shape": [1, H, W, 3], "dtype": "float32"}).encode(),
                  frame[None].astype(np.float32).tobytes()],
        "shape": [json.dumps({"shape": [1, 3, H, W], "dtype": "uint8"}).encode(), good[1]],
        "size": [json.dumps({"shape": [1, 320, 320, 3], "dtype": "uint8"}).encode(), bytes(320 * 320 * 3)],
        "data": [good[0], good[1][:-7]],
    }
    s = _req(zctx, endpoint)  # one REQ socket throughout: every refusal is an answer, so it stays usable
    for reason, request in bad.items():
        s.send_multipart(request)
        answer = _json(s.recv_multipart())
        assert answer["code"] == "INVALID_ARGUMENT" and answer["error"], (reason, answer)
        s.send_multipart(good)
        assert _rows(s.recv_multipart()).any(), reason
    s.close()
    for reason in bad:
        assert _since(gateway, "edgeinfer_front_refusals_total", front="frigate", reason=reason) == 1, reason
    for code in ("INVALID_ARGUMENT", "OK"):
        assert _since(gateway, "edgeinfer_front_requests_total", front="frigate", model="det", code=code) == 5, code


def test_no_answer_is_sent_after_the_timeout(served, zctx):
    daemon, gateway, endpoint = served(timeout_ms=1000)
    frame = make_frames(W, H, pages=1)[0][0]
    dealer = zctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        # The DEALER is answered while the lanes run (a REQ's envelope: the empty delimiter first).
        dealer.send_multipart([b"", *_request(frame[None])])
        assert dealer.poll(10000), "no answer to the DEALER before the stall"
        reply = dealer.recv_multipart()
        assert reply[0] == b"" and _rows(reply[1:]).any()

        # The lanes stall (fault injection) for longer than the timeout.
        daemon.send_signal(signal.SIGUSR1)
        wait_for(lambda: "stalling every lane" in daemon_log(daemon), 10, "the daemon's stall")
        time.sleep(0.5)
        req = _req(zctx, endpoint, timeout_ms=200)  # Frigate's default request_timeout_ms
        req.send_multipart(_request(frame[None]))
        with pytest.raises(zmq.Again):
            req.recv_multipart()
        req.close()
        dealer.send_multipart([b"", *_request(frame[None])])
        assert not dealer.poll(2500), "an answer came after the timeout"
        wait_for(lambda: _since(gateway, "edgeinfer_front_requests_total", front="frigate", model="det",
                                code="LATE") == 2, 10, "the two requests counted LATE")

        # The daemon serves again, and still nothing comes for the DEALER's late request.
        unanswered = []  # tries while the lanes come back: no answer within the timeout is LATE too

        def served_again():
            s = _req(zctx, endpoint, timeout_ms=1500)
            try:
                s.send_multipart(_request(frame[None]))
                reply = s.recv_multipart()
                return len(reply) == 1 and len(reply[0]) == REPLY and _rows(reply).any()
            except zmq.Again:
                unanswered.append(1)
                return False
            finally:
                s.close()
        wait_for(served_again, 60, "the gateway answering again after the stall", interval=0.5)
        assert not dealer.poll(500), "an answer came after the timeout"
        late = 2 + len(unanswered)
        assert _since(gateway, "edgeinfer_front_refusals_total", front="frigate", reason="late") == late
        assert _since(gateway, "edgeinfer_front_requests_total", front="frigate", model="det", code="LATE") == late
    finally:
        dealer.close()


# The attacker (an unprivileged user of the socket's group): `multipart` sends one message of 10 frames of 50 MiB
# over and over (a DEALER reconnects by itself after each drop); `connections` opens 1,000 DEALER sockets and
# keeps them, each having sent a region as float32 (under the frame cap: refused by the front, not by libzmq). Prints "STARTED", then runs until killed.
ATTACK = r"""
import sys, time, zmq
endpoint, mode = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
print("STARTED", flush=True)
if mode == "multipart":
    big = zmq.Frame(b"\0" * (50 << 20))
    while True:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        try:
            s.send_multipart([b"", b'{"shape": [1, 416, 416, 3], "dtype": "uint8"}'] + [big] * 10, copy=False,
                             flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        time.sleep(0.5)
        s.close()
else:
    socks, region = [], zmq.Frame(b"\0" * (416 * 416 * 3 * 4))
    for _ in range(1000):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        s.send_multipart([b"", b'{"shape": [1, 416, 416, 3], "dtype": "float32"}', region], copy=False,
                         flags=zmq.NOBLOCK)
        socks.append(s)
    while True:
        time.sleep(1)
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_peers_huge_multipart_messages_and_a_thousand_connections_stay_within_the_caps(tmp_path, children, bundles,
                                                                                        users, sandbox):
    """An unprivileged user of the socket's group sends 10 frames of 50 MiB in one message, again and again, then
    opens 1,000 DEALER connections. Each frame is capped (8 × the largest region's tensor: a larger one drops the
    connection at its header) and the peer's connections are capped (frigate.max_connections_per_peer, by its uid
    from SO_PEERCRED): under the multipart attack the gateway's RSS grows by less than a bound derived from those
    caps, the connections beyond the cap are shut and counted, and its other peer (root,
    standing for Frigate) is answered throughout. The RSS figures are
    printed (issue 35 measured 139 → 644 MiB and → 382 MiB before)."""
    per_peer = 8
    config = write_config(tmp_path, None, models={"det": bundles("detector")},
                          streams=[{"name": "cam-d", "model": "det"}],
                          pools={"gw-d": {"model": "det", "user": os.getuid(), "streams": RINGS}})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    run = sandbox / f"fr-{os.urandom(3).hex()}"
    endpoint = f"ipc://{run}/d.sock"
    gw_config, address = write_gateway_config(tmp_path, config, frigate={
        "enabled": True, "endpoint": endpoint, "timeout_ms": 5000, "socket_mode": "0660",
        "socket_group": users.group, "max_connections_per_peer": per_peer})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    frame = make_frames(W, H, pages=1)[0][0]
    ctx = zmq.Context()
    figures = {}
    try:
        def answered() -> bool:
            s = _req(ctx, endpoint)
            try:
                s.send_multipart(_request(frame[None]))
                return len(s.recv_multipart()[0]) == REPLY
            except zmq.Again:
                return False
            finally:
                s.close()
        wait_for(answered, 60, "the Frigate front answering")
        for _ in range(5):
            assert answered()
        cap = 8 * W * H * 3
        for mode in ("multipart", "connections"):
            before = _rss_kib(gateway.pid)
            attacker = children.spawn([*users.run_as(users.cam_b), sys.executable, "-c", ATTACK, endpoint, mode])
            assert attacker.stdout.readline().strip() == "STARTED", attacker.stderr.read()
            peak, ok, end = before, 0, time.monotonic() + 8.0
            while time.monotonic() < end:
                peak = max(peak, _rss_kib(gateway.pid))
                ok += answered()
                assert attacker.poll() is None, attacker.stderr.read()
            attacker.kill()
            attacker.wait(10)
            figures[mode] = (before >> 10, peak >> 10, ok)
            assert gateway.poll() is None
            assert ok >= 1, f"{mode}: root's requests were not answered during the attack"
            if mode == "multipart":
                # Derived from the caps: a frame over the cap is refused at its header, so at most per_peer
                # connections each hold a message's frames under the cap, plus libzmq's own per connection (< 1 MiB)
                # and 64 MiB for the allocator: far below the 500 MiB of one message of the attack.
                bound_kib = (per_peer * (cap + (1 << 20)) + (64 << 20)) >> 10
                assert peak - before < bound_kib, (mode, before, peak, bound_kib)
            # 1,000 connections: not asserted. Each is accepted by libzmq's I/O thread and shut after the monitor
            # says so, and may read one frame (up to the cap) meanwhile: how many at once depends on the CPU.
        shut = _count(_metrics(gateway), "edgeinfer_front_refusals_total", front="frigate", reason="connections")
        print(f"\nFrigate front under attack (gateway RSS MiB before → peak, root's answers during 8 s): 10 × 50 MiB "
              f"multipart {figures['multipart'][0]} → {figures['multipart'][1]} ({figures['multipart'][2]}); 1,000 "
              f"DEALERs {figures['connections'][0]} → {figures['connections'][1]} ({figures['connections'][2]}); "
              f"connections shut: {shut:.0f}")
        assert shut >= 1000 - per_peer
        assert "a connection shut: uid " in gateway_log(gateway)
    finally:
        ctx.destroy(linger=0)
