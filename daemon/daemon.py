"""edgeinferd wiring: load → open streams → start the RT loop → serve → stop.

The main thread owns everything but the loop: configuration, the model,
signals (handlers only set flags; the main loop acts on them), status output
and logging of the loop's events. Shutdown order: stop the loop (it finishes
its frame), then close the result rings (readers see CLOSED) and the readers.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import time

from edgeinfer import ring
from edgeinfer.bundle import load_bundle
from edgeinfer.config import Config
from edgeinfer.engine import Engine, Stream
from edgeinfer.model import ModelRuntime, ThreadPlan

log = logging.getLogger("edgeinferd")


class Stopped(Exception):
    """A stop signal arrived while starting up."""


class Daemon:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model: ModelRuntime | None = None
        self.streams: list[Stream] = []
        self.engine: Engine | None = None
        self.stop_requested = False
        self.started_ns = ring.monotonic_ns()

    # ---------------------------------------------------------------- signals

    def install_signal_handlers(self) -> None:
        def on_stop(signum, _frame):
            self.stop_requested = True  # only a flag: the main loop does the work

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)

    def _check_stop(self) -> None:
        if self.stop_requested:
            raise Stopped()

    # ---------------------------------------------------------------- start

    def start(self) -> None:
        cfg = self.cfg
        log.info("loading model bundle %s", cfg.model.bundle)
        bundle = load_bundle(cfg.model.bundle)
        log.warning("model bundle %s is not signature-checked yet (signing lands with issue #4)", bundle.path)
        self._check_stop()
        rt = cfg.runtime
        threads = ThreadPlan(rt.ort_threads, tuple(rt.ort_cpus))
        self.model = ModelRuntime(bundle, threads, cfg.model.warmup_runs)
        # Sessions for the geometries the config declares are built and warmed now, before READY.
        for s in cfg.streams:
            if s.width is not None:
                self.model.session_for(s.pixel_format, s.height, s.width)
                self._check_stop()
        log.info("model %s %s ready (sha256 %s…)", self.model.name, self.model.version, bundle.sha256[:16])
        try:
            for s in cfg.streams:
                writer = ring.ResultWriter.create(s.results_name, self.model.decoder.payload_capacity,
                                                  records=cfg.shm.result_records, group=cfg.shm.result_group,
                                                  shm_dir=cfg.shm.dir)
                reader = ring.FrameReader.watch(s.segment_name, shm_dir=cfg.shm.dir,
                                                allowed_uids=cfg.shm.allowed_uids or None)
                self.streams.append(Stream(s.name, reader, writer, s.max_age_ms, s.priority))
            self._check_stop()
            self.engine = Engine(self.model, self.streams, loop_cpus=rt.loop_cpus, scheduling=rt.scheduling,
                                 priority=rt.priority, duty_ceiling=rt.duty_ceiling, spin_us=rt.spin_us,
                                 idle_timeout_ms=rt.idle_timeout_ms)
            self.engine.start()
            self._keep_off_loop_cpus(rt.loop_cpus)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _keep_off_loop_cpus(loop_cpus) -> None:
        """Moves this (main) thread off the loop's CPUs when others are left: a
        main thread preempted there while holding the GIL would stall the loop
        until the interpreter's switch interval runs out."""
        others = os.sched_getaffinity(0) - set(loop_cpus)
        if loop_cpus and others:
            os.sched_setaffinity(0, others)

    # ---------------------------------------------------------------- run

    def drain_events(self) -> None:
        ev = self.engine.events if self.engine else []
        while ev:
            level, msg = ev.pop(0)
            getattr(log, level)(msg)

    def status(self) -> dict:
        now = ring.monotonic_ns()
        e = self.engine
        return {
            "model": {"name": self.model.name, "version": self.model.version} if self.model else None,
            "realtime_active": bool(e and e.realtime_active),
            "loop_alive": bool(e and e.alive),
            "loop_tid": e.native_tid if e else 0,
            "uptime_s": (now - self.started_ns) / 1e9,
            "streams": {s.name: {**s.stats.snapshot(now), "connected": s.reader.connected,
                                 "producer_alive": s.reader.producer_alive,
                                 "refused": str(s.reader.last_error) if s.reader.last_error else None}
                        for s in self.streams},
        }

    def serve(self, status_interval: float = 0.0, stats_file: str | None = None, print_status=None) -> int:
        """Runs until a stop signal; returns the exit code."""
        next_status = time.monotonic() + status_interval if status_interval else None
        while not self.stop_requested:
            time.sleep(0.05)
            self.drain_events()
            if self.engine and not self.engine.alive:
                log.error("the real-time loop died; exiting")
                return 1
            if next_status and time.monotonic() >= next_status:
                next_status += status_interval
                st = self.status()
                if stats_file:
                    write_json_atomically(stats_file, st)
                if print_status:
                    print_status(st)
        return 0

    def close(self) -> None:
        if self.engine is not None:
            if not self.engine.stop(5.0):
                log.error("the real-time loop did not stop within 5 s")
            self.drain_events()
        for s in self.streams:
            s.writer.close()
            s.reader.close()
        self.streams = []


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
