"""edgeinferd wiring: models → result rings → lanes → sockets → restored producers → serve → stop.

The main process is the control plane: configuration, the models (verified
and reloaded one by one: registry.py, reload.py), the ingress and results
sockets (listeners.py, admission.py, restore.py), the lanes (lanes/supervisor.py:
processes forked by the zygote, each a real-time loop), signals (handlers only
record; named handlers in the main loop act), periodic chores (chores.py) and
status (status.py, from one snapshot). This module builds each of them with
what it uses, in order, and runs the serve loop. Shutdown order: stop the lanes
(each finishes its frame), then close the result rings (readers see CLOSED),
the connections and the sockets.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import time

from edgeinfer.abi import ring
from edgeinfer.config.schema import Config
from edgeinfer.control import status as statusreport
from edgeinfer.control.admission import Admission
from edgeinfer.control.chores import Chores, LoopClock
from edgeinfer.control.drift import Drift
from edgeinfer.control.fdcloser import FdCloser
from edgeinfer.control.listeners import Listeners
from edgeinfer.control.registry import ModelRegistry
from edgeinfer.control.reload import Reloader, declared_geometries
from edgeinfer.control.restore import restore_producers
from edgeinfer.control.rollout import Rollouts
from edgeinfer.control.streamstate import StreamState
from edgeinfer.lanes.dispatch import DispatchTable
from edgeinfer.lanes.stream import Stream
from edgeinfer.lanes.supervisor import Supervisor
from edgeinfer.lanes.zygote import Zygote
from edgeinfer.models.runtime import ModelRuntime
from edgeinfer.support import sandbox
from edgeinfer.support.memtrim import DeferredTrim
from edgeinfer.support.signals import STOP, Signals
from edgeinfer.support.sockets import bind_listener, raise_fd_limit
from edgeinfer.support.systemd import Notifier, Watchdog, listen_fds
from edgeinfer.telemetry.metrics import Health, MetricsServer
from edgeinfer.telemetry.snapshot import Snapshot

log = logging.getLogger("edgeinferd")


class Stopped(Exception):
    """A stop signal arrived while starting up."""


class Daemon:
    def __init__(self, cfg: Config, config_path: str | None = None, signals: Signals | None = None):
        """signals: the process's one signal path (signals.py): a stop (SIGTERM, SIGINT) ends start-up or the
        loop, SIGHUP reloads, SIGUSR1 stalls the lanes (runtime.fault_injection only); none: nothing stops it but
        close()."""
        self.cfg = cfg
        self.config_path = config_path  # the file cfg came from: a reload says what in it changed needs a restart
        self.models = ModelRegistry(cfg)
        self.plans = cfg.lane_plan()
        self.streams: list[Stream] = []          # what the lanes share of each stream (made at start)
        self.states: list[StreamState] = []      # what the control plane keeps of each (admission's)
        self.lanes: Supervisor | None = None
        self.zygote: Zygote | None = None
        self.table: DispatchTable | None = None
        self.signals = signals if signals is not None else Signals()
        self.started_ns = ring.monotonic_ns()
        self.chore_errors = 0  # main-thread housekeeping failures (logged; serving goes on)
        self.loop = LoopClock()  # the control plane's stalls (its loop not turning for chores.STALL_S)
        self._last_chore_error, self._last_chore_log = None, 0.0
        self.chores: Chores | None = None  # serve()'s; close() writes its stats file once more, the final counts
        self.trim = DeferredTrim()  # releases a swapped-out model's memory a few seconds after the swap
        self.health: Health | None = None
        self.metrics: MetricsServer | None = None
        self.notifier = Notifier()  # no-op without NOTIFY_SOCKET
        self.watchdog: Watchdog | None = None
        self.closer: FdCloser | None = None
        self.ingress: Listeners | None = None
        self.admission: Admission | None = None
        self.reloader: Reloader | None = None
        self.rollouts: Rollouts | None = None
        self.drift: Drift | None = None  # the drift chore (drift.enabled): reads the result rings, off the lanes
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

    @property
    def model_runtimes(self) -> dict[str, ModelRuntime]:
        return {n: m.runtime for n, m in self.models.served.items() if m.runtime is not None}

    def start(self) -> None:
        cfg = self.cfg
        raise_fd_limit()  # every connection costs an fd; the caps in listeners.py keep the count bounded
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
                     (identity.name if identity.dynamic else f"user {identity.name}") if identity else f"this process's user (uid {os.geteuid()})")
            self.lanes = Supervisor(cfg, self.plans, self.streams, self.table, self.zygote, self._lane_dropped,
                                 keepalive=self._keepalive)
            self.health = Health(self.lanes, self.models, self.states, cfg.metrics.health_deadline_s,
                                 cfg.metrics.ready_requires_stream)
            if cfg.metrics.enabled:
                # /readyz says "not yet" until the lanes run
                self.metrics = MetricsServer(self.snapshot, self.health, cfg.metrics.listen)
                self.metrics.start()
                log.info("metrics and health on http://%s", self.metrics.address)
                print(f"edgeinferd: metrics http://{self.metrics.address}", flush=True)
            self.lanes.start(self.model_runtimes, {n: declared_geometries(cfg, n) for n in self.models.served})
            self.rollouts = Rollouts(cfg, models=self.models, lanes=self.lanes, streams=self.streams, trim=self.trim)
            if cfg.drift.enabled:
                self.drift = Drift(cfg, self.streams, self.models)
                self.rollouts.discard_references = self.drift.discard
            self.reloader = Reloader(cfg, self.config_path, models=self.models, lanes=self.lanes,
                                     streams=self.streams, notifier=self.notifier, trim=self.trim,
                                     status_line=self.status_line, rollouts=self.rollouts)
            log.info("%d lane(s): %s", len(self.plans), "; ".join(
                f"lane{i} CPUs {','.join(map(str, p.cpus))} models {','.join(p.models)}"
                for i, p in enumerate(self.plans)))
            self._check_stop()
            self.admission = Admission(cfg, self.states, self.lanes, self.notifier)
            owned = []
            for kind, path in (("ingress", cfg.ingress.socket), ("results", cfg.ingress.results_socket)):
                if kind not in listeners:  # no socket unit: bind it ourselves
                    listeners[kind] = bind_listener(path, cfg.ingress.socket_group)
                    owned.append(path)
            self.closer = FdCloser()  # every fd a client sent, and its connection, is closed there
            self.ingress = Listeners(cfg, self.admission, listeners, owned, self.closer)
            log.info("cameras connect to %s, readers to %s%s", cfg.ingress.socket, cfg.ingress.results_socket,
                     " (from systemd's socket unit)" if not owned else "")
            had_stored = bool(stored)
            self.restored = restore_producers(stored, self.admission, self.ingress, self.notifier, self.closer)
            if had_stored:
                log.info("fd store: %d producer(s) served on without reconnecting", self.restored)
            self._check_stop()
            self._keep_off_lane_cpus()
            self.health.model_ready = True
            self.models.serving = True  # the bundles served are known to be good from now on
            self.models.record_accepted(force=True)
            self.reloader.resume()  # a rollout the last daemon did not finish starts again (rollout.py)
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
        streams = cfg.all_streams()  # those of `streams:`, then the pools' (config/schema.py)
        self.table = DispatchTable(len(streams), len(self.plans))
        runtimes = self.model_runtimes
        pool_of = {name: pool for pool, pc in (cfg.pools or {}).items() for name in pc.stream_names(pool)}
        for i, s in enumerate(streams):
            model = cfg.model_of(s)
            writer = ring.ResultWriter.create(runtimes[model].decoder.payload_capacity,
                                              records=cfg.shm.result_records, label=f"edgeinfer-results:{s.name}")
            stream = Stream(s.name, writer, s.max_age_ms, s.priority, index=i, model=model,
                            stats=self.table.stream_stats(i, s.name), flags=self.table.stream_flags(i))
            self.streams.append(stream)
            self.states.append(StreamState(stream, pool=pool_of.get(s.name)))

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
        s = self.states[stream.index]
        if s.conn is not None and s.attach_count == epoch and self.ingress is not None:
            self.ingress.drop(s.conn, why, goodbye=f"stream {s.name}: {why}")

    # ---------------------------------------------------------------- reload (reload.py)

    def reload(self, only_moved: bool = False) -> dict[str, bool]:
        """{model: accepted} of the models tried (SIGHUP: every model; only_moved: those whose path moved)."""
        return self.reloader.reload(only_moved)

    # ---------------------------------------------------------------- status

    def snapshot(self) -> Snapshot:
        """The daemon's state now, typed (what /metrics and status read; any thread)."""
        return statusreport.take_snapshot(self.states, self.lanes, self.models, self.ingress, self.loop, self.rollouts,
                                          started_ns=self.started_ns, restored=self.restored,
                                          chore_errors=self.chore_errors,
                                          metrics_address=self.metrics.address if self.metrics else None,
                                          drift=self.drift.view if self.drift else None)

    def status(self) -> dict:
        return statusreport.status(self.snapshot())

    def status_line(self) -> str:
        return statusreport.status_line(self.status())

    # ---------------------------------------------------------------- run

    def serve(self, status_interval: float = 0.0, stats_file: str | None = None, print_status=None) -> int:
        """Runs until a stop signal; returns the exit code."""
        self.notifier.send("READY=1", "STATUS=" + self.status_line())
        chores = self.chores = Chores(self.cfg, models=self.models, lanes=self.lanes, rollouts=self.rollouts,
                                      notifier=self.notifier,
                                      watchdog=self.watchdog, trim=self.trim, status=self.status,
                                      reload=self.reload, status_interval=status_interval, stats_file=stats_file,
                                      print_status=print_status, drift=self.drift)
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
        e = self.notifier.stopping("STATUS=stopping")
        if e is not None:  # systemd's socket gone (or a NOTIFY_SOCKET that went away): stop all the same
            log.warning("cannot tell systemd we are stopping (%s); stopping anyway", e)
        if self.health is not None:
            self.health.model_ready = False
        if self.lanes is not None:
            self.lanes.stop(5.0)
            self.lanes.poll()
            if self.chores is not None and self.chores.stats_file:
                self.chores.write_status()  # the lanes have stopped: these counts are this daemon's last
        if self.drift is not None:
            self.drift.close()
            self.drift = None
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        for s in self.streams:
            s.writer.close()  # readers see CLOSED at once
        if self.ingress is not None:
            self.ingress.close()
            self.ingress = None
        if self.closer is not None:
            self.closer.stop()
            self.closer = None
        self.streams, self.states = [], []
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
