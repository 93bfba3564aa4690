"""Frigate's `zmq` detector (Frigate 0.16+, detectors: {type: zmq}), served to Frigate unchanged.

The protocol, as Frigate's plugin speaks it: each detector process holds a REQ
socket (request_timeout_ms, default 200, for send and receive; after any error
or timeout it builds a new socket and says hello again).

- Hello: one frame `{"model_request": true, "model_name": FILE}`; the answer
  is one frame `{"model_available": bool, "model_loaded": bool}` (Frigate
  waits up to 30 s for it). Available but not loaded: Frigate's detector stays
  off until Frigate restarts; not available: it uploads the file.
- Upload: `{"model_data": true, "model_name": FILE}` and the file's bytes;
  answered `{"model_saved": bool, "model_loaded": bool}`. Refused here, always:
  edgeinfer serves its own signed bundle (edgeinferd.yaml), never a file sent
  over a socket.
- Detection: `{"shape": [1, H, W, 3], "dtype": "uint8", "model_type": ...}`
  and the C-order tensor (the region, already at the model's size, in the
  pixel format of Frigate's `input_pixel_format`). The answer is one frame of
  480 bytes, float32 [20, 6]: rows of [class_id, score, ymin, xmin, ymax,
  xmax], the box normalised to the region, highest score first, unused rows
  zero (outputs.frigate_rows). Anything else in one frame is, to Frigate, an
  error that it answers with no detections: so a refused request gets one
  frame `{"error": ..., "code": ...}` (never 480 bytes long), and its REQ
  socket stays usable.

Here: a ROUTER bound on `frigate.endpoint` serves any number of Frigate's
detector processes. One thread owns the socket (ZMQ sockets are not
thread-safe): it reads requests, checks their framing, answers hellos and
refusals itself, and hands detections to a small pool of workers (as many as
the model's rings and waiting places), which run the frame through the daemon
(ServedModels.infer, the deadline being receipt + frigate.timeout_ms) and queue the
answer; a pipe wakes the socket thread to send it. An answer ready after the
timeout is never sent: Frigate's REQ has given up on it (and a client that
kept waiting would take it for the answer to a later request). It is counted
LATE, whatever it was.

What a peer may make the front hold (libzmq buffers a multipart message whole
before the front sees any of it, and its ZMQ_MAXMSGSIZE bounds each frame,
not the message): every frame is at most the largest a request of this model
has in any numeric dtype (its largest region's tensor × FRAME_FACTOR; a
larger frame drops the connection at its header, before its bytes are read); at most RECV_HWM whole messages queue per
connection; and the connections are counted by peer (its uid on an ipc://
socket, from the kernel's SO_PEERCRED; its address on tcp://) from the
socket's monitor: one beyond `frigate.max_connections_per_peer`, or beyond
`frigate.max_connections` in all, is shut at once. What libzmq cannot bound
is the number of frames of one message: see docs/operations/gateway.md.
"""
from __future__ import annotations

import collections
import dataclasses
import grp
import json
import logging
import os
import queue
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from edgeinfer.abi.vocabulary import KIND_DETECTION
from edgeinfer.fronts.frontmetrics import FrontMetrics
from edgeinfer.fronts.frigate_protocol import (MAX_HEADER_BYTES, REPLY_BYTES, Request, error_reply, parse_request,
                                               split_envelope)
from edgeinfer.fronts.outputs import frigate_rows
from edgeinfer.fronts.plan import PlanError
from edgeinfer.fronts.pool import FrontError, Timing
from edgeinfer.fronts.served import ServedModels, ServedModel
from edgeinfer.fronts.gatewayconfig import FrigateConfig, _is_loopback

log = logging.getLogger("edgeinfer-gateway")

FRONT = "frigate"
HELLO_WAIT_S = 20.0                  # a hello while the model warms waits this long for it (Frigate waits 30 s)
FRAME_FACTOR = 8                     # the largest region's uint8 tensor as float64, the widest dtype: a frame's cap
RECV_HWM = 4                         # whole messages queued per connection (a REQ has one in flight)
MAX_WORKERS = 64
NAMES_LOGGED = 64                    # Frigate's model names whose hello was logged (once each)
RECV_BATCH = 64                      # messages read before the socket thread sends what is ready


def choose_model(models: ServedModels, cfg: FrigateConfig) -> ServedModel:
    detectors = sorted(n for n, m in models.served.items() if m.plan.kind == "detection")
    if cfg.model is not None:
        m = models.served.get(cfg.model)
        if m is None:
            raise PlanError(f"frigate.model: {cfg.model} is not served by the gateway (served: "
                            f"{', '.join(sorted(models.served))})")
        if m.plan.kind != "detection":
            raise PlanError(f"frigate.model: {cfg.model} is a {m.plan.kind} model; Frigate's detector needs a "
                            f"detection model (served: {', '.join(detectors) or 'none'})")
        return m
    if len(detectors) != 1:
        raise PlanError("frigate.model: " + ("no detection model is served by the gateway (a pool of one is "
                        "needed)" if not detectors else f"models {', '.join(detectors)} detect: name one"))
    return models.served[detectors[0]]


def _gid(group: str | int) -> int:
    if isinstance(group, int) or group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise PlanError(f"frigate.socket_group: no group {group!r}") from None


@dataclasses.dataclass
class _Done:
    envelope: list[bytes]
    deadline_ns: int
    timing: Timing
    rows: bytes | None = None
    error: FrontError | None = None


class FrigateFront:
    def __init__(self, models: ServedModels, cfg: FrigateConfig, metrics: FrontMetrics):
        self.models, self.cfg, self.metrics = models, cfg, metrics
        self.m = choose_model(models, cfg)
        self.model = self.m.plan.name
        self.sizes = list(self.m.plan.sizes)
        self.workers = max(1, min(MAX_WORKERS, sum(len(p.slots) + p.max_waiting for p in self.m.pools.values())))
        self.timeout_ns = cfg.timeout_ms * 1_000_000
        self.thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r = self._wake_w = -1
        self._stopping = False
        self._pending = 0                      # detections handed to the workers, not answered yet
        self._hellos: collections.deque = collections.deque()  # (envelope, until_ns) waiting for the model
        self._named: set[str] = set()
        self._socket_file: tuple[str, int, int] | None = None
        # The largest frame read: its largest region's tensor in any numeric dtype (float32 is a mistake Frigate's
        # configuration can make: answered INVALID_ARGUMENT, not dropped); a larger one drops its connection.
        self.frame_cap = max(MAX_HEADER_BYTES, FRAME_FACTOR * max(w * h * 3 for w, h in self.sizes))
        self._mon: zmq.Socket | None = None
        self._conns: dict[int, str] = {}      # the connections admitted (by fd, from the monitor): their peer
        self._per_peer: collections.Counter = collections.Counter()
        self._shut: set[int] = set()          # connections shut here, whose end the monitor will say
        self._shut_said: set[str] = set()     # peers whose shut connection was logged (once each)

    # ---------------------------------------------------------------- start and stop

    def start(self) -> None:
        cfg = self.cfg
        self._ctx = zmq.Context()
        try:
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.MAXMSGSIZE, self.frame_cap)
            self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
            self._mon = self._sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED |
                                                      zmq.EVENT_CLOSED)
            self._bind()
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="frigate-front")
            self.thread = threading.Thread(target=self._serve, name="frigate-front", daemon=True)
            self.thread.start()
        except BaseException:
            self._close_all()
            raise
        if cfg.endpoint.startswith("tcp://") and not _is_loopback(cfg.endpoint[6:].rpartition(":")[0].strip("[]")):
            log.warning("frigate.endpoint %s is not loopback (allow_remote): Frigate's detector client has no "
                        "authentication, so anyone who reaches it may use model %s, and frames cross the network "
                        "in the clear", cfg.endpoint, self.model)
        fmt = self.m.plan.pixel_format
        log.info("Frigate front (zmq detector) on %s: model %s, %s (Frigate's model: width/height one of these, "
                 "input_tensor nhwc, input_dtype int, input_pixel_format %s), timeout %d ms, %d workers",
                 cfg.endpoint, self.model, self.m.sizes_said, fmt[:3], cfg.timeout_ms, self.workers)

    def _bind(self) -> None:
        cfg = self.cfg
        if not cfg.endpoint.startswith("ipc://"):
            try:
                self._sock.bind(cfg.endpoint)
            except zmq.ZMQError as e:
                raise OSError(f"frigate.endpoint {cfg.endpoint}: cannot listen there: {e}") from None
            return
        path = cfg.endpoint[6:]
        gid = _gid(cfg.socket_group) if cfg.socket_group is not None else -1
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(f"frigate.endpoint: {path} exists and is not a socket")
            if _answers(path):  # ZMQ would unlink it and take the path over
                raise OSError(f"frigate.endpoint: {path} is in use (another gateway?)")
        # Created under the umask (no one else may connect: that takes write), then given the configured mode.
        try:
            self._sock.bind(cfg.endpoint)
        except zmq.ZMQError as e:
            raise OSError(f"frigate.endpoint {cfg.endpoint}: cannot listen there: {e}") from None
        st = os.lstat(path)
        self._socket_file = (path, st.st_dev, st.st_ino)  # removed at stop while it is still this one
        os.chmod(path, int(cfg.socket_mode, 8))
        if gid != -1:
            try:
                os.chown(path, -1, gid)
            except PermissionError:
                raise OSError(f"frigate.socket_group {cfg.socket_group}: cannot give {path} that group: the gateway "
                              "must be in it (systemctl edit edgeinfer-gateway: SupplementaryGroups=)") from None

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self.thread is not None:
            self.thread.join(5.0)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)  # each bounded by its deadline
            self._pool = None
        if self.thread is None or not self.thread.is_alive():
            self._close_all()

    def _close_all(self) -> None:
        if self._mon is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._mon.close(linger=0)
            self._mon = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._socket_file is not None:  # libzmq leaves an ipc:// socket file behind
            path, dev, ino = self._socket_file
            self._socket_file = None
            try:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    os.unlink(path)
            except OSError:
                pass
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending already (or stopped)

    # ---------------------------------------------------------------- the socket thread

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        while not self._stopping:
            try:
                events = dict(poller.poll(100 if self._hellos else 1000))
            except zmq.ZMQError as e:
                if e.errno == zmq.ETERM:
                    return
                raise
            if self._wake_r in events:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            self._send_done()
            if self._mon in events:
                self._connections()
            if self._sock in events:
                for _ in range(RECV_BATCH):
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._handle(frames)
                    except Exception:  # one request's failure is not the front's
                        log.exception("Frigate front: a request failed")
            self._answer_hellos()

    # ---------------------------------------------------------------- connections, by peer

    def _connections(self) -> None:
        """The monitor's events: a connection accepted is counted by its peer, or shut if over a cap."""
        events = []
        while True:
            try:
                events.append(recv_monitor_message(self._mon, zmq.NOBLOCK))
            except zmq.Again:
                break
        last = {e["value"]: i for i, e in enumerate(events)}  # an fd may be closed and reused within one batch
        for i, e in enumerate(events):
            fd = e["value"]
            if e["event"] == zmq.EVENT_ACCEPTED:
                if last[fd] != i:
                    continue  # gone already: its end comes next in this batch
                peer = _peer_of(fd)
                if peer is None:
                    continue
                per_peer, total = self.cfg.max_connections_per_peer, self.cfg.max_connections
                if self._per_peer[peer] >= per_peer or len(self._conns) >= total:
                    self._shut_connection(fd, peer, f"{peer} has {self._per_peer[peer]} connections (at most "
                                          f"{per_peer}: frigate.max_connections_per_peer)" if
                                          self._per_peer[peer] >= per_peer else f"{len(self._conns)} connections "
                                          f"are open (at most {total}: frigate.max_connections)")
                    continue
                self._conns[fd] = peer
                self._per_peer[peer] += 1
            else:  # disconnected or closed
                self._shut.discard(fd)
                peer = self._conns.pop(fd, None)
                if peer is not None:
                    self._per_peer[peer] -= 1
                    if self._per_peer[peer] <= 0:
                        del self._per_peer[peer]

    def _shut_connection(self, fd: int, peer: str, why: str) -> None:
        self.metrics.refusals.labels(FRONT, "connections").inc()
        if peer not in self._shut_said and len(self._shut_said) < NAMES_LOGGED:
            self._shut_said.add(peer)
            log.warning("Frigate front: a connection shut: %s (said once per peer)", why)
        try:  # libzmq owns the fd: shut through a duplicate, and libzmq closes its own when it reads the end
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            s.shutdown(socket.SHUT_RDWR)
            self._shut.add(fd)
        except OSError:
            pass
        finally:
            s.close()

    def _send(self, envelope: list[bytes], reply: bytes) -> None:
        try:
            self._sock.send_multipart([*envelope, reply], zmq.NOBLOCK)
        except zmq.Again:
            log.debug("Frigate front: a reply dropped (the client's queue is full)")

    def _refuse(self, envelope: list[bytes], e: FrontError) -> None:
        self.metrics.failed(FRONT, self.model, e.code, e.reason)
        log.debug("Frigate front: refused: %s", e)
        self._send(envelope, error_reply(e))

    def _handle(self, frames: list[bytes]) -> None:
        timing = Timing()
        split = split_envelope(frames)
        if split is None:  # not a REQ client's message (a DEALER must send the empty delimiter first)
            self.metrics.failed(FRONT, self.model, "INVALID_ARGUMENT", "envelope")
            return
        envelope, body = split
        try:
            req = parse_request(body, self.sizes, self.m.plan.pixel_format)
        except FrontError as e:
            self._refuse(envelope, e)
            return
        if req.kind == "hello":
            self._hello(envelope, req.model_name)
        elif req.kind == "upload":
            self._upload(envelope, req.model_name, len(body[1]) if len(body) > 1 else 0)
        else:
            if self._pending >= self.workers:
                self._refuse(envelope, FrontError("RESOURCE_EXHAUSTED", f"{self._pending} requests are being "
                                                  "served already: retry", "shed"))
                return
            self._pending += 1
            self._pool.submit(self._work, envelope, req, timing, timing.received + self.timeout_ns)

    def _hello(self, envelope: list[bytes], name: str) -> None:
        if name not in self._named and len(self._named) < NAMES_LOGGED:
            self._named.add(name)
            log.info("Frigate's model %r is served by model %s (signed bundle %s); Frigate's model file is not "
                     "used", name, self.model, self.m.plan.bundle)
        if self.m.ready:
            self._send(envelope, json.dumps({"model_available": True, "model_loaded": True}).encode())
        else:  # answered once it is, or when the wait is over (not loaded: Frigate's detector stays off)
            self._hellos.append((envelope, time.monotonic_ns() + int(HELLO_WAIT_S * 1e9)))

    def _answer_hellos(self) -> None:
        now = time.monotonic_ns()
        keep = collections.deque()
        while self._hellos:
            envelope, until = self._hellos.popleft()
            if self.m.ready or now >= until:
                if not self.m.ready:
                    log.warning("Frigate's detector asked for model %s, which is not ready after %g s (%s): it "
                                "was told so, and Frigate keeps that detector off until it restarts", self.model,
                                HELLO_WAIT_S, self.m.warm_error or "edgeinferd has not answered its warm-up frame")
                self._send(envelope, json.dumps({"model_available": True, "model_loaded": self.m.ready}).encode())
            else:
                keep.append((envelope, until))
        self._hellos = keep

    def _upload(self, envelope: list[bytes], name: str, size: int) -> None:
        log.warning("Frigate sent model file %r (%d bytes) to be loaded: refused. edgeinfer serves only signed "
                    "bundles: configure the model in edgeinferd.yaml (models:) and its pool, and point Frigate's "
                    "model.path at any file; model %s (bundle %s) answers", name, size, self.model,
                    self.m.plan.bundle)
        self.metrics.refusals.labels(FRONT, "upload").inc()
        self._send(envelope, json.dumps({
            "model_saved": False, "model_loaded": False,
            "error": f"edgeinfer serves only signed bundles: configure the model in edgeinferd.yaml; model "
                     f"{self.model} serves this endpoint"}).encode())

    def _send_done(self) -> None:
        while True:
            try:
                d = self._done.get_nowait()
            except queue.Empty:
                return
            self._pending -= 1
            if time.monotonic_ns() > d.deadline_ns:  # Frigate's REQ gave up on it: never sent
                self.metrics.failed(FRONT, self.model, "LATE", "late")
                log.debug("Frigate front: not sent, %d ms after the request (timeout %d ms): %s",
                          (time.monotonic_ns() - d.timing.received) // 1_000_000, self.cfg.timeout_ms,
                          d.error if d.error is not None else "its detections")
            elif d.error is not None:
                self._refuse(d.envelope, d.error)
            else:
                self.metrics.answered(FRONT, self.model, d.timing)  # counted first: a client that reads it sees it
                self._send(d.envelope, d.rows)

    # ---------------------------------------------------------------- the workers

    def _work(self, envelope: list[bytes], req: Request, timing: Timing, deadline_ns: int) -> None:
        done = _Done(envelope, deadline_ns, timing)
        try:
            if time.monotonic_ns() >= deadline_ns:
                raise FrontError("DEADLINE_EXCEEDED", "the timeout passed before a worker took the request",
                                 "deadline_waiting")
            gauge = self.metrics.in_flight.labels(FRONT, self.model)
            gauge.inc()
            try:
                rec = self.models.infer(self.m, np.frombuffer(req.tensor, np.uint8), req.width, req.height,
                                        deadline_ns, timing)
            finally:
                gauge.dec()
            if rec.kind != KIND_DETECTION:
                raise FrontError("INTERNAL", f"model {self.model} answered payload kind {rec.kind}, not detections",
                                 "payload")
            rows = frigate_rows(rec.payload, rec.item_count, req.width, req.height).tobytes()
            assert len(rows) == REPLY_BYTES
            done.rows = rows
        except FrontError as e:
            done.error = e
        except Exception as e:  # answered, logged: the front goes on
            log.exception("Frigate front: a detection failed")
            done.error = FrontError("INTERNAL", f"{type(e).__name__}: {e}", "internal")
        self._done.put(done)
        self._wake()


def _peer_of(fd: int) -> str | None:
    """Who is at the other end of a connection libzmq accepted: its uid (Unix socket) or its address (TCP)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.family == socket.AF_UNIX:
            _, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return f"uid {uid}"
        return f"address {s.getpeername()[0]}"
    except OSError:
        return None
    finally:
        s.close()


def _answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket `path` now."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
