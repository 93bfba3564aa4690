"""edgeinferd wiring: load → result rings → sockets → restored producers → RT loop → serve → stop.

The main thread is the control plane: configuration, the model, the ingress
and results sockets (ingress.py, admission.py), signals (handlers only set
flags; the main loop acts on them), status output and logging of the loop's
events. Shutdown order: stop the loop (it finishes its frame), then close the
result rings (readers see CLOSED), the connections and the sockets.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import tempfile
import time

from edgeinfer import ring
from edgeinfer.admission import Admission
from edgeinfer.bundle import BundleError
from edgeinfer.config import Config
from edgeinfer.engine import Engine, Stream
from edgeinfer.ingress import Ingress, bind_listener
from edgeinfer.memtrim import release_freed_memory
from edgeinfer.model import ModelRuntime, ThreadPlan
from edgeinfer.rollback import RollbackRefused, RollbackState, StateWriteError
from edgeinfer.signing import SignatureError, TrustStore, load_verified_bundle
from edgeinfer.systemd import Notifier, Watchdog, listen_fds
from edgeinfer.telemetry import Health, MetricsServer

log = logging.getLogger("edgeinferd")

STATE_RETRY_S = 10.0  # seconds between attempts to write an anti-rollback record that failed
TRIM_DELAY_S = 3.0    # after a reload, when to return the old model's freed memory to the kernel


class Stopped(Exception):
    """A stop signal arrived while starting up."""


class Daemon:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model: ModelRuntime | None = None
        self.streams: list[Stream] = []
        self.engine: Engine | None = None
        self.stop_requested = False
        self.reload_requested = False
        self.started_ns = ring.monotonic_ns()
        self.rollback = RollbackState(cfg.model.state_dir)
        self.reloads = 0
        self.reload_failures: dict[str, int] = {}  # reason → count
        self.last_reload_error: str | None = None
        self.state_write_failures = 0
        self.chore_errors = 0  # main-thread housekeeping failures (logged; serving goes on)
        self._last_chore_error, self._last_chore_log = None, 0.0
        self.last_state_error: str | None = None
        self._unrecorded: tuple[str, str] | None = None  # accepted model whose version is not on disk yet
        self._trim_at: float | None = None  # monotonic time to release the swapped-out model's memory
        self._bundle_target = None  # realpath of the bundle being served
        self.fault_requested = False
        self.health = Health(self, cfg.metrics.health_deadline_s, cfg.metrics.ready_requires_stream)
        self.metrics: MetricsServer | None = None
        self.notifier = Notifier()  # no-op without NOTIFY_SOCKET
        self.watchdog: Watchdog | None = None
        self.ingress: Ingress | None = None
        self.admission: Admission | None = None
        self.restored = 0  # producers served on from systemd's fd store at start

    # ---------------------------------------------------------------- signals

    def install_signal_handlers(self) -> None:
        def on_stop(signum, _frame):
            self.stop_requested = True  # only a flag: the main loop does the work

        def on_reload(signum, _frame):
            self.reload_requested = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_reload)
        if self.cfg.runtime.fault_injection:
            def on_fault(signum, _frame):
                self.fault_requested = True
            signal.signal(signal.SIGUSR1, on_fault)

    def _check_stop(self) -> None:
        if self.stop_requested:
            raise Stopped()

    # ---------------------------------------------------------------- start

    def load_model(self, geometries) -> ModelRuntime:
        """The start-up checks and load: signature on the bytes read, then parse,
        anti-rollback, ORT sessions for `geometries`, warm-up. Raises BundleError."""
        cfg = self.cfg
        path = cfg.model.bundle
        target = os.path.realpath(path)
        trust = TrustStore(cfg.model.trust_dir)
        bundle, signer = load_verified_bundle(path, trust)
        self.rollback.check(bundle.meta.name, bundle.meta.version, os.path.join(path, "model.yaml"))
        self._check_stop()
        rt = cfg.runtime
        # Warm-up gets more time than a served frame (first runs allocate), but not forever: a model
        # that hangs on a plain grey frame is refused, not waited for.
        model = ModelRuntime(bundle, ThreadPlan(rt.ort_threads, tuple(rt.ort_cpus)), cfg.model.warmup_runs,
                             warmup_deadline_s=max(5.0, 10 * rt.run_deadline_ms / 1e3), max_sessions=rt.max_sessions)
        for fmt, h, w in geometries:  # built and warmed before the model is declared ready
            model.session_for(fmt, h, w)
            self._check_stop()
        model.signer = signer
        model.target = target
        return model

    def declared_geometries(self) -> list:
        return [(s.pixel_format, s.height, s.width) for s in self.cfg.streams if s.width is not None]

    def verify_only(self) -> ModelRuntime:
        """Exactly the start-up checks, without serving (ExecStartPre=)."""
        return self.load_model([])

    def start(self) -> None:
        cfg = self.cfg
        rt = cfg.runtime
        _raise_fd_limit()
        for w in cfg.warnings:
            log.warning("%s", w)
        if cfg.metrics.enabled:
            # Up before the model loads: /readyz says "not yet" while it does.
            self.metrics = MetricsServer(self, cfg.metrics.listen)
            self.metrics.start()
            log.info("metrics and health on http://%s", self.metrics.address)
            print(f"edgeinferd: metrics http://{self.metrics.address}", flush=True)
        if rt.fault_injection:
            log.warning("fault injection is enabled (runtime.fault_injection): test use only")
        listeners, stored = self._passed_fds()
        try:
            log.info("loading model bundle %s", cfg.model.bundle)
            self.model = self.load_model(self.declared_geometries())
            self._accept(self.model)
            log.info("model %s %s ready (sha256 %s…, signed by %s)", self.model.name, self.model.version,
                     self.model.bundle.sha256[:16], os.path.basename(self.model.signer.key_file))
            for s in cfg.streams:
                writer = ring.ResultWriter.create(self.model.decoder.payload_capacity, records=cfg.shm.result_records,
                                                  label=f"edgeinfer-results:{s.name}")
                self.streams.append(Stream(s.name, writer, s.max_age_ms, s.priority))
            self._check_stop()
            self.engine = Engine(self.model, self.streams, loop_cpus=rt.loop_cpus, scheduling=rt.scheduling,
                                 priority=rt.priority, duty_ceiling=rt.duty_ceiling, spin_us=rt.spin_us,
                                 idle_timeout_ms=rt.idle_timeout_ms)
            self.admission = Admission(cfg, self.streams, self)
            owned = []
            for kind, path in (("ingress", cfg.ingress.socket), ("results", cfg.ingress.results_socket)):
                if kind not in listeners:  # no socket unit: bind it ourselves
                    listeners[kind] = bind_listener(path, cfg.ingress.socket_group)
                    owned.append(path)
            self.ingress = Ingress(cfg, self.admission, listeners, owned)
            self.admission.ingress = self.ingress
            log.info("cameras connect to %s, readers to %s%s", cfg.ingress.socket, cfg.ingress.results_socket,
                     " (from systemd's socket unit)" if not owned else "")
            self.restored = self.admission.restore(stored)
            if stored or self.restored:
                log.info("fd store: %d producer(s) served on without reconnecting", self.restored)
            self._check_stop()
            self.engine.start()
            self._keep_off_loop_cpus(rt.loop_cpus)
            self.health.model_ready = True
            self.watchdog = Watchdog(self.notifier, self.engine, rt.run_deadline_ms / 1e3)
        except BaseException:
            for fds in stored.values():
                for fd in fds:
                    _close_quietly(fd)
            for sock in listeners.values():
                if self.ingress is None:
                    sock.close()
            self.close()
            raise

    def _passed_fds(self) -> tuple[dict, dict]:
        """What systemd passed us: the socket unit's listeners (matched by their path) and the fd
        store's content by name ({"ring.cam0": [fd], "conn.cam0": [fd], ...})."""
        paths = {self.cfg.ingress.socket: "ingress", self.cfg.ingress.results_socket: "results"}
        listeners, stored = {}, {}
        for fd, name in listen_fds():
            kind = None
            try:
                sock = socket.socket(fileno=fd)
                # Only a listening socket is a listener: a stored producer connection has the same
                # getsockname() (the path it was accepted on) and must not be taken for one.
                listening = sock.type == socket.SOCK_SEQPACKET and \
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                kind = paths.get(sock.getsockname()) if listening else None
                if kind is None or kind in listeners:
                    sock.detach()  # not a listener of ours: a stored fd (or junk), handled below
                    kind = None
                else:
                    listeners[kind] = sock
            except OSError:
                pass  # not a socket: a stored ring
            if kind is None:
                stored.setdefault(name, []).append(fd)
        return listeners, stored

    @staticmethod
    def _keep_off_loop_cpus(loop_cpus) -> None:
        """Moves this (main) thread off the loop's CPUs when others are left: a
        main thread preempted there while holding the GIL would stall the loop
        until the interpreter's switch interval runs out."""
        others = os.sched_getaffinity(0) - set(loop_cpus)
        if loop_cpus and others:
            os.sched_setaffinity(0, others)

    def _accept(self, model: ModelRuntime) -> None:
        self._bundle_target = model.target
        self._unrecorded = (model.name, model.version)
        self._record_accepted()

    def _record_accepted(self) -> None:
        """Raises the anti-rollback floor to the served version. A full or read-only
        state directory must not stop a verified model from serving: the error is
        logged and counted, and the write retried every status interval."""
        if self._unrecorded is None:
            return
        try:
            self.rollback.accept(*self._unrecorded)
        except StateWriteError as e:
            self.state_write_failures += 1
            if self.last_state_error != str(e):
                log.error("%s; serving %s %s anyway (the floor is not raised until the write succeeds)", e,
                          *self._unrecorded)
            self.last_state_error = str(e)
            return
        if self.last_state_error:
            log.info("anti-rollback state written: %s %s recorded", *self._unrecorded)
        self._unrecorded = None
        self.last_state_error = None

    def reload(self) -> bool:
        """RELOADING=1 … READY=1 around _reload (systemd shows the unit reloading)."""
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={ring.monotonic_ns() // 1000}",
                           "STATUS=reloading the model bundle")
        try:
            return self._reload()
        finally:
            self.notifier.send("READY=1", "STATUS=" + self.status_line())

    def _reload(self) -> bool:
        """Verify → load → warm the configured bundle next to the serving one,
        then swap between two frames. On any failure the old model keeps serving."""
        old = self.model
        attached = [s for s in self.streams if s.connected]
        geometries = set(self.declared_geometries()) | {s.geometry_key for s in attached}
        try:
            new = self.load_model(sorted(geometries)[-self.cfg.runtime.max_sessions:])
            sessions = {s: new.session_for(*s.geometry_key) for s in attached}
        except Stopped:
            raise
        except (BundleError, OSError) as e:
            reason = ("signature" if isinstance(e, SignatureError) else
                      "rollback" if isinstance(e, RollbackRefused) else "load")
            self.reload_failures[reason] = self.reload_failures.get(reason, 0) + 1
            self.last_reload_error = str(e)
            log.error("reload refused, still serving %s %s: %s", old.name, old.version, e)
            return False
        self.engine.swap_model(new, sessions)
        self.model = new
        self._accept(new)
        self.reloads += 1
        # Once the loop has moved every active stream to the new sessions, give the old model's memory back.
        self._trim_at = time.monotonic() + TRIM_DELAY_S
        self.last_reload_error = None
        log.info("reloaded: now serving %s %s (was %s %s)", new.name, new.version, old.name, old.version)
        return True

    def _bundle_moved(self) -> bool:
        """The configured bundle path now resolves elsewhere (a `current` symlink flipped)."""
        try:
            return os.path.realpath(self.cfg.model.bundle) != self._bundle_target
        except OSError:
            return False

    # ---------------------------------------------------------------- run

    def drain_events(self) -> None:
        ev = self.engine.events if self.engine else []
        while ev:
            level, msg = ev.pop(0)
            getattr(log, level)(msg)
        dropped = self.engine.dropped if self.engine else []
        while dropped:  # rings the loop gave up on: end their producers, with the reason
            s, reader, why = dropped.pop(0)
            if s.conn is not None and s.ring is reader:
                self.ingress.drop(s.conn, why, goodbye=f"stream {s.name}: {why}")

    def status(self) -> dict:
        now = ring.monotonic_ns()
        e = self.engine
        refusals = self.ingress.refuse_count() if self.ingress else {}
        return {
            "model": {"name": self.model.name, "version": self.model.version, "sha256": self.model.bundle.sha256,
                      "sessions": len(self.model.geometries), "session_evictions": self.model.evictions}
            if self.model else None,
            "metrics_address": self.metrics.address if self.metrics else None,
            "reloads": self.reloads,
            "reload_failures": dict(self.reload_failures),
            "last_reload_error": self.last_reload_error,
            "state_write_failures": self.state_write_failures,
            "last_state_error": self.last_state_error,
            "segment_truncations": ring.sigbus_absorbed(),
            "realtime_active": bool(e and e.realtime_active),
            "loop_alive": bool(e and e.alive),
            "loop_tid": e.native_tid if e else 0,
            "uptime_s": (now - self.started_ns) / 1e9,
            "restored_producers": self.restored,
            "refusals": {f"{st}/{role}/{reason}": n for (st, role, reason), n in sorted(refusals.items())},
            "streams": {s.name: {**s.stats.snapshot(now), "connected": s.connected,
                                 "producer": str(s.conn.peer) if s.conn else None,
                                 "geometry": list(s.geometry_key) if s.geometry_key else None,
                                 "attaches": s.attach_count, "readers": s.reader_count,
                                 "refused": {f"{role}/{reason}": n for (st, role, reason), n in refusals.items()
                                             if st == s.name}}
                        for s in self.streams},
        }

    def status_line(self) -> str:
        """One line for systemd's STATUS=: model, then per stream fps, p99, drops."""
        st = self.status()
        parts = [f"{st['model']['name']} {st['model']['version']}" if st["model"] else "no model"]
        for name, s in st["streams"].items():
            drops = s["offered"] - s["processed"]
            p99 = (s.get("e2e_ms") or {}).get("p99")
            parts.append(f"{name}: {s['fps']:.1f} fps, p99 {p99:.1f} ms, {drops} dropped" if p99 is not None
                         else f"{name}: {'no frames yet' if s['connected'] else 'waiting for its producer'}")
        if self.last_reload_error:
            parts.append("last reload refused")
        if self.last_state_error:
            parts.append("anti-rollback state not written")
        if self.engine and not self.engine.realtime_active:
            parts.append("NOT real-time")
        return "; ".join(parts)

    def serve(self, status_interval: float = 0.0, stats_file: str | None = None, print_status=None) -> int:
        """Runs until a stop signal; returns the exit code."""
        self.notifier.send("READY=1", "STATUS=" + self.status_line())
        next_notify = time.monotonic() + self.cfg.runtime.status_interval_s
        next_status = time.monotonic() + status_interval if status_interval else None
        watch = self.cfg.model.watch_interval_s
        next_watch = time.monotonic() + watch if watch else None
        moved_since = None
        next_state_retry = 0.0
        stats_error = None
        while not self.stop_requested:
            try:
                self.ingress.poll(0.05)  # sockets first: a camera waits for nothing but this
                if self._trim_at is not None and time.monotonic() >= self._trim_at:
                    self._trim_at = None
                    release_freed_memory()
                self.health.tick()
                if self.watchdog:
                    self.watchdog.tick()
                self.drain_events()
                if self._unrecorded and time.monotonic() >= next_state_retry:
                    next_state_retry = time.monotonic() + STATE_RETRY_S
                    self._record_accepted()
                if self.notifier.enabled and time.monotonic() >= next_notify:
                    next_notify += self.cfg.runtime.status_interval_s
                    self.notifier.send("STATUS=" + self.status_line())
                if self.fault_requested:
                    self.fault_requested = False
                    # Longer than the watchdog can miss: its last ping may report progress made just
                    # before the stall, so systemd's deadline can be up to 1.5 intervals away.
                    stall = max(3.0, 2 * self.notifier.watchdog_s)
                    log.warning("fault injection: stalling the loop for %g s", stall)
                    self.engine.inject_stall(stall)
                if next_watch and time.monotonic() >= next_watch:
                    next_watch += watch
                    # Debounced: reload once the path has pointed elsewhere for a whole interval.
                    if self._bundle_moved():
                        if moved_since is None:
                            moved_since = time.monotonic()
                        elif time.monotonic() - moved_since >= watch:
                            moved_since = None
                            self.reload_requested = True
                    else:
                        moved_since = None
                if self.reload_requested:
                    self.reload_requested = False
                    try:
                        ok = self.reload()
                    except Stopped:
                        break
                    if not ok:
                        # Do not retry a refused target until it changes again.
                        self._bundle_target = os.path.realpath(self.cfg.model.bundle)
                if self.engine and not self.engine.alive:
                    log.error("the real-time loop died; exiting")
                    return 1
                if next_status and time.monotonic() >= next_status:
                    next_status += status_interval
                    st = self.status()
                    if stats_file:
                        try:
                            write_json_atomically(stats_file, st)
                            stats_error = None
                        except OSError as e:  # a diagnostic aid: never a reason to stop serving
                            if stats_error != e.strerror:
                                log.error("cannot write the stats file %s: %s", stats_file, e.strerror)
                            stats_error = e.strerror
                    if print_status:
                        print_status(st)
            except Exception as e:
                # The main thread's chores (health, status, stats, reload, logging) must not take the
                # serving loop down with them: e.g. a lazy import failing with EMFILE at the fd limit.
                self._chore_failed(e)
        return 0

    def _chore_failed(self, e: Exception) -> None:
        self.chore_errors += 1
        said = f"{type(e).__name__}: {e}"
        now = time.monotonic()
        if said != self._last_chore_error or now - self._last_chore_log > 10.0:  # at most one line per 10 s
            log.error("main thread: %s (serving continues)", said)
            self._last_chore_error, self._last_chore_log = said, now

    def close(self) -> None:
        self.notifier.send("STOPPING=1", "STATUS=stopping")
        self.health.model_ready = False
        if self.engine is not None:
            if not self.engine.stop(5.0):
                log.error("the real-time loop did not stop within 5 s")
            self.drain_events()
        for s in self.streams:
            s.writer.close()  # readers see CLOSED at once
        if self.ingress is not None:
            self.ingress.close()
            self.ingress = None
        self.streams = []
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None


def _raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every connection costs an fd, and select() is not used
    (the caps in ingress.py keep the count bounded)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def write_json_atomically(path: str, data: dict) -> None:
    """temp file + rename: a reader never sees half a file."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".stats.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
