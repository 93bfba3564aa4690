"""The gRPC front under attack: every party a real, unprivileged user (the gateway, the camera, the attacker),
the real daemon, the real gateway, a real camera beside. Whatever the network sends, the damage stays in the
front: the camera keeps >= 90 % of its frames and a new client is still served. Rows of docs/reliability.md."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, read_line
from daemon_helpers import start_daemon, wait_for, write_config
from gateway_helpers import gateway_metrics_url, metric, start_gateway, write_gateway_config

tc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt)")
from tritonclient.utils import InferenceServerException  # noqa: E402

FLOOD = str(ROOT / "tests/adversary/grpc_flood.py")
CAMERA_FPS = 20
REQUEST_TIMEOUT_MS = 2000  # grpc.request_timeout_ms of these tests' gateway
PER_CLIENT = 16            # grpc.max_inflight_per_client (its default)


class Front:
    """The daemon (root) serving a camera of user cam_a and a pool of user more[0], the gateway as more[0], and a
    tritonclient client of this process."""

    def __init__(self, tmp, users, children, bundles):
        self.tmp, self.users, self.children = tmp, users, children
        bundle = tmp / "orientation"
        shutil.copytree(bundles("orientation"), bundle)  # where the gateway's user can read model.yaml
        self.gw_user = users.more[0]
        self.config = write_config(tmp, None, models={"orient": str(bundle)},
                                   streams=[{"name": "cam0", "model": "orient", "max_age_ms": 1000,
                                             "producer": f"{{user: {users.cam_a}}}",
                                             "readers": f"{{users: [{users.cam_a}]}}"}],
                                   pools={"gw": {"model": "orient", "user": self.gw_user, "streams": 2}},
                                   ingress={"socket_group": users.group})
        os.chmod(self.config, 0o644)
        self.daemon = start_daemon(children, self.config, log_file=str(tmp / "daemon.log"))
        run = tmp / "run"  # the gateway's runtime directory: its sockets
        run.mkdir()
        os.chown(run, users.uids[self.gw_user], -1)
        self.socket = str(run / "honest.sock")  # 0600: the gateway's user and root (this test's honest client)
        # max_waiting above one client's limit: the model's line never sheds for one client's 16 alone
        self.gw_config, self.address = write_gateway_config(tmp, self.config, models={"orient": {"max_waiting": 32}},
                                                            grpc={
            "request_timeout_ms": REQUEST_TIMEOUT_MS, "sockets": [{"path": self.socket, "mode": "0600"}]})
        os.chmod(self.gw_config, 0o644)
        self.gateway = self.start_gateway()
        self.camera = children.spawn([*users.run_as(users.cam_a), sys.executable, "-c",
                                      "import sys; from edgeinfer.cli.ctl import edgeinferctl_main as m; sys.exit(m())",
                                      "feed", "--synthetic", "--stream", "cam0", "--width", "224", "--height", "224",
                                      "--fps", str(CAMERA_FPS), "--socket", self.daemon.ingress],
                                     stdout=open(tmp / "camera.log", "a"), stderr=open(tmp / "camera.err", "a"))
        self.client = tc.InferenceServerClient(self.address)
        wait_for(lambda: self.frames("processed") > 20, 60, "the camera served")

    def start_gateway(self):
        return start_gateway(self.children, self.gw_config, self.address, run_as=self.users.run_as(self.gw_user),
                             log_file=str(self.tmp / "gateway.log"))

    def frames(self, outcome: str) -> float:
        return metric(self.daemon.metrics_url, "edgeinfer_frames_total", stream="cam0", outcome=outcome)

    def window(self):
        """(offered, processed) of the camera since now, when called again."""
        o0, p0 = metric(self.daemon.metrics_url, "edgeinfer_frames_total", stream="cam0"), self.frames("processed")
        return lambda: (metric(self.daemon.metrics_url, "edgeinfer_frames_total", stream="cam0") - o0,
                        self.frames("processed") - p0)

    def honest(self, n: int) -> dict[str, int]:
        """n requests, one at a time, of a client on its own Unix socket (its own budget): answers by code."""
        codes: dict[str, int] = {}
        client = tc.InferenceServerClient("unix:" + self.socket)
        try:
            for _ in range(n):
                inp = tc.InferInput("frame_rgb24", [224, 224, 3], "UINT8")
                inp.set_data_from_numpy(np.full((224, 224, 3), 128, np.uint8))
                try:
                    client.infer("orient", [inp], client_timeout=20)
                    codes["OK"] = codes.get("OK", 0) + 1
                except InferenceServerException as e:  # its own limit, or the model's line full (shed)
                    k = str(e.status()) + ("/client_limit" if "max_inflight_per_client" in str(e) else "")
                    codes[k] = codes.get(k, 0) + 1
        finally:
            client.close()
        return codes

    def served(self, timeout: float = 10.0) -> bool:
        frame = np.full((224, 224, 3), 128, np.uint8)
        inp = tc.InferInput("frame_rgb24", [224, 224, 3], "UINT8")
        inp.set_data_from_numpy(frame)
        client = tc.InferenceServerClient(self.address)  # a new client, on a new connection
        try:
            return client.infer("orient", [inp], client_timeout=timeout).as_numpy("classes").shape[1] == 2
        except InferenceServerException:
            return False
        finally:
            client.close()

    def close(self):
        self.client.close()


@pytest.fixture
def front(tmp_path_factory, users, sandbox, children, bundles):
    tmp = sandbox / f"front-{os.urandom(3).hex()}"
    tmp.mkdir()
    os.chmod(tmp, 0o755)
    f = Front(tmp, users, children, bundles)
    try:
        yield f
    finally:
        f.close()


def _flood(front, mode: str, n: int):
    return front.children.spawn([*front.users.run_as(front.users.more[1]), sys.executable, FLOOD, front.address,
                                 mode, str(n)])


def test_a_thousand_malformed_requests_are_each_answered_and_cost_the_camera_nothing(request, matrix, front):
    window = front.window()
    attacker = _flood(front, "malformed", 1000)
    out = json.loads(read_line(attacker, timeout=300))
    offered, processed = window()
    codes, unanswered = out["codes"], out["unanswered"]
    answered = sum(codes.values())
    refused = metric(gateway_metrics_url(front.gateway), "edgeinfer_front_refusals_total", front="grpc")
    ok = answered == 1000 and "OK" not in codes and unanswered == 0 and front.gateway.poll() is None and \
        processed >= 0.9 * offered and front.served()
    assert matrix.record(request, "isolation", "1,000 malformed gRPC requests from another local user (dtype, "
                         "shapes, negative/huge dims, truncated/oversized contents, unknown model/version, bytes "
                         "that are no protobuf)", 1000,
                         "each answered with its error; the gateway up; the camera >= 90 % of its frames; a new "
                         "client served",
                         f"answers {answered} ({', '.join(f'{k} {v}' for k, v in sorted(codes.items()))}), "
                         f"unanswered {unanswered}, refusals counted {refused:.0f}; camera {processed:.0f}/"
                         f"{offered:.0f}; new client served", ok), out


def test_two_thousand_idle_connections_leave_room_for_a_new_client(request, matrix, front):
    window = front.window()
    attacker = _flood(front, "idle", 2000)
    line = read_line(attacker, timeout=120)
    held = int(line.split()[1])
    served = front.served(timeout=15)
    time.sleep(2)
    offered, processed = window()
    ok = held >= 1900 and served and front.gateway.poll() is None and processed >= 0.9 * offered
    assert matrix.record(request, "isolation", "2,000 idle or half-open connections to the gRPC front from "
                         "another local user", held, "a new client still served; the camera >= 90 % of its frames",
                         f"{held} held; new client {'served' if served else 'NOT served'}; camera "
                         f"{processed:.0f}/{offered:.0f}", ok)


def test_a_client_that_never_reads_its_answers_blocks_nobody(request, matrix, front):
    window = front.window()
    attacker = _flood(front, "unread", 300)
    line = read_line(attacker, timeout=120)
    wait_for(lambda: open(f"/proc/{attacker.pid}/stat").read().split(")")[1].split()[0] == "T", 30,
             "the attacker stopped")
    time.sleep(3)  # its requests are served meanwhile, their answers never read
    served = front.served(timeout=15)
    offered, processed = window()
    ok = line.startswith("SENT") and served and front.gateway.poll() is None and processed >= 0.9 * offered
    attacker.send_signal(signal.SIGKILL)
    assert matrix.record(request, "isolation", "a gRPC client that sends 300 requests and never reads an answer "
                         "(stopped with its connection open)", 300, "a new client still served; the camera "
                         ">= 90 % of its frames", f"{line}; new client {'served' if served else 'NOT served'}; "
                         f"camera {processed:.0f}/{offered:.0f}", ok)


def test_sigkill_of_the_gateway_under_load_stops_no_camera(request, matrix, front):
    window = front.window()
    codes: dict[str, int] = {}
    stop = threading.Event()

    def load():
        frame = np.full((224, 224, 3), 64, np.uint8)
        while not stop.is_set():
            client = tc.InferenceServerClient(front.address)
            try:
                inp = tc.InferInput("frame_rgb24", [224, 224, 3], "UINT8")
                inp.set_data_from_numpy(frame)
                client.infer("orient", [inp], client_timeout=5)
                codes["OK"] = codes.get("OK", 0) + 1
            except InferenceServerException as e:
                codes[e.status()] = codes.get(e.status(), 0) + 1
                time.sleep(0.05)
            finally:
                client.close()
    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: codes.get("OK", 0) >= 20, 60, "answers under load")
        front.gateway.send_signal(signal.SIGKILL)
        front.gateway.wait(10)
        before = dict(codes)
        wait_for(lambda: codes.get("StatusCode.UNAVAILABLE", 0) > before.get("StatusCode.UNAVAILABLE", 0), 30,
                 "clients told UNAVAILABLE")
        front.gateway = front.start_gateway()  # what systemd's Restart= does (the booted-container row shows it)
        ok_before = codes.get("OK", 0)
        wait_for(lambda: codes.get("OK", 0) > ok_before + 10, 60, "answers from the new gateway")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    offered, processed = window()
    ok = processed >= 0.9 * offered and codes.get("StatusCode.UNAVAILABLE", 0) > 0
    assert matrix.record(request, "isolation", "SIGKILL of the gateway while 3 clients load it", 1,
                         "the camera >= 90 % of its frames; clients get UNAVAILABLE, then answers from the restarted "
                         "gateway", f"camera {processed:.0f}/{offered:.0f}; client answers: "
                         f"{_said(codes)}",
                         ok)


def _said(codes: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in sorted(codes.items()))


def _refusals(front, reason: str) -> float:
    return metric(gateway_metrics_url(front.gateway), "edgeinfer_front_refusals_total", front="grpc", reason=reason)


def test_300_headers_only_streams_on_one_connection_are_bounded_and_ended(request, matrix, front):
    """One raw HTTP/2 connection (another local user) opens 300 ModelInfer streams with HEADERS only, no deadline,
    ignoring the server's SETTINGS: at most the client's limit reach a handler and wait for a message, and those
    only for request_timeout_ms; every other one is refused at its HEADERS; a client on its own socket is served
    throughout."""
    window = front.window()
    attacker = _flood(front, "headers", 300)
    assert read_line(attacker, timeout=60).startswith("OPENED 300")
    honest = front.honest(20)  # while the streams are held (each honest request waits for no attacker's)
    out = json.loads(read_line(attacker, timeout=90))
    attacker.send_signal(signal.SIGKILL)
    codes = out["codes"]
    offered, processed = window()
    timed_out = _refusals(front, "request_timeout")  # reached a handler, then cancelled at request_timeout_ms
    ok = codes.get("OPEN", 0) == 0 and sum(codes.values()) == 300 and 0 < timed_out <= PER_CLIENT and \
        _refusals(front, "client_limit") > 0 and honest == {"OK": 20} and \
        front.gateway.poll() is None and processed >= 0.9 * offered
    assert matrix.record(request, "isolation", "one gRPC connection of another local user opens 300 ModelInfer "
                         "streams with HEADERS only (no message, no deadline, SETTINGS ignored)", 300,
                         f"every stream ended by the server; at most {PER_CLIENT} (max_inflight_per_client) held, "
                         f"for request_timeout_ms; a client on its own socket gets every answer; camera >= 90 %",
                         f"streams {_said(codes)}; request_timeout refusals {timed_out:.0f}; honest client "
                         f"{_said(honest)}; camera {processed:.0f}/{offered:.0f}", ok), out


def test_a_request_trickled_at_one_byte_a_second_is_cancelled(request, matrix, front):
    window = front.window()
    attacker = _flood(front, "trickle", 4)
    assert read_line(attacker, timeout=60).startswith("OPENED 4")
    honest = front.honest(20)
    out = json.loads(read_line(attacker, timeout=90))
    attacker.send_signal(signal.SIGKILL)
    codes = out["codes"]
    offered, processed = window()
    ok = codes.get("OPEN", 0) == 0 and sum(codes.values()) == 4 and out["bytes_each"] < out["of"] and \
        honest == {"OK": 20} and \
        _refusals(front, "request_timeout") == 4 and processed >= 0.9 * offered
    assert matrix.record(request, "isolation", "4 valid ModelInfer requests of another local user, each trickled "
                         "at 1 byte/s on one connection", 4, "each cancelled at request_timeout_ms; a client on "
                         "its own socket gets every answer; camera >= 90 %",
                         f"streams {_said(codes)} after {out['bytes_each']} of {out['of']} bytes each; honest "
                         f"client {_said(honest)}; camera {processed:.0f}/{offered:.0f}", ok), out


def test_one_local_user_at_its_limit_leaves_a_client_on_its_own_socket_served(request, matrix, front):
    """32 requests kept in flight from one local user over loopback TCP, those over max_inflight_per_client
    refused: a co-located client on its own Unix socket (its own budget) is never at a limit and gets every answer
    (the model's line, max_waiting 32, holds the attacker's 16 and it)."""
    attacker = _flood(front, "inflight", 2 * PER_CLIENT)
    assert read_line(attacker, timeout=60) == "LOADING"
    wait_for(lambda: _refusals(front, "client_limit") > 0, 60, "the attacker at its limit")
    honest = front.honest(30)
    refused = _refusals(front, "client_limit")
    attacker.send_signal(signal.SIGKILL)
    ok = honest == {"OK": 30} and refused > 0 and front.gateway.poll() is None
    assert matrix.record(request, "isolation", f"{2 * PER_CLIENT} requests kept in flight by one local user over "
                         "loopback (one client: 127.0.0.1)", 2 * PER_CLIENT, "its requests over "
                         "max_inflight_per_client refused; a client on its own Unix socket gets every answer",
                         f"attacker refused {refused:.0f} times (client_limit); honest client {_said(honest)}", ok)
