"""The control plane's side of the lanes: spawn, feed, watch, restart.

Each lane is a process (process.py) forked by the zygote (zygote.py). The
control plane sends it the models it holds (each verified here, its graphs
fused and serialised here, sent in sealed memfds), and the rings of the streams of those models as producers attach.
A lane that dies (its pidfd becomes readable, or its socket hangs up) or
hangs (no loop progress for runtime.lane_hang_s) is killed, any stream it
held is freed, and it is started again, counted; meanwhile the other lanes
holding its models serve its streams. A lane restarted more than
runtime.lane_restarts times in runtime.lane_restart_window_s stays down: then
the watchdog stops being fed and systemd restarts the daemon.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import time
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

from edgeinfer.abi import ring
from edgeinfer.lanes import dispatch
from edgeinfer.lanes.fusedfds import FusedFds
from edgeinfer.lanes.handle import LaneHandle
from edgeinfer.models import providers
from edgeinfer.models.bundle import BundleError
from edgeinfer.lanes.process import EVENT_LOG_S, REPLY_WAIT_S, LogLimiter
from edgeinfer.lanes.protocol import (FROM_LANE, LOG_LEVELS, Abort, Attach, Attached, CandidateHung, Commit, Detach,
                                      Discard, Dropped, Log, ProtocolError, Promote, ProviderFallback, Ready, Short,
                                      Stage, Staged, Stall, StartTrial, Stop, TrialReport, receive, send, to_memfd)
from edgeinfer.lanes.trialbook import TrialBook
from edgeinfer.support.yamlconf import clip

if TYPE_CHECKING:
    from edgeinfer.config.schema import Config
    from edgeinfer.config.sections import LaneConfig
    from edgeinfer.lanes.stream import Stream
    from edgeinfer.lanes.zygote import Zygote
    from edgeinfer.models.runtime import ModelRuntime

log = logging.getLogger("edgeinferd")

WHY_MAX = 2000  # characters of a lane's reason kept (the journal, /healthz, rollouts.json): a lane is not trusted
REPLY_TIMEOUT_S = 60.0  # a lane building and warming a model's sessions (the watchdog is fed meanwhile)


class AttachedRing(NamedTuple):
    """A producer's ring handed to the lanes: the reader the control plane keeps, its generation, its geometry."""
    reader: ring.FrameReader
    epoch: int
    geometry: tuple


class Supervisor:
    def __init__(self, cfg: Config, plans: list[LaneConfig], streams: list[Stream], table: dispatch.DispatchTable,
                 zygote: Zygote, on_dropped: Callable[[Stream, int, str], None],
                 keepalive: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self.table = table
        self.zygote = zygote
        self.streams = streams            # every Stream (lanes/stream.py), by index order
        # The rings handed to the lanes, by stream index. A restarted lane gets them again from here; a reload
        # stages the geometries in use from here.
        self.attached: dict[int, AttachedRing] = {}
        self.lanes = [LaneHandle(i, p) for i, p in enumerate(plans)]
        self.runtimes: dict[str, ModelRuntime] = {}  # model name → the verified ModelRuntime being served
        self.on_dropped = on_dropped      # (stream, epoch, why): a lane gave up on, or refused, a ring
        self.keepalive = keepalive        # called while waiting on lanes (feeds the watchdog while they progress)
        self.fatal: str | None = None     # why the lanes cannot go on (the zygote died): the daemon exits
        self.stopped = False              # stop() was called: nothing is restarted any more
        self.shorts_logged = LogLimiter(EVENT_LOG_S)  # short frames, by stream (whichever lane took them)
        self.trials = TrialBook()         # the rollouts' trials: what each is, the lanes' reports, problems
        self.fused = FusedFds(cfg.runtime.max_sessions)  # the fused graphs handed over with rings, kept sealed
        # Models whose provider's run would not end in a lane (the lane restarted): staged on the CPU provider from
        # then on, in every lane, while that provider is theirs (until the daemon restarts): model → (provider, why)
        self.hung_providers: dict[str, tuple[str, str]] = {}

    def holding(self, model: str) -> list[LaneHandle]:
        return [ln for ln in self.lanes if model in ln.plan.models]

    # ---------------------------------------------------------------- start

    def start(self, runtimes: dict[str, ModelRuntime], geometries: dict[str, list[tuple]]) -> None:
        """Spawns every lane and loads its models; raises BundleError if a lane cannot load one."""
        self.runtimes = dict(runtimes)
        for ln in self.lanes:  # a model may start on the provider it was proven on, not the configured one
            ln.extra_providers |= {runtimes[m].provider.name for m in ln.plan.models
                                   if m in runtimes} & providers.PLUGINS
            self._spawn(ln)
        for name, model in runtimes.items():
            errors = self.stage(name, model, geometries.get(name, []))
            if errors:
                raise BundleError(f"model {name}: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
            self.commit(name)
        for ln in self.lanes:
            ln.state = "ready"

    def _spawn(self, ln: LaneHandle) -> None:
        ln.pid, ln.pidfd, ln.sock = self.zygote.spawn(ln.index, extra_providers=tuple(sorted(ln.extra_providers)))
        ln.state = "starting"
        ln.last_progress, ln.progress_at = -1, time.monotonic()
        msg = self._expect(ln, Ready)
        if msg is None:
            raise BundleError(f"{ln.name} did not start: {ln.last_error or 'it exited'}")
        ln.gc_frozen = msg.gc_frozen

    def _expect(self, ln: LaneHandle, kind: type, timeout_s: float = REPLY_TIMEOUT_S):
        """Waits for one reply of type `kind` from a lane, handling whatever else it says meanwhile. None: it
        is gone, said something that is not a message (ln.last_error says what), or did not answer in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r, _, _ = select.select([ln.sock], [], [], min(0.5, max(0.0, deadline - time.monotonic())))
            if self.keepalive is not None:
                self.refresh_progress()
                self.keepalive()
            if not r:
                continue
            try:
                msg, fds = receive(ln.sock, FROM_LANE)
                for fd in fds:
                    os.close(fd)
                if msg is None:
                    return None
                if isinstance(msg, kind):
                    return msg
                self._on_message(ln, msg)
            except ProtocolError as e:  # not trusted to serve on: killed, and restarted by poll()
                ln.last_error = f"it broke the lane protocol ({e})"
                self._kill(ln)
                return None
        ln.last_error = f"no {kind.__name__} reply within {timeout_s:g} s"
        return None

    # ---------------------------------------------------------------- models

    def stage(self, name: str, model: ModelRuntime, geometries: Iterable[tuple],
              lanes: list[LaneHandle] | None = None, on_its_provider: bool = False) -> dict[str, str]:
        """Every lane holding `name` (or those of `lanes`) builds and warms `model` (a verified ModelRuntime)
        next to what it serves, from the fused graphs made here. {lane: error} of refusals. on_its_provider: a
        lane that could build it only on the CPU provider refuses it (a candidate provider that cannot serve)."""
        errors = {}
        try:
            fd = to_memfd({"sessions": model.session_set(), "fused": {g: model.fused_model(*g) for g in geometries}},
                          "edgeinfer-model")
        except BundleError as e:  # the graph cannot take this geometry's preprocessing
            return {"control plane": str(e)}
        try:
            targets = [ln for ln in (lanes or self.holding(name)) if ln.sock is not None]
            for ln in targets:
                hung, why = self.hung_providers.get(name, ("", ""))
                if not send(ln.sock, Stage(name, why if hung == model.provider.said else ""), [fd],
                            wait_s=REPLY_WAIT_S):
                    errors[ln.name] = "its control socket is full or closed"
            for ln in targets:
                if ln.name in errors:
                    continue
                msg = self._expect(ln, Staged)
                if msg is None:
                    errors[ln.name] = ln.last_error or "it exited while loading the model"
                elif msg.error:
                    errors[ln.name] = msg.error
                elif on_its_provider and msg.fallback:
                    errors[ln.name] = f"its provider cannot serve there: {msg.fallback}"
                else:
                    ln.staged_providers[name] = (msg.serving, msg.fallback)
                    if msg.fallback:
                        self._say_fallback(name, ln, f"{model.version} {msg.fallback}")
        finally:
            os.close(fd)
        if errors:
            for ln in self.holding(name):
                ln.staged_providers.pop(name, None)
                if ln.sock is not None:
                    send(ln.sock, Discard(name), wait_s=REPLY_WAIT_S)
        return errors

    def commit(self, name: str, model: ModelRuntime | None = None) -> None:
        """Every lane holding `name` serves its staged version from its next frame on."""
        if model is not None:
            self.runtimes[name] = model
        for ln in self.holding(name):
            self._serves_staged(ln, name)
            if ln.sock is not None and not send(ln.sock, Commit(name), wait_s=REPLY_WAIT_S):
                self._lost(ln, "did not take the model's commit: restarted to serve one version")

    def start_trial(self, name: str, model: ModelRuntime, geometries: Iterable[tuple], mode: str, sample: float,
                    canary: Iterable[int]) -> None:
        """`model`, staged for `name` (stage(), for `geometries`), becomes its rollout's candidate in every lane
        holding it: measured in shadow, or serving the streams of `canary` (indices). Its reports arrive in
        self.trials; a lane restarted meanwhile is given it again (or says why not there)."""
        msg = StartTrial(name, mode, sample, tuple(canary))
        self.trials.begin(name, model, geometries, msg)
        for ln in self.holding(name):
            if ln.sock is not None and not send(ln.sock, msg, wait_s=REPLY_WAIT_S):
                self._lost(ln, "did not take the rollout's trial: restarted")

    def end_trial(self, name: str, promote_to: ModelRuntime | None = None) -> None:
        """Ends the trial of `name`: promote_to (the candidate's ModelRuntime) serves every stream, or (None) the
        candidate is dropped and the serving version serves on."""
        self.trials.end(name)
        if promote_to is not None:
            self.runtimes[name] = promote_to
        for ln in self.holding(name):
            if promote_to is not None:
                self._serves_staged(ln, name)
            else:
                ln.staged_providers.pop(name, None)
            msg = Promote(name) if promote_to is not None else Abort(name)
            if ln.sock is not None and not send(ln.sock, msg, wait_s=REPLY_WAIT_S):
                self._lost(ln, f"did not take the rollout's {type(msg).__name__.lower()}: restarted to serve one "
                               "version")

    # ---------------------------------------------------------------- streams

    def attach(self, stream: Stream, reader: ring.FrameReader, epoch: int, geometry: tuple) -> None:
        """Hands a producer's ring (generation `epoch`) to every live lane holding the stream's model."""
        self.attached[stream.index] = AttachedRing(reader, epoch, geometry)
        for ln in self.holding(stream.model):
            if ln.sock is not None:
                self._send_attach(ln, stream, reader, epoch, geometry)

    def _send_attach(self, ln: LaneHandle, stream: Stream, reader: ring.FrameReader, epoch: int,
                     geometry: tuple) -> None:
        fused = self.fused.fd(stream.model, self.runtimes[stream.model], geometry)
        if not send(ln.sock, Attach(stream.index, epoch, tuple(geometry)), [reader.fd, fused], wait_s=REPLY_WAIT_S):
            log.error("%s: cannot hand it stream %s (its control socket is full)", ln.name, stream.name)

    def detach(self, stream: Stream, epoch: int) -> None:
        held = self.attached.get(stream.index)
        if held is not None and held.epoch == epoch:
            del self.attached[stream.index]
        for ln in self.holding(stream.model):
            if ln.sock is not None:
                send(ln.sock, Detach(stream.index, epoch), wait_s=REPLY_WAIT_S)

    def stall(self, seconds: float) -> None:
        """Fault injection: every lane's loop stops for `seconds` once."""
        for ln in self.lanes:
            if ln.sock is not None:
                send(ln.sock, Stall(seconds))

    # ---------------------------------------------------------------- watching

    def _on_message(self, ln: LaneHandle, msg) -> None:
        """What a lane said unasked, by type. A lane is not trusted further than the protocol: a stream index
        it names must be one of its streams, a level one of LOG_LEVELS (else ProtocolError)."""
        if isinstance(msg, Log):
            if msg.level not in LOG_LEVELS:
                raise ProtocolError(f"Log.level {msg.level[:20]!r}")
            getattr(log, msg.level)("%s: %s", ln.name, msg.message)
        elif isinstance(msg, Dropped):
            self.on_dropped(self._stream_of(ln, msg.index), msg.epoch, msg.why)
        elif isinstance(msg, Short):
            if not any(s.name == msg.stream and s.model in ln.plan.models for s in self.streams):
                raise ProtocolError(f"Short.stream {msg.stream[:40]!r}: not one of {ln.name}'s streams")
            self.report_short(msg.stream, msg.seq, msg.received, msg.expected, msg.geometry)
        elif isinstance(msg, TrialReport):
            self.trials.keep(ln.index, ln.pid, ln.plan.models, msg)
        elif isinstance(msg, ProviderFallback):
            if msg.name not in ln.plan.models:
                raise ProtocolError(f"ProviderFallback.name {msg.name[:40]!r}: not one of {ln.name}'s models")
            msg = msg._replace(fallback=clip(msg.fallback, WHY_MAX))  # (a lane's words: bounded, as said on)
            ln.providers[msg.name] = (msg.serving, msg.fallback)
            self._say_fallback(msg.name, ln, msg.fallback)
            if msg.restart:  # the lane exits now (its loop is held by the run); restarted with the model on the CPU
                self.hung_providers[msg.name] = (self.runtimes[msg.name].provider.said, msg.fallback)
        elif isinstance(msg, CandidateHung):
            if msg.name not in ln.plan.models:
                raise ProtocolError(f"CandidateHung.name {msg.name[:40]!r}: not one of {ln.name}'s models")
            if msg.name in self.trials.trials:  # (else the trial ended meanwhile: the restart serves without it)
                self.trials.problems[msg.name] = (f"{ln.name}: the candidate's run did not end when cancelled "
                                                  f"({clip(msg.why, WHY_MAX)}); the lane restarts without the "
                                                  "candidate")
                log.error("model %s: %s", msg.name, self.trials.problems[msg.name])
                # The model's other lanes drop the candidate now, not at the rollout's next evaluation: the one
                # that takes over the canary streams while this one restarts would run into the same hang.
                for other in self.holding(msg.name):
                    if other is not ln and other.sock is not None:
                        send(other.sock, Abort(msg.name), wait_s=REPLY_WAIT_S)
        elif isinstance(msg, Attached) and msg.error:
            # The ring failed the lane's own checks (its camera rewrote it after admission, say): that camera
            # is dropped with the reason, and the lane serves on.
            stream = self._stream_of(ln, msg.index)
            log.error("%s: cannot serve stream %s: %s", ln.name, stream.name, msg.error)
            self.on_dropped(stream, msg.epoch, f"refused by {ln.name}: {msg.error}")

    def _stream_of(self, ln: LaneHandle, index: int) -> Stream:
        if not 0 <= index < len(self.streams) or self.streams[index].model not in ln.plan.models:
            raise ProtocolError(f"stream index {index}: not one of {ln.name}'s streams")
        return self.streams[index]

    def report_short(self, stream: str, seq: int, received: int, expected: int, geometry: tuple | None) -> None:
        """A frame counted `short`: said once per EVENT_LOG_S per stream, with both lengths (a camera that gets
        the frame length wrong sends every frame short, and without this line nothing says why)."""
        since = self.shorts_logged.hit(stream, time.monotonic())
        if since is not None:
            shape = f"{geometry[2]}x{geometry[1]} {geometry[0]}" if geometry else "this ring's"
            log.warning("stream %s: frame %d dropped as short: its payload_len is %d bytes, a whole %s frame is %d "
                        "bytes (ei_frame_payload_len in ring.h; nv12 and i420 take height x 3/2 rows)%s", stream, seq,
                        received, shape, expected,
                        f" ({since} more short frames since the last such line)" if since else "")

    def refresh_progress(self) -> None:
        now = time.monotonic()
        for ln in self.lanes:
            progress = int(self.table.lane_counters(ln.index)[dispatch.LANE_PROGRESS])
            if progress != ln.last_progress:
                ln.last_progress, ln.progress_at = progress, now

    def poll(self) -> None:
        """Control plane, every turn of its loop: messages, deaths, hangs, restarts. Never blocks long."""
        if not self.stopped and select.select([self.zygote.sock], [], [], 0)[0]:
            self.fatal = "the lanes' zygote exited: no lane can be restarted"
            return
        now = time.monotonic()
        for ln in self.lanes:
            if ln.sock is None:
                self._maybe_restart(ln, now)
                continue
            gone, why = False, "exited"
            # Whether it exited, seen before its socket is emptied: what it said before it exited is read first
            # (a lane says why before it exits for a hung run: CandidateHung, ProviderFallback.restart).
            exited = ln.pidfd is not None and bool(select.select([ln.pidfd], [], [], 0)[0])
            while select.select([ln.sock], [], [], 0)[0]:
                try:
                    msg, fds = receive(ln.sock, FROM_LANE)
                    for fd in fds:
                        os.close(fd)
                    if msg is None:
                        gone = True
                        break
                    self._on_message(ln, msg)
                except ProtocolError as e:  # a lane that breaks the protocol is not trusted to serve on
                    gone, why = True, f"broke the lane protocol ({e}): killed"
                    break
                except OSError:
                    gone = True
                    break
            gone = gone or exited
            if gone:
                self._lost(ln, why)
                continue
            progress = int(self.table.lane_counters(ln.index)[dispatch.LANE_PROGRESS])
            if progress != ln.last_progress:
                ln.last_progress, ln.progress_at = progress, now
            elif now - ln.progress_at > self.cfg.runtime.lane_hang_s:
                self._kill(ln)
                self._lost(ln, f"made no progress for {now - ln.progress_at:.1f} s: killed")

    def _kill(self, ln: LaneHandle) -> None:
        """SIGKILL through the pidfd, then waits (≤ 2 s) until it is gone. Without a pidfd the lane was gone
        before the zygote could open one (its pid may be someone else's by now): nothing to kill."""
        if ln.pidfd is None:
            return
        try:
            signal.pidfd_send_signal(ln.pidfd, signal.SIGKILL)
            select.select([ln.pidfd], [], [], 2.0)
        except OSError:
            pass

    def _lost(self, ln: LaneHandle, why: str) -> None:
        log.error("%s (pid %d) %s; its streams are served by the other lanes holding their models meanwhile",
                  ln.name, ln.pid, why)
        self._kill(ln)  # a closed socket with a live process (it should not happen) is not a lane either
        self._settle(ln, why)
        self._maybe_restart(ln, time.monotonic())

    def _settle(self, ln: LaneHandle, why: str) -> None:
        """Lane `ln` is gone (killed, or exited): closed, down, and what it held mid-frame accounted for."""
        self._last_words(ln)
        self._close(ln)
        ln.state = "down"
        ln.last_error = why
        counters = self.table.lane_counters(ln.index)
        counters[dispatch.LANE_READY] = 0
        counters[dispatch.LANE_RUN_STARTED] = 0
        # What it held mid-frame: the outcomes it owed are counted (every published frame has exactly one), then
        # the stream is freed (otherwise nobody could claim it again). It is dead now (_kill waited), and no other
        # lane writes an owner word that is not 0, so plain stores are safe.
        for s in self.table.settle_cursors_of(ln.index, self.streams):
            log.error("stream %s: frame %d had no outcome when %s died (%s): counted %s%s", s.stream, s.seq,
                      ln.name, why, s.outcome, f", and the {s.skipped} frames skipped before it as overload"
                      if s.skipped else "")
        self.table.free_cursors_of(ln.index)

    def _last_words(self, ln: LaneHandle) -> None:
        """What a lane that is gone still had queued on its socket about a hung run (it says so, then exits; a
        kill for no progress may cross it): taken, so that its restart does not stage the same hang again."""
        while ln.sock is not None and select.select([ln.sock], [], [], 0)[0]:
            try:
                msg, fds = receive(ln.sock, FROM_LANE)
            except (ProtocolError, OSError):
                return
            for fd in fds:
                os.close(fd)
            if msg is None:
                return
            if isinstance(msg, (CandidateHung, ProviderFallback)) and msg.name in ln.plan.models:
                self._on_message(ln, msg)

    def _close(self, ln: LaneHandle) -> None:
        if ln.sock is not None:
            ln.sock.close()
            ln.sock = None
        if ln.pidfd is not None:
            os.close(ln.pidfd)
            ln.pidfd = None

    def _maybe_restart(self, ln: LaneHandle, now: float) -> None:
        if self.stopped:
            return  # the daemon is stopping: a lane that exited was told to
        rt = self.cfg.runtime
        while ln.recent and ln.recent[0] < now - rt.lane_restart_window_s:
            ln.recent.popleft()
        if len(ln.recent) >= rt.lane_restarts:
            return  # recovery failed: stays down; the watchdog stops being fed
        if ln.recent and now - ln.recent[-1] < min(5.0, 0.1 * 2 ** len(ln.recent)):
            return  # backoff between attempts
        ln.recent.append(now)
        ln.restarts += 1
        self._respawn(ln, "restarted")

    def _respawn(self, ln: LaneHandle, what: str) -> bool:
        """A new process for lane `ln` (down), given what it serves: each model's serving version, a rollout's
        candidate, its streams' rings. False (said, the lane down): it could not be."""
        try:
            self._spawn(ln)
            for name in ln.plan.models:
                geometries = self.geometries_attached(name)
                errors = self.stage(name, self.runtimes[name], geometries, [ln]) if ln.sock is not None \
                    else {"": "gone"}
                if errors:
                    raise BundleError("; ".join(errors.values()))
                self._serves_staged(ln, name)
                send(ln.sock, Commit(name))
                if name in self.trials.trials and name not in self.trials.problems:  # (a problem: rolled back)
                    self._restart_trial(ln, name)
            for index, held in self.attached.items():
                if self.streams[index].model in ln.plan.models:
                    self._send_attach(ln, self.streams[index], held.reader, held.epoch, held.geometry)
            ln.state = "ready"
            log.info("%s %s (pid %d, restart %d)", ln.name, what, ln.pid, ln.restarts)
            return True
        except (BundleError, OSError, RuntimeError) as e:
            log.error("%s could not be restarted: %s", ln.name, e)
            self._kill(ln)
            self._close(ln)
            ln.state = "down"
            ln.last_error = str(e)
            return False

    def load_provider(self, name: str, spec) -> None:
        """Every lane holding model `name` can build sessions on `spec` (a ProviderSpec): one that did not load
        its library at its start (a lane loads only before its sandbox) is started again with it, one lane at a
        time (its streams served by the other lanes holding their models meanwhile, or waiting ~1 s).
        BundleError: a lane could not be."""
        for ln in self.holding(name):
            loaded = {self.cfg.model_entries()[m].provider.spec().name for m in ln.plan.models} | ln.extra_providers
            if spec.name in loaded or spec.name not in providers.PLUGINS:  # (in-box ones need no loading)
                continue
            ln.extra_providers.add(spec.name)
            log.info("%s: starting it again to load the %s provider for model %s's candidate", ln.name, spec.label,
                     name)
            self._lost_quietly(ln)
            if not self._respawn(ln, f"started again with the {spec.name} provider loaded"):
                raise BundleError(f"{ln.name} could not be started again with the {spec.label} provider: "
                                  f"{ln.last_error}")

    def _lost_quietly(self, ln: LaneHandle) -> None:
        """A planned stop of a lane to be started again at once: asked to stop after its frame (killed after 5 s)."""
        if ln.sock is not None:
            send(ln.sock, Stop())
        if ln.pidfd is not None and not select.select([ln.pidfd], [], [], 5.0)[0]:
            self._kill(ln)
        self._settle(ln, "stopped to be started again")

    def _restart_trial(self, ln: LaneHandle, name: str) -> None:
        """A lane restarted during a rollout of `name` gets its candidate again (what its predecessor measured
        still counts, under the old pid); if it cannot load it, the rollout is rolled back."""
        model, geometries, msg = self.trials.trials[name]
        errors = self.stage(name, model, geometries, [ln])
        if errors or not send(ln.sock, msg, wait_s=REPLY_WAIT_S):
            why = "; ".join(errors.values()) or "its control socket is full"
            self.trials.problems[name] = f"{ln.name} was restarted and could not take the candidate again: {why}"
            log.error("model %s: %s", name, self.trials.problems[name])
        else:
            log.info("model %s: %s restarted with the rollout's candidate %s beside the serving version", name,
                     ln.name, model.version)

    def geometries_attached(self, model: str) -> list[tuple]:
        """The geometries of the rings of `model`'s streams that the lanes serve now."""
        return sorted({held.geometry for i, held in self.attached.items() if self.streams[i].model == model})

    # ---------------------------------------------------------------- health

    def stuck(self, deadline_s: float) -> list[str]:
        """Lanes down, or whose loop made no progress within deadline_s (any thread: LaneHandle.is_stuck)."""
        now = time.monotonic()
        return [ln.name for ln in self.lanes if ln.is_stuck(self.table.lane_counters(ln.index), now, deadline_s)]

    def watchdog_ok(self, since: float) -> bool:
        """Every lane made progress after `since`, or is being restarted within its budget (LaneHandle)."""
        return all(ln.watchdog_ok(since, self.cfg.runtime.lane_restarts) for ln in self.lanes)

    @staticmethod
    def _say_fallback(name: str, ln: LaneHandle, why: str) -> None:
        log.error("model %s on %s: %s: serving on the CPU provider instead (edgeinfer_model_provider_fallback, "
                  "/healthz)", name, ln.name, why)

    @staticmethod
    def _serves_staged(ln: LaneHandle, name: str) -> None:
        if name in ln.staged_providers:
            ln.providers[name] = ln.staged_providers.pop(name)

    def providers(self, name: str) -> dict[str, tuple[str, str | None]]:
        """{lane: (the provider model `name` runs on there, why it is the CPU one and not the configured one)}."""
        return {ln.name: ln.providers[name] for ln in self.holding(name) if name in ln.providers}

    def status(self, now_ns: int) -> dict[str, dict]:
        return {ln.name: ln.status(self.table.lane_counters(ln.index)) for ln in self.lanes}

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped = True
        self.fused.close()
        for ln in self.lanes:
            if ln.sock is not None:
                send(ln.sock, Stop())
        deadline = time.monotonic() + timeout_s
        for ln in self.lanes:
            if ln.pidfd is not None:
                left = max(0.0, deadline - time.monotonic())
                if not select.select([ln.pidfd], [], [], left)[0]:
                    log.error("%s did not stop within %g s: killed", ln.name, timeout_s)
                    self._kill(ln)
            self._close(ln)
            ln.state = "down"
