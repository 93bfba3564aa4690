"""A lane: one process, one real-time loop (loop.py) and its control thread.

Forked by the zygote (zygote.py) with the dispatch table, the streams and their
result writers already mapped. The control plane talks to it over one
SOCK_SEQPACKET socket (protocol below); the lane never reads configuration,
bundles or sockets of its own. Its control thread (normal priority) builds and
warms ONNX Runtime sessions, hands them to the loop through the engine's
mailbox, cancels a run past its deadline (the lane owns its runs), and
forwards the loop's events as log lines. When the control plane goes away
(its end of the socket closes), the lane stops.

The messages both ways are lanes/protocol.py's.
"""
from __future__ import annotations

import os
import re
import select
import socket
import sys
import time
from typing import NamedTuple

from edgeinfer.lanes import dispatch, gcwatch
from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import OUTCOMES
from edgeinfer.lanes.protocol import (TO_LANE, Abort, Attach, Attached, CandidateHung, Commit, Detach, Discard,
                                      Dropped, Log, ProtocolError, Promote, ProviderFallback, Ready, Short, Stage,
                                      Staged, Stall, StartTrial, Stop, TrialReport, from_memfd, receive, send)
from edgeinfer.lanes.trial import Trial
from edgeinfer.support import sandbox
from edgeinfer.lanes.loop import Loop
from edgeinfer.lanes.stream import LaneStream
from edgeinfer.support.memtrim import DeferredTrim
from edgeinfer.models import providers
from edgeinfer.models.runtime import SessionSet, ThreadPlan

MUTE_LOG_S = 60.0         # a muted camera is logged at most this often per stream
EVENT_LOG_S = 60.0        # the loop's same event (its numbers aside) is logged at most this often
REPLY_WAIT_S = 5.0       # how long a command or a reply may wait for room in a full socket
TICK_S = 0.02            # how often the control thread looks at the running inference's deadline
TRIAL_REPORT_S = 1.0     # how often a trial's figures go to the control plane
HUNG_GRACE_S = 0.25      # a cancelled provider run must end within max(this, run_deadline_ms) of its cancel
HANG_MARGIN_S = 0.5      # ... and this long before runtime.lane_hang_s
EXIT_PROVIDER_HUNG = 3   # the lane's exit status when a provider's run would not end (restarted by the control plane)


class Held(NamedTuple):
    """A ring this lane handed to its loop: the producer generation, and the ring."""
    epoch: int
    reader: ring.FrameReader


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
        # This lane's own working state per stream it may serve (the inherited Streams stay as made).
        self.streams = {s.index: LaneStream(s) for s in streams if s.model in self.model_names}
        bells = [ring.Doorbell(table.memory, table.doorbell_offset(i)) for i in range(table.n_lanes)]
        self.engine = Loop({}, list(self.streams.values()), lane=lane, counters=table.lane_counters(lane),
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
        self.trials: dict[str, Trial] = {}  # a rollout's candidate per model (the loop has its own reference)
        self.cpu_refused: set[str] = set()  # models whose provider failed and whose CPU rebuild failed too
        self.next_report = 0.0
        self.rings: dict[int, Held] = {}  # by stream index: the rings handed to the loop
        self.trim = DeferredTrim()  # gives a replaced model's freed memory back to the kernel
        self.mutes_logged = LogLimiter(MUTE_LOG_S)  # by stream
        self.events_logged = LogLimiter(EVENT_LOG_S)  # by (level, message with its numbers as #)

    def thread_plan(self, name: str) -> ThreadPlan:
        threads = self.entries[name].ort_threads
        extra = self.legacy_ort_cpus or self.cpus[1:]
        return ThreadPlan(threads, tuple(extra[: threads - 1]) if threads > 1 else ())

    def log(self, level: str, message: str) -> None:
        send(self.sock, Log(level, message))

    # ---------------------------------------------------------------- messages

    def on_stage(self, msg: Stage, fds) -> None:
        """A model's sessions, built from the fused graphs the control plane made and warmed, next to what the
        loop serves (this thread's ORT calls still hold the GIL ~15 ms per session: docs/architecture.md)."""
        rt, name = self.cfg.runtime, msg.name
        try:
            payload = from_memfd(fds[0])
            model = payload["sessions"]
            model.threads = self.thread_plan(name)
            if not providers.ready(model.provider):  # its library can be loaded only before the sandbox
                raise providers.ProviderError(f"{model.provider.label} was not loaded when this lane started")
            model.use(model.provider, msg.on_cpu)  # as the control plane names it (a rollout's may be new)
            model.fault = self.cfg.runtime.fault_provider.get(name, "") if self.cfg.runtime.fault_injection else ""
            model.warmup_runs = self.cfg.model.warmup_runs
            model.warmup_deadline_s = max(5.0, 10 * rt.run_deadline_ms / 1e3)
            for g, fused in payload["fused"].items():
                model.add(g, fused)
        except Exception as e:  # BundleError, or anything ORT raises: the control plane refuses the load
            send(self.sock, Staged(name, None, str(e) or type(e).__name__), wait_s=REPLY_WAIT_S)
            return
        self.staged[name] = model
        send(self.sock, Staged(name, model.version, None, model.serving.label, model.fallback), wait_s=REPLY_WAIT_S)

    def on_commit(self, msg: Commit, fds) -> None:
        name = msg.name
        model = self.staged.pop(name)
        sessions = self._sessions_for_every_stream(name, model)
        self.models[name] = model
        self.engine.swap_model(name, model, sessions)
        self.trim.schedule()  # once the loop let go of the old version

    def _sessions_for_every_stream(self, name: str, model: SessionSet) -> dict:
        """{stream: its session in `model`} for every attached stream of model `name`, which `model` is about to
        serve (a commit, a promotion). A stream whose geometry `model` has no session for (attached after it was
        staged) is given up: the control plane drops its producer, which reconnects and is attached anew."""
        sessions = self._sessions_of(name, model)
        for s in self.streams.values():
            if s.model == name and s.index in self.rings and s not in sessions:
                epoch, reader = self.rings[s.index]
                send(self.sock, Dropped(s.index, epoch, f"model {name} {model.version} has no session for "
                                                        f"{reader.geometry_key}: reconnect"), wait_s=REPLY_WAIT_S)
                self.detach(s.index, epoch)
        return sessions

    def on_discard(self, msg: Discard, fds) -> None:
        self.staged.pop(msg.name, None)

    def _sessions_of(self, name: str, model: SessionSet, only=None) -> dict:
        """{stream: its session in `model`} for the attached streams of model `name` (those of `only`); a stream
        whose geometry `model` lacks is left out."""
        out = {}
        for s in self.streams.values():
            if s.model == name and s.index in self.rings and (only is None or s.index in only):
                session = model.get(self.rings[s.index].reader.geometry_key)
                if session is not None:
                    out[s] = session
        return out

    def on_starttrial(self, msg: StartTrial, fds) -> None:
        """The staged version of a model is a rollout's candidate: measured beside the serving one (lanes/trial.py)."""
        name = msg.name
        candidate = self.staged.pop(name, None)
        if candidate is None or name not in self.models or name in self.trials:
            self.log("error", f"model {name}: a trial without a staged candidate, or a second one: ignored")
            return
        try:
            trial = Trial(name, msg.mode, candidate, self.models[name], msg.sample, frozenset(msg.canary),
                          self.engine.loop_cpus or self.cpus)
            trial.start()
        except Exception as e:  # the control plane rolls the candidate back with this reason
            send(self.sock, TrialReport(name, candidate.version, 0, 0, 0, 0, 0, 0, (), (),
                                        f"the trial could not start: {type(e).__name__}: {e}"), wait_s=REPLY_WAIT_S)
            return
        self.trials[name] = trial
        self.engine.start_trial(name, trial, self._sessions_of(name, candidate, trial.canary))

    def on_promote(self, msg: Promote, fds) -> None:
        """The candidate serves every stream of its model from the next frame on."""
        trial = self.trials.pop(msg.name, None)
        if trial is None:
            return
        name, candidate = msg.name, trial.candidate
        sessions = self._sessions_for_every_stream(name, candidate)
        self.models[name] = candidate
        self.engine.end_trial(name, candidate, sessions)
        self.trim.schedule()

    def on_abort(self, msg: Abort, fds) -> None:
        """The candidate is dropped; its canary streams go back to the serving version."""
        trial = self.trials.pop(msg.name, None)
        if trial is None:
            return
        name = msg.name
        self.engine.end_trial(name, self.models[name], self._sessions_of(name, self.models[name], trial.canary))
        self.trim.schedule()

    def report_trials(self, now: float) -> None:
        if not self.trials or now < self.next_report:
            return
        self.next_report = now + TRIAL_REPORT_S
        for name, t in self.trials.items():
            for trouble in (t.sched_error, t.thread_error):  # like the loop's events: a line a minute at most
                if trouble and self.events_logged.hit((name, trouble), now) is not None:
                    self.log("warning", f"model {name}: the rollout's trial of {t.candidate.version}: {trouble}")
            r = t.report()
            send(self.sock, TrialReport(name, t.candidate.version, r["frames"], r["agreed"], r["answers"], r["runs"],
                                        r["errors"], r["skipped"], _sparse(t.candidate_hist), _sparse(t.serving_hist),
                                        None, _sparse(t.ratio_hist)))

    def on_attach(self, msg: Attach, fds) -> None:
        """Takes the ring's fd (fds[0]) and the fused graph's memfd (fds[1])."""
        index, epoch = msg.index, msg.epoch
        s = self.streams[index]
        geometry = msg.geometry
        model = self.models.get(s.model)
        try:
            # The camera may have rewritten its header since the control plane checked it: checked again here.
            reader = ring.FrameReader(fds[0], f"stream {s.name}", join=True)
            # The fused graph only if this geometry has no session yet: reading it took up to 5 ms of a camera's
            # first frame (issue 28), and a reconnecting camera's geometry has one.
            fused = None if model is not None and model.get(geometry) is not None else from_memfd(fds[1])
        except (ring.RingError, OSError, ValueError) as e:
            send(self.sock, Attached(index, epoch, str(e)), wait_s=REPLY_WAIT_S)
            return
        finally:
            for fd in fds:
                os.close(fd)
        reader.geometry_key = geometry
        reader.native.share(self.table.memory, self.table.cursor_offset(index), epoch, self.table.stats_offset(index),
                            len(OUTCOMES))
        serving = self.models[s.model]
        fell_back = serving.fallback
        try:
            session = serving.add(geometry, fused, pinned=self.pinned())
        except Exception as e:
            reader.close()
            send(self.sock, Attached(index, epoch, str(e)), wait_s=REPLY_WAIT_S)
            return
        if serving.fallback and not fell_back:  # this geometry was the first its provider could not take
            send(self.sock, ProviderFallback(s.model, serving.serving.label, serving.fallback), wait_s=REPLY_WAIT_S)
        trial = self.trials.get(s.model)
        if trial is not None and index in trial.canary:  # a canary stream is served by the candidate
            session = trial.candidate.get(geometry) or session
        self.rings[index] = Held(epoch, reader)
        self.engine.attach(s, reader, session, epoch)
        send(self.sock, Attached(index, epoch, None), wait_s=REPLY_WAIT_S)

    def pinned(self) -> set:
        return {reader.geometry_key for _epoch, reader in self.rings.values()}

    def on_detach(self, msg: Detach, fds) -> None:
        self.detach(msg.index, msg.epoch)

    def detach(self, index: int, epoch: int) -> None:
        held = self.rings.get(index)
        if held is not None and held.epoch == epoch:
            del self.rings[index]
            self.engine.detach(self.streams[index], held.reader)

    def on_stall(self, msg: Stall, fds) -> None:
        if self.cfg.runtime.fault_injection:
            self.engine.inject_stall(msg.seconds)

    def handle(self, msg, fds: list[int]) -> bool:
        """One message, dispatched by its type to `on_<type>`; False: stop. Fds not taken are closed."""
        if isinstance(msg, Stop):
            for fd in fds:
                os.close(fd)
            return False
        getattr(self, f"on_{type(msg).__name__.lower()}")(msg, fds)
        if not isinstance(msg, Attach):  # on_attach takes its fds
            for fd in fds:
                os.close(fd)
        return True

    # ---------------------------------------------------------------- run

    def chores(self) -> None:
        e = self.engine
        self.trim.run_due()
        self.report_trials(time.monotonic())
        counters = self.table.lane_counters(self.id)
        sets = list(self.models.values()) + list(self.staged.values()) + [t.candidate for t in self.trials.values()]
        counters[dispatch.LANE_SESSIONS] = sum(len(m.geometries) for m in sets)
        counters[dispatch.LANE_EVICTIONS] = sum(m.evictions for m in sets)
        e.cancel_overdue_run(self.cfg.runtime.run_deadline_ms / 1e3)  # counted by the loop when the run returns
        self.watch_provider_runs()
        for t in self.trials.values():  # a trial thread's run: counted an error by the thread when it returns
            t.cancel_overdue_run(self.cfg.runtime.run_deadline_ms / 1e3)
        while e.events:
            level, message = e.events.pop(0)  # a protocol.Log
            since = self.events_logged.hit((level, re.sub(r"\d+", "#", message)), time.monotonic())
            if since is not None:  # (an error on every frame is a line a minute, not one a frame)
                self.log(level, message + (f" (and {since} more like it since the last such line)" if since else ""))
        while e.muted:
            self.report_muted(e.muted.pop(0))
        while e.shorts:  # said by the control plane: a stream's frames go to any of its lanes
            send(self.sock, e.shorts.pop(0))  # a protocol.Short already
        while e.dropped:
            gone = e.dropped.pop(0)
            s = gone.stream
            held = self.rings.get(s.index)
            if held is not None and held.reader is gone.reader:
                del self.rings[s.index]
                send(self.sock, Dropped(s.index, held.epoch, gone.why), wait_s=REPLY_WAIT_S)
            gone.reader.close()

    def watch_provider_runs(self) -> None:
        """A model whose provider failed a run (raised, or passed run_deadline_ms and was cancelled) serves on the
        CPU provider from its next frame (said: ProviderFallback). A provider's run that does not end even when
        cancelled holds the loop: the lane says so and exits, and is restarted with that model on the CPU
        provider (lanes/supervisor.py)."""
        e = self.engine
        while e.provider_failed:
            session, why = e.provider_failed.pop(0)
            name = self._serving_with(session)
            # (not yet moved: frames that failed before the move are said by the loop's events; a model whose CPU
            # rebuild failed is not tried again at every frame)
            if name is not None and name not in self.cpu_refused:
                self.fall_back(name, why)
        running = e.running
        started = int(self.table.lane_counters(self.id)[dispatch.LANE_RUN_STARTED])
        if running is not None and not running.provider.is_cpu and started and \
                ring.monotonic_ns() - started > self.cfg.runtime.run_deadline_ms * 1e6 + self._hung_grace_ns():
            why = (f"{running.provider.label}: a run passed run_deadline_ms ({self.cfg.runtime.run_deadline_ms:g} ms) "
                   "and did not end when cancelled")
            name = self._serving_with(running)
            trying = next((n for n, t in self.trials.items() if running in t.candidate_sessions), None)
            msg: ProviderFallback | CandidateHung | Log
            if name is not None:
                msg = ProviderFallback(name, "cpu", f"{why}: the lane restarts with the model on the CPU provider",
                                       True)
            elif trying is not None:  # a canary stream's run on a rollout's candidate: the rollout rolls it back
                msg = CandidateHung(trying, why)
            else:  # a session dropped while its run was held (a candidate rolled back, a version swapped out)
                msg = Log("error", f"{why}, on a session no model serves any more (dropped while the run was held): "
                                   "the lane restarts")
            send(self.sock, msg, wait_s=REPLY_WAIT_S)
            os._exit(EXIT_PROVIDER_HUNG)  # its loop thread cannot be stopped: the control plane restarts the lane

    def _hung_grace_ns(self) -> float:
        """How long a cancelled provider run may take to end before it is held hung: as long again as
        run_deadline_ms, at least HUNG_GRACE_S (a slow run that ends late is not a hung driver); but ending
        HANG_MARGIN_S before lane_hang_s, when the control plane would kill the lane without knowing why (and
        restart it into the same hang)."""
        rt = self.cfg.runtime
        grace = max(HUNG_GRACE_S, rt.run_deadline_ms / 1e3)
        return max(0.0, min(grace, rt.lane_hang_s - HANG_MARGIN_S - rt.run_deadline_ms / 1e3)) * 1e9

    def _serving_with(self, session) -> str | None:
        """The name of the model whose serving version holds `session` (None: none does any more)."""
        return next((name for name, model in self.models.items() if model.holds(session)), None)

    def fall_back(self, name: str, why: str) -> None:
        """Model `name` (serving on a provider) serves on the CPU provider from the next frame on: its sessions
        rebuilt there for every geometry it holds, swapped in between two frames as a reload's are."""
        model = self.models[name]
        try:
            twin = model.on_cpu(why)
        except Exception as e:  # the CPU provider refusing what it served at the start: said; the errors go on
            self.cpu_refused.add(name)
            self.log("error", f"model {name}: its provider failed a run ({why}) and its sessions could not be "
                              f"rebuilt on the CPU provider: {type(e).__name__}: {e}")
            return
        self.models[name] = twin
        trial = self.trials.get(name)  # a rollout's canary streams stay on its candidate
        only = None if trial is None else set(self.streams) - set(trial.canary)
        self.engine.swap_model(name, twin, self._sessions_of(name, twin, only))
        self.trim.schedule()
        send(self.sock, ProviderFallback(name, twin.serving.label, twin.fallback), wait_s=REPLY_WAIT_S)

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
        send(self.sock, Ready(os.getpid(), gcwatch.frozen()))
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            while self.engine.alive:
                if poller.poll(TICK_S * 1000):
                    try:
                        msg, fds = receive(self.sock, TO_LANE)
                    except ProtocolError as e:  # cannot happen (our own control plane): said, and served on
                        self.log("error", f"a message from the control plane: {e}")
                        continue
                    if msg is None:
                        break
                    try:
                        if not self.handle(msg, fds):
                            break
                    except Exception as e:  # one bad command must not end the lane: said, and served on
                        self.log("error", f"{type(msg).__name__}: {type(e).__name__}: {e}")
                self.chores()
        finally:
            self.table.lane_counters(self.id)[dispatch.LANE_READY] = 0
            stopped = self.engine.stop(5.0)
            self.chores()
        return 0 if stopped else 1


def _sparse(hist: list[int]) -> tuple:
    """A histogram as flat (bucket, count) pairs of its non-empty buckets (a message stays small)."""
    return tuple(v for i, n in enumerate(hist) if n for v in (i, n))


def lane_main(lane: int, plans, cfg, streams, table, sock: socket.socket,
              identity: sandbox.LaneIdentity | None = None, extra_providers: tuple = ()) -> int:
    """The forked lane's whole life (the zygote's child); plans: every lane's (CPUs and models); identity: the
    uid and gid it takes when the daemon runs as root (support/sandbox.py); extra_providers: names of providers
    to load beyond its models' configured ones (a rollout's candidate provider: lanes/supervisor.py)."""
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
        # Its models' providers first: a plugin reads its own files as it loads, which the filter refuses; one
        # that cannot load is said by each model's Staged reply (its sessions on the CPU provider)
        specs = {cfg.model_entries()[m].provider.spec() for m in plan.models}
        specs |= {providers.ProviderSpec(n) for n in extra_providers if n in providers.NAMES}
        for spec in specs:
            try:
                providers.load(spec)
            except providers.ProviderError:
                pass  # kept by providers.load, said when the model is staged
        # Before the first camera byte and the first thread: its uid, capabilities, no_new_privs, seccomp filter.
        keeps_nice = sandbox.harden_lane(identity, cfg.runtime.scheduling, cfg.runtime.priority,
                                         jit=any(s.jit for s in specs))
        gcwatch.watch(table.lane_counters(lane))
        return Lane(lane, plans, cfg, streams, table, sock, keeps_nice).run()
    except Exception as e:
        send(sock, Log("error", f"lane stopped after {time.monotonic() - started:.1f} s: "
                                    f"{type(e).__name__}: {e}"))
        print(f"edgeinferd lane {lane}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
