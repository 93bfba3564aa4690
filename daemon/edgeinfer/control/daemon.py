"""edgeinferd wiring: models → result rings → lanes → sockets → restored producers → serve → stop.

The main process is the control plane: configuration, the models (verified
and reloaded one by one, registry.py), the ingress and results sockets
(ingress.py, admission.py), the lanes (lanes/supervisor.py: processes forked by the
zygote, each a real-time loop), signals (handlers only set flags; named
handlers in the main loop act), status (status.py) and logging.
Shutdown order: stop the lanes (each finishes its frame), then close the
result rings (readers see CLOSED), the connections and the sockets.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import time

from edgeinfer.abi import ring
from edgeinfer.support import sandbox
from edgeinfer.support.signals import STOP, Signals
from edgeinfer.control import status as statusreport
from edgeinfer.control.admission import Admission
from edgeinfer.models.bundle import BundleError
from edgeinfer.config.schema import Config
from edgeinfer.lanes.dispatch import DispatchTable
from edgeinfer.lanes.loop import Stream
from edgeinfer.control.ingress import Ingress
from edgeinfer.support.sockets import bind_listener
from edgeinfer.lanes.supervisor import LaneSet
from edgeinfer.support.memtrim import TRIM_DELAY_S, release_freed_memory
from edgeinfer.models.runtime import ModelRuntime
from edgeinfer.abi.vocabulary import Geometry
from edgeinfer.control.registry import Models
from edgeinfer.support.statefile import write_atomically
from edgeinfer.support.systemd import Notifier, Watchdog, listen_fds
from edgeinfer.telemetry.metrics import Health, MetricsServer
from edgeinfer.lanes.zygote import Zygote

log = logging.getLogger("edgeinferd")

STALL_S = 1.0         # the control plane's loop turns every 50 ms or so: a turn longer than this is a stall


class Stopped(Exception):
    """A stop signal arrived while starting up."""


class Daemon:
    def __init__(self, cfg: Config, config_path: str | None = None, signals: Signals | None = None):
        """signals: the process's one signal path (signals.py): a stop (SIGTERM, SIGINT) ends start-up or the
        loop, SIGHUP reloads, SIGUSR1 stalls the lanes (runtime.fault_injection only); none: nothing stops it but
        close()."""
        self.cfg = cfg
        self.config_path = config_path  # the file cfg came from: a reload says what in it changed needs a restart
        self.models = Models(cfg)
        self.plans = cfg.lane_plan()
        self.streams: list[Stream] = []
        self.lanes: LaneSet | None = None
        self.zygote: Zygote | None = None
        self.table: DispatchTable | None = None
        self.signals = signals if signals is not None else Signals()
        self.started_ns = ring.monotonic_ns()
        self.chore_errors = 0  # main-thread housekeeping failures (logged; serving goes on)
        self.loop = LoopClock()  # the control plane's stalls (its loop not turning for STALL_S)
        self._last_chore_error, self._last_chore_log = None, 0.0
        self.chores: Chores | None = None  # serve()'s; close() writes its stats file once more, the final counts
        self._trim_at: float | None = None  # monotonic time to release the swapped-out model's memory
        self.health = Health(self, cfg.metrics.health_deadline_s, cfg.metrics.ready_requires_stream)
        self.metrics: MetricsServer | None = None
        self.notifier = Notifier()  # no-op without NOTIFY_SOCKET
        self.watchdog: Watchdog | None = None
        self.ingress: Ingress | None = None
        self.admission: Admission | None = None
        self.restored = 0  # producers served on from systemd's fd store at start

    # ---------------------------------------------------------------- signals (signals.py: handlers only record)

    @property
    def stop_requested(self) -> bool:
        return self.signals.requested(*STOP)

    def _check_stop(self) -> None:
        if self.stop_requested:
            raise Stopped()

    # ---------------------------------------------------------------- start

    def verify_only(self) -> dict[str, ModelRuntime]:
        """Exactly the control plane's start-up checks of every model, without serving (ExecStartPre=): a
        refused configured bundle passes when the model's last known-good one does (models.served[name].fallback
        says so), as the start would serve that one."""
        return {name: self.models.choose(name) for name in self.models.served}

    def declared_geometries(self, model: str) -> list:
        return sorted({Geometry(s.pixel_format, s.height, s.width) for s in self.cfg.streams
                       if s.width is not None and self.cfg.model_of(s) == model})

    @property
    def model_runtimes(self) -> dict[str, ModelRuntime]:
        return {n: m.runtime for n, m in self.models.served.items() if m.runtime is not None}

    def start(self) -> None:
        cfg = self.cfg
        _raise_fd_limit()
        for w in cfg.warnings:
            log.warning("%s", w)
        if cfg.runtime.fault_injection:
            log.warning("fault injection is enabled (runtime.fault_injection): test use only")
        listeners, stored = self._passed_fds()
        try:
            for name, served in self.models.served.items():
                log.info("loading model bundle %s (model %s)", served.entry.bundle, name)
                model = self.models.start(name)  # the configured bundle, or the last known-good one (said)
                log.info("model %s: %s %s verified (sha256 %s…, signed by %s)", name, model.name, model.version,
                         model.bundle.sha256[:16], os.path.basename(model.signer.key_file))
                self._check_stop()
            self._make_streams()
            # Forked while this process has no thread: the lanes inherit the table and the result rings.
            identity, warning = sandbox.lane_identity(cfg.runtime.lane_user)
            if warning:
                log.warning("%s", warning)
            self.zygote = Zygote(cfg, self.plans, self.streams, self.table, identity)
            log.info("lanes run as %s, with no capability, no_new_privs and a seccomp filter",
                     f"user {identity.name}" if identity else f"this process's user (uid {os.geteuid()})")
            if cfg.metrics.enabled:
                self.metrics = MetricsServer(self, cfg.metrics.listen)  # /readyz says "not yet" until the lanes run
                self.metrics.start()
                log.info("metrics and health on http://%s", self.metrics.address)
                print(f"edgeinferd: metrics http://{self.metrics.address}", flush=True)
            self.lanes = LaneSet(cfg, self.plans, self.streams, self.table, self.zygote, self._lane_dropped,
                                 keepalive=self._keepalive)
            self.lanes.start(self.model_runtimes,
                             {n: self.declared_geometries(n) for n in self.models.served})
            log.info("%d lane(s): %s", len(self.plans), "; ".join(
                f"lane{i} CPUs {','.join(map(str, p.cpus))} models {','.join(p.models)}"
                for i, p in enumerate(self.plans)))
            self._check_stop()
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
            self._keep_off_lane_cpus()
            self.health.model_ready = True
            self.models.serving = True  # the bundles served are known to be good from now on
            self.models.record_accepted(force=True)
            self.watchdog = Watchdog(self.notifier, self.lanes, cfg.metrics.health_deadline_s)
        except BaseException:
            for fds in stored.values():
                for fd in fds:
                    _close_quietly(fd)
            for sock in listeners.values():
                if self.ingress is None:
                    sock.close()
            self.close()
            raise

    def _make_streams(self) -> None:
        """Every stream's result ring (sized for its model's payload) and its place in the dispatch table."""
        cfg = self.cfg
        self.table = DispatchTable(len(cfg.streams), len(self.plans))
        runtimes = self.model_runtimes
        for i, s in enumerate(cfg.streams):
            model = cfg.model_of(s)
            writer = ring.ResultWriter.create(runtimes[model].decoder.payload_capacity,
                                              records=cfg.shm.result_records, label=f"edgeinfer-results:{s.name}")
            self.streams.append(Stream(s.name, writer, s.max_age_ms, s.priority, index=i, model=model,
                                       stats=self.table.stream_stats(i, s.name), flags=self.table.stream_flags(i)))

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

    def _keep_off_lane_cpus(self) -> None:
        """Moves the control plane (every thread of it) to the CPUs no lane has, when there are such."""
        cpus = self.cfg.control_cpus()
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass

    def _keepalive(self) -> None:
        """While the control plane waits on lanes (a model loading): the watchdog still hears of their progress."""
        if self.watchdog is not None:
            self.watchdog.tick()

    # ---------------------------------------------------------------- the lanes' news

    def _lane_dropped(self, stream: Stream, epoch: int, why: str) -> None:
        """A lane gave up on, or refused, a producer's ring (it cannot be trusted any more): end that producer."""
        if stream.conn is not None and stream.attach_count == epoch and self.ingress is not None:
            self.ingress.drop(stream.conn, why, goodbye=f"stream {stream.name}: {why}")

    # ---------------------------------------------------------------- reload, model by model

    def reload(self, only_moved: bool = False) -> dict[str, bool]:
        """RELOADING=1 … READY=1 around reloading every model whose bundle changed (SIGHUP: re-read each;
        only_moved: those whose path now resolves elsewhere). {model: accepted} of those tried."""
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={ring.monotonic_ns() // 1000}",
                           "STATUS=reloading model bundles")
        if not only_moved:
            self._say_config_changes()
        try:
            return {name: self._reload(name) for name in self.models.served
                    if not only_moved or self.models.changed(name)}
        finally:
            self.notifier.send("READY=1", "STATUS=" + self.status_line())

    def _say_config_changes(self) -> None:
        """A reload reloads model bundles only: the configuration (its streams above all) applies on restart. A
        file that changed since the start is said, with what changed and what to do, so that a stream added for
        a new camera is not silently left unserved."""
        if not self.config_path:
            return
        from edgeinfer.config.schema import ConfigError, load_config
        try:
            now = load_config(self.config_path)
        except (ConfigError, OSError) as e:
            log.error("reload: %s: a restart would fail, serving on with the configuration of the start: %s",
                      self.config_path, e)
            return
        old_streams, new_streams = ({s.name: s for s in c.streams} for c in (self.cfg, now))
        added = sorted(new_streams.keys() - old_streams.keys())
        removed = sorted(old_streams.keys() - new_streams.keys())
        changed = sorted(n for n in old_streams.keys() & new_streams.keys() if old_streams[n] != new_streams[n])
        sections = [k for k in type(now).model_fields if k != "streams" and getattr(now, k) != getattr(self.cfg, k)]
        if not (added or removed or changed or sections):
            return
        what = "; ".join(f"{label}: {', '.join(names)}" for label, names in (
            ("streams added", added), ("streams removed", removed), ("streams changed", changed),
            ("sections changed", sections)) if names)
        log.warning("reload: %s changed since the start (%s): a reload reloads model bundles only; streams and the "
                    "other settings change only on restart: systemctl restart edgeinferd (cameras keep their rings "
                    "and connections across it)", self.config_path, what)

    def _reload(self, name: str) -> bool:
        """Verify → load in every lane holding it, next to the serving version → swap between two frames.
        On any failure this model's old version keeps serving; no other model is touched."""
        served = self.models.served[name]
        old = served.runtime
        try:
            new = self.models.load(name)
            if new.bundle.sha256 == old.bundle.sha256 and new.bundle.meta == old.bundle.meta:
                self.models.unchanged(name, new)
                return True  # unchanged: nothing to do
            need = new.decoder.payload_capacity
            small = {s.name: s.writer.payload_capacity for s in self.streams
                     if s.model == name and s.writer.payload_capacity < need}
            if small:  # result rings are made once, at start: a record that does not fit is never cut short
                raise BundleError(f"{new.bundle.path}: its results take up to {need} bytes per record, more than "
                                  f"the result rings of {', '.join(small)} hold ({min(small.values())}); restart "
                                  "edgeinferd to serve it")
            geometries = sorted({s.geometry_key for s in self.streams if s.model == name and s.ring is not None}
                                | set(self.declared_geometries(name)))[-self.cfg.runtime.max_sessions:]
            errors = self.lanes.stage(name, new, geometries)
            if errors:
                raise BundleError("; ".join(f"{lane}: {e}" for lane, e in errors.items()))
        except (BundleError, OSError) as e:
            self.models.refuse(name, e)
            return False
        self.lanes.commit(name, new)
        self.models.accept(name, new)
        served.reloads += 1
        self._trim_at = time.monotonic() + TRIM_DELAY_S
        log.info("model %s: reloaded: now serving %s %s (was %s %s)", name, new.name, new.version, old.name,
                 old.version)
        return True

    # ---------------------------------------------------------------- status

    def status(self) -> dict:
        return statusreport.status(self)

    def status_line(self) -> str:
        return statusreport.status_line(self.status())

    # ---------------------------------------------------------------- run

    def serve(self, status_interval: float = 0.0, stats_file: str | None = None, print_status=None) -> int:
        """Runs until a stop signal; returns the exit code."""
        self.notifier.send("READY=1", "STATUS=" + self.status_line())
        chores = self.chores = Chores(self, status_interval, stats_file, print_status)
        self.loop.start()
        while not self.stop_requested:
            self.loop.turn()
            try:
                self.ingress.poll(0.05)  # sockets first: a camera waits for nothing but this
                self.lanes.poll()
                if self.lanes.fatal:
                    log.error("%s; exiting", self.lanes.fatal)
                    return 1
                self.signals.dispatch({signal.SIGHUP: self.reload, signal.SIGUSR1: chores.inject_fault})
                chores.run()
            except Stopped:
                break
            except Exception as e:
                # The control plane's chores (health, status, stats, reload, logging) must not take the
                # serving down with them: e.g. a lazy import failing with EMFILE at the fd limit.
                self._chore_failed(e)
        return 0

    def _chore_failed(self, e: Exception) -> None:
        self.chore_errors += 1
        said = f"{type(e).__name__}: {e}"
        now = time.monotonic()
        if said != self._last_chore_error or now - self._last_chore_log > 10.0:  # at most one line per 10 s
            log.error("control plane: %s (serving continues)", said)
            self._last_chore_error, self._last_chore_log = said, now

    def close(self) -> None:
        """The one stop path: lanes, result rings, connections, sockets, metrics."""
        try:
            self.notifier.send("STOPPING=1", "STATUS=stopping")
        except OSError as e:  # systemd's socket gone (or a NOTIFY_SOCKET that went away): stop all the same
            log.warning("cannot tell systemd we are stopping (%s); stopping anyway", e)
        self.health.model_ready = False
        if self.lanes is not None:
            self.lanes.stop(5.0)
            self.lanes.poll()
            if self.chores is not None and self.chores.stats_file:
                self.chores.write_status()  # the lanes have stopped: these counts are this daemon's last
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        for s in self.streams:
            s.writer.close()  # readers see CLOSED at once
        if self.ingress is not None:
            self.ingress.close()
            self.ingress = None
        self.streams = []
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None


class LoopClock:
    """When the control plane's loop last turned. A turn that took longer than STALL_S is a stall (a reload
    waiting on its lanes, or a call that blocked): counted, summed, and logged once, with its length, when it
    ends. `age()` is read by the metrics thread, live during a stall (one float, written by the loop only)."""

    def __init__(self):
        self.last = time.monotonic()
        self.stalls = 0
        self.stalled_s = 0.0
        self.longest_s = 0.0

    def start(self) -> None:
        self.last = time.monotonic()

    def turn(self) -> None:
        now = time.monotonic()
        took, self.last = now - self.last, now
        if took > STALL_S:
            self.stalls += 1
            self.stalled_s += took
            self.longest_s = max(self.longest_s, took)
            log.warning("control plane: its loop did not turn for %.1f s (no handshake, reload or watchdog ping "
                        "meanwhile; the lanes served on); %d such stall(s) so far", took, self.stalls)

    def age(self) -> float:
        return time.monotonic() - self.last


class Chores:
    """The control plane's periodic work, each a named step (serve() runs them every turn)."""

    def __init__(self, daemon: Daemon, status_interval: float, stats_file: str | None, print_status):
        self.d = daemon
        now = time.monotonic()
        self.next_notify = now + daemon.cfg.runtime.status_interval_s
        self.status_interval, self.stats_file, self.print_status = status_interval, stats_file, print_status
        self.next_status = now + status_interval if status_interval else None
        self.watch = daemon.cfg.model.watch_interval_s
        self.next_watch = now + self.watch if self.watch else None
        self.moved_since: float | None = None
        self.stats_error = None

    def run(self) -> None:
        d = self.d
        now = time.monotonic()
        if d._trim_at is not None and now >= d._trim_at:
            d._trim_at = None
            release_freed_memory()
        if d.watchdog:
            d.watchdog.tick()
        d.models.record_accepted()
        if d.notifier.enabled and now >= self.next_notify:
            self.next_notify += d.cfg.runtime.status_interval_s
            d.notifier.send("STATUS=" + d.status_line())
        if self.next_watch and now >= self.next_watch:
            self.next_watch += self.watch
            self.watch_bundles(now)
        if self.next_status and now >= self.next_status:
            self.next_status += self.status_interval
            self.write_status()

    def inject_fault(self) -> None:
        """SIGUSR1 with runtime.fault_injection (test use only)."""
        d = self.d
        if not d.cfg.runtime.fault_injection:
            return
        # Longer than a lane may hang (it is killed and restarted) and than the watchdog can miss.
        stall = max(3.0, 2 * d.notifier.watchdog_s, 2 * d.cfg.runtime.lane_hang_s)
        log.warning("fault injection: stalling every lane for %g s", stall)
        d.lanes.stall(stall)

    def watch_bundles(self, now: float) -> None:
        """Debounced: reload once a model's path has pointed elsewhere for a whole interval."""
        d = self.d
        if any(d.models.changed(n) for n in d.models.served):
            if self.moved_since is None:
                self.moved_since = now
            elif now - self.moved_since >= self.watch:
                self.moved_since = None
                d.reload(only_moved=True)
        else:
            self.moved_since = None

    def write_status(self) -> None:
        st = self.d.status()
        if self.stats_file:
            try:
                write_json_atomically(self.stats_file, st)
                self.stats_error = None
            except OSError as e:  # a diagnostic aid: never a reason to stop serving
                if self.stats_error != e.strerror:
                    log.error("cannot write the stats file %s: %s", self.stats_file, e.strerror)
                self.stats_error = e.strerror
        if self.print_status:
            self.print_status(st)


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
    """temp file + rename: a reader never sees half a file (not fsynced: it is rewritten every interval)."""
    write_atomically(path, json.dumps(data).encode(), durable=False)
