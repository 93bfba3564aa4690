"""A lane: one process, one real-time loop (engine.py) and its control thread.

Forked by the zygote (zygote.py) with the dispatch table, the streams and their
result writers already mapped. The control plane talks to it over one
SOCK_SEQPACKET socket (protocol below); the lane never reads configuration,
bundles or sockets of its own. Its control thread (normal priority) builds and
warms ONNX Runtime sessions, hands them to the loop through the engine's
mailbox, cancels a run past its deadline (the lane owns its runs), and
forwards the loop's events as log lines. When the control plane goes away
(its end of the socket closes), the lane stops.

Control plane → lane (pickled tuple, fds alongside):
  ("stage", name) + [memfd: SessionSet + fused graphs]  build the sessions, warm → ("staged", name, version, error)
  ("commit", name) / ("discard", name)         serve the staged model / drop it
  ("attach", stream, epoch, geometry) + [ring, memfd: fused graph]  serve a ring  → ("attached", stream, epoch, error)
  ("detach", stream, epoch)                     stop serving that producer's ring
  ("stall", seconds)                            fault injection (runtime.fault_injection only)
Lane → control plane: the replies above, ("ready", pid), ("log", level, message), ("dropped", stream, epoch, why),
  ("short", stream, seq, payload_len, frame bytes, geometry)  a frame counted short (said by the control plane,
                                                              rate-limited per stream across its lanes)
"""
from __future__ import annotations

import fcntl
import mmap
import os
import pickle
import re
import select
import socket
import sys
import time

from edgeinfer import dispatch, ring, sandbox
from edgeinfer.engine import Engine
from edgeinfer.memtrim import release_freed_memory
from edgeinfer.model import SessionSet, ThreadPlan

MAX_MESSAGE = 64 * 1024  # a control message (a bundle travels in a memfd)
F_SEAL_FUTURE_WRITE = 0x10  # linux/fcntl.h (Linux >= 5.1); Python's fcntl module lacks it
MUTE_LOG_S = 60.0         # a muted camera is logged at most this often per stream
EVENT_LOG_S = 60.0        # the loop's same event (its numbers aside) is logged at most this often
REPLY_WAIT_S = 5.0       # how long a command or a reply may wait for room in a full socket
TICK_S = 0.02            # how often the control thread looks at the running inference's deadline
TRIM_DELAY_S = 3.0       # after a model swap, when to return the old version's freed memory to the kernel


def send(sock: socket.socket, msg: tuple, fds=(), wait_s: float = 0.0) -> bool:
    """One message; False if the peer is gone, or cannot take it within wait_s (0: now; log lines may be
    dropped, a command or a reply waits for room)."""
    data = [pickle.dumps(msg)]
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.send_fds(sock, data, list(fds), socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [sock], [], left)[1]:
                return False
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False


def receive(sock: socket.socket) -> tuple[tuple | None, list[int]]:
    """One message and its fds; (None, []) when the peer hung up."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds  # from our own control plane only (a socketpair made by it)


def to_memfd(obj, label: str) -> int:
    """`obj` pickled into a sealed memfd (the control plane's own objects: a model's SessionSet and fused
    graphs, too large for a control message)."""
    data = memoryview(pickle.dumps(obj))
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])
    # FUTURE_WRITE, not WRITE: F_SEAL_WRITE first waits for the pages' extra references to go, and pages just
    # written can still sit in another CPU's LRU batch: under load it failed with EBUSY and the daemon did
    # not start (seen once in a fresh-clone `make test`). FUTURE_WRITE forbids the same (write(), writable
    # mappings) from now on, and nothing else holds this memfd.
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL)
    return fd


def from_memfd(fd: int):
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        return pickle.loads(m)



class LogLimiter:
    """A recurring line said at most once per `interval_s` per key, the rest counted: a camera that keeps at
    something, or an error on every frame, is a line a minute in the journal, not one a frame."""

    def __init__(self, interval_s: float, max_keys: int = 256):
        self.interval_s, self.max_keys = interval_s, max_keys
        self.seen: dict = {}  # key → (when last said, times since)

    def hit(self, key, now: float) -> int | None:
        """None: not to be said now (counted); else how many times it came since it was last said."""
        last, count = self.seen.get(key, (None, 0))
        if last is not None and now - last < self.interval_s:
            self.seen[key] = (last, count + 1)
            return None
        if key not in self.seen and len(self.seen) >= self.max_keys:
            del self.seen[next(iter(self.seen))]  # the oldest key (a bound, not a policy: keys are few)
        self.seen[key] = (now, 0)
        return count

class Lane:
    def __init__(self, lane: int, plans, cfg, streams, table: dispatch.DispatchTable, sock: socket.socket,
                 keeps_nice: bool = False):
        plan = plans[lane]
        self.id = lane
        self.cfg = cfg
        self.sock = sock
        self.entries = cfg.model_entries()
        self.model_names = list(plan.models)
        self.cpus = tuple(plan.cpus)
        rt = cfg.runtime
        self.legacy_ort_cpus = tuple(rt.ort_cpus) if not cfg.models else ()
        threaded = any(self.entries[m].ort_threads > 1 for m in self.model_names)
        # With extra ORT threads the loop keeps the lane's first CPU and they get the others.
        loop_cpus = self.cpus[:1] if threaded and len(self.cpus) > 1 else self.cpus
        self.streams = {s.index: s for s in streams if s.model in self.model_names}
        bells = [ring.Doorbell(table.memory, table.doorbell_offset(i)) for i in range(table.n_lanes)]
        self.engine = Engine({}, list(self.streams.values()), lane=lane, counters=table.lane_counters(lane),
                             bell=bells[lane], peers=[b for i, b in enumerate(bells) if i != lane],
                             loop_cpus=loop_cpus, scheduling=rt.scheduling, priority=rt.priority,
                             duty_ceiling=rt.duty_ceiling, spin_us=rt.spin_us, idle_timeout_ms=rt.idle_timeout_ms,
                             release_nice=keeps_nice,
                             peer_counters={m: [table.lane_counters(i) for i, p in enumerate(plans)
                                                if i != lane and m in p.models] for m in self.model_names})
        self.table = table
        self.keeps_nice = keeps_nice  # this thread holds CAP_SYS_NICE until the loop thread has started (sandbox)
        self.models: dict[str, SessionSet] = {}
        self.staged: dict[str, SessionSet] = {}
        self.rings: dict[int, tuple[int, ring.FrameReader]] = {}  # stream → (epoch, reader) handed to the loop
        self.trim_at: float | None = None  # when to give a replaced model's freed memory back to the kernel
        self.mutes_logged = LogLimiter(MUTE_LOG_S)  # by stream
        self.events_logged = LogLimiter(EVENT_LOG_S)  # by (level, message with its numbers as #)

    def thread_plan(self, name: str) -> ThreadPlan:
        threads = self.entries[name].ort_threads
        extra = self.legacy_ort_cpus or self.cpus[1:]
        return ThreadPlan(threads, tuple(extra[: threads - 1]) if threads > 1 else ())

    def log(self, level: str, message: str) -> None:
        send(self.sock, ("log", level, message))

    # ---------------------------------------------------------------- messages

    def on_stage(self, name: str, fds) -> None:
        """A model's sessions, built from the fused graphs the control plane made and warmed, next to what the
        loop serves (this thread's ORT calls still hold the GIL ~15 ms per session: docs/architecture.md)."""
        rt = self.cfg.runtime
        try:
            payload = from_memfd(fds[0])
            model = payload["sessions"]
            model.threads = self.thread_plan(name)
            model.warmup_runs = self.cfg.model.warmup_runs
            model.warmup_deadline_s = max(5.0, 10 * rt.run_deadline_ms / 1e3)
            for g, fused in payload["fused"].items():
                model.add(g, fused)
        except Exception as e:  # BundleError, or anything ORT raises: the control plane refuses the load
            send(self.sock, ("staged", name, None, str(e) or type(e).__name__), wait_s=REPLY_WAIT_S)
            return
        self.staged[name] = model
        send(self.sock, ("staged", name, model.version, None), wait_s=REPLY_WAIT_S)

    def on_commit(self, name: str) -> None:
        model = self.staged.pop(name)
        sessions = {}
        for s in self.streams.values():
            if s.model == name and s.index in self.rings:
                g = self.rings[s.index][1].geometry_key
                session = model.get(g)
                if session is None:  # cannot happen (the control plane staged every attached geometry): say so
                    self.log("error", f"stream {s.name}: model {name} {model.version} has no session for {g}")
                    self.on_detach(s.index, self.rings[s.index][0])
                    continue
                sessions[s] = session
        self.models[name] = model
        self.engine.swap_model(name, model, sessions)
        self.trim_at = time.monotonic() + TRIM_DELAY_S  # once the loop let go of the old version

    def on_attach(self, index: int, epoch: int, geometry, fds) -> None:
        s = self.streams[index]
        try:
            # The camera may have rewritten its header since the control plane checked it: checked again here.
            reader = ring.FrameReader(fds[0], f"stream {s.name}", join=True)
            fused = from_memfd(fds[1])
        except (ring.RingError, OSError, ValueError) as e:
            send(self.sock, ("attached", index, epoch, str(e)), wait_s=REPLY_WAIT_S)
            return
        finally:
            for fd in fds:
                os.close(fd)
        geometry = tuple(geometry)
        reader.geometry_key = geometry
        reader.native.share(self.table.memory, self.table.cursor_offset(index), epoch)
        try:
            session = self.models[s.model].add(geometry, fused, pinned=self.pinned())
        except Exception as e:
            reader.close()
            send(self.sock, ("attached", index, epoch, str(e)), wait_s=REPLY_WAIT_S)
            return
        self.rings[index] = (epoch, reader)
        self.engine.attach(s, reader, session, epoch)
        send(self.sock, ("attached", index, epoch, None), wait_s=REPLY_WAIT_S)

    def pinned(self) -> set:
        return {reader.geometry_key for _epoch, reader in self.rings.values()}

    def on_detach(self, index: int, epoch: int) -> None:
        held = self.rings.get(index)
        if held is not None and held[0] == epoch:
            del self.rings[index]
            self.engine.detach(self.streams[index], held[1])

    def handle(self, msg: tuple, fds: list[int]) -> bool:
        kind = msg[0]
        if kind == "stage":
            self.on_stage(msg[1], fds)
        elif kind == "commit":
            self.on_commit(msg[1])
        elif kind == "discard":
            self.staged.pop(msg[1], None)
        elif kind == "attach":
            self.on_attach(msg[1], msg[2], msg[3], fds)
            fds = []
        elif kind == "detach":
            self.on_detach(msg[1], msg[2])
        elif kind == "stall" and self.cfg.runtime.fault_injection:
            self.engine.inject_stall(float(msg[1]))
        elif kind == "stop":
            return False
        for fd in fds:
            os.close(fd)
        return True

    # ---------------------------------------------------------------- run

    def chores(self) -> None:
        e = self.engine
        if self.trim_at is not None and time.monotonic() >= self.trim_at:
            self.trim_at = None
            release_freed_memory()
        counters = self.table.lane_counters(self.id)
        held = list(self.models.values()) + list(self.staged.values())
        counters[dispatch.LANE_SESSIONS] = sum(len(m.geometries) for m in held)
        counters[dispatch.LANE_EVICTIONS] = sum(m.evictions for m in held)
        e.cancel_overdue_run(self.cfg.runtime.run_deadline_ms / 1e3)  # counted by the loop when the run returns
        while e.events:
            level, message = e.events.pop(0)
            since = self.events_logged.hit((level, re.sub(r"\d+", "#", message)), time.monotonic())
            if since is not None:  # (an error on every frame is a line a minute, not one a frame)
                self.log(level, message + (f" (and {since} more like it since the last such line)" if since else ""))
        while e.muted:
            self.report_muted(e.muted.pop(0))
        while e.shorts:  # said by the control plane: a stream's frames go to any of its lanes
            send(self.sock, ("short", *e.shorts.pop(0)))
        while e.dropped:
            s, reader, why = e.dropped.pop(0)
            held = self.rings.get(s.index)
            if held is not None and held[1] is reader:
                del self.rings[s.index]
                send(self.sock, ("dropped", s.index, held[0], why), wait_s=REPLY_WAIT_S)
            reader.close()

    def report_muted(self, stream: str) -> None:
        """A camera rang its doorbell without frames: said once per MUTE_LOG_S per stream (the loop may
        mute it ten times a second for as long as the camera keeps at it)."""
        since = self.mutes_logged.hit(stream, time.monotonic())
        if since is not None:
            self.log("warning", f"stream {stream}: its camera rang the ring's doorbell over 32 times in 10 ms "
                                f"without a frame ({since + 1} times muted by this lane); its ring is polled every "
                                f"1 ms instead, for 100 ms at a time (its frames only may be up to 1 ms late)")

    def run(self) -> int:
        self.engine.start()
        if self.keeps_nice:  # the loop thread has it (and drops it once its priority is taken); this one needs none
            sandbox.release_nice()
        self.table.lane_counters(self.id)[dispatch.LANE_READY] = 1
        send(self.sock, ("ready", os.getpid()))
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            while self.engine.alive:
                if poller.poll(TICK_S * 1000):
                    msg, fds = receive(self.sock)
                    if msg is None:
                        break
                    try:
                        if not self.handle(msg, fds):
                            break
                    except Exception as e:  # one bad command must not end the lane: said, and served on
                        self.log("error", f"{msg[0]}: {type(e).__name__}: {e}")
                self.chores()
        finally:
            self.table.lane_counters(self.id)[dispatch.LANE_READY] = 0
            stopped = self.engine.stop(5.0)
            self.chores()
        return 0 if stopped else 1


def lane_main(lane: int, plans, cfg, streams, table, sock: socket.socket,
              identity: sandbox.LaneIdentity | None = None) -> int:
    """The forked lane's whole life (the zygote's child); plans: every lane's (CPUs and models); identity: the
    uid and gid it takes when the daemon runs as root (sandbox.py)."""
    plan = plans[lane]
    # The control thread (and what it starts, unless pinned: ORT's extra threads are, to the lane's CPUs) stays
    # off the lane's CPUs where others exist: at normal priority next to the real-time loop it would not run
    # until the frame was done, and it must be able to cancel an overdue run.
    others = os.sched_getaffinity(0) - set(plan.cpus)
    os.sched_setaffinity(0, others or set(plan.cpus))
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(f"edgeinfer-lane{lane}")
    except OSError:
        pass
    started = time.monotonic()
    try:
        # Before the first camera byte and the first thread: its uid, capabilities, no_new_privs, seccomp filter.
        keeps_nice = sandbox.harden_lane(identity, cfg.runtime.scheduling, cfg.runtime.priority)
        return Lane(lane, plans, cfg, streams, table, sock, keeps_nice).run()
    except Exception as e:
        send(sock, ("log", "error", f"lane stopped after {time.monotonic() - started:.1f} s: "
                                    f"{type(e).__name__}: {e}"))
        print(f"edgeinferd lane {lane}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
