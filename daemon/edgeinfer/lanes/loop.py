"""A lane's real-time loop: the newest frame of a stream it may serve → model → result ring.

One thread per lane process, created after the lane's first ONNX Runtime
sessions exist (so ORT's threads never inherit SCHED_FIFO), pinned and
real-time as configured. Per iteration: apply the lane's news (streams
attached or detached, a model swapped: a mailbox plus a doorbell the loop
sleeps on), sleep on every attached ring's doorbell at once, pick the ready
stream with the earliest deadline, claim it (no other lane serves it until we
are done), drop its frame if stale, run the fused model on the slot view in
place, release the slot, decode, publish, record, free the stream.

Several lanes may hold the same stream (every lane that holds its model); its
cursor in the dispatch table (dispatch.py, lanes.h) makes them take turns and
share what was consumed, so a free lane takes any ready frame of its models
(work-conserving) and no frame is served twice. A lane that frees a stream
with news already pending rings the other lanes' doorbells.

Deadlines come from the daemon's own clock: the moment a lane first saw a
stream's news, plus the stream's max_age. A producer's capture stamp decides
staleness and latency only, so back-dating frames buys no priority. A stream
passed over (by any lane) as many times as there are other ready streams is
served next: under overload every stream gets at least its share.

The loop never logs and shares no lock with other threads: what the lane's
control thread must hear about goes into `events` (list.append is atomic),
counters and latencies into the preallocated blocks of the dispatch table. A
duty ceiling keeps it from running a CPU at 100 % (which trips the kernel's RT
throttle: ~50 ms stalls): after busy time d it stays off the CPU for
d·(1−duty)/duty, and frames that arrive meanwhile are left to other lanes or
superseded and counted as overload.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from edgeinfer.lanes import dispatch, pick
from edgeinfer.abi import ring
from edgeinfer.support import sandbox
from edgeinfer.models.decoders import DecoderError
from edgeinfer.models.runtime import FusedSession, SessionSet
from edgeinfer.lanes.protocol import Log, Short
from edgeinfer.lanes.stats import words
from edgeinfer.lanes.stream import LaneStream
from edgeinfer.lanes.trial import Trial

_POLICIES = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR, "other": os.SCHED_OTHER}
PROVIDER_FAILED_MAX = 8  # failed provider runs waiting for the control thread (more are errors, counted)
SHORTS_PENDING_MAX = 64  # short frames waiting for the control thread to say why (more are counted, not said)


# The mailbox: the control thread → the loop, one record per command (never per frame), applied between frames.

class Serve(NamedTuple):
    """Serve `reader` (producer generation `epoch`) as `stream`, through `session`."""
    stream: LaneStream
    reader: ring.FrameReader
    session: FusedSession
    epoch: int


class Unserve(NamedTuple):
    """Stop serving `reader`, if it is still `stream`'s ring (the loop closes it either way)."""
    stream: LaneStream
    reader: ring.FrameReader


class SwapModel(NamedTuple):
    """Model `name` is `model` from the next frame on; `sessions`: the FusedSession of each attached stream."""
    name: str
    model: SessionSet
    sessions: dict[LaneStream, FusedSession]


class BeginTrial(NamedTuple):
    """`trial` (lanes/trial.py) measures model `name`'s candidate; `sessions`: its canary streams' sessions."""
    name: str
    trial: Trial
    sessions: dict[LaneStream, FusedSession]


class EndTrial(NamedTuple):
    """The trial of `name` ends: `model` serves it; `sessions`: the attached streams whose session changes."""
    name: str
    model: SessionSet
    sessions: dict[LaneStream, FusedSession]


Mail = Serve | Unserve | SwapModel | BeginTrial | EndTrial


# The outboxes: the loop → the control thread (list.append is atomic). `events` holds protocol.Log records and
# `shorts` protocol.Short ones (forwarded as they are); `dropped` these:

class GaveUp(NamedTuple):
    """The loop stopped serving `reader` (`stream`'s ring then) because `why`: its producer is to be dropped."""
    stream: LaneStream
    reader: ring.FrameReader
    why: str


class Loop:
    def __init__(self, models: dict[str, SessionSet], streams: list[LaneStream], *, lane: int = 0,
                 counters=None, bell: ring.Doorbell | None = None, peers=(), loop_cpus=(),
                 scheduling: str = "fifo", priority: int = 50, duty_ceiling: float = 0.9, spin_us: int = 0,
                 idle_timeout_ms: int = 100, peer_counters=None, release_nice: bool = False):
        self.models = dict(models)  # name → SessionSet: the lane's models
        self.trials: dict[str, Trial] = {}  # name → a rollout's candidate beside the model (loop-owned)
        self.streams = streams
        self.lane_id = lane + 1     # the cursor's owner word (0 = free)
        # The lane's counters (dispatch.LANE_*), shared with the control plane; private without a table. Written
        # as int64 words of a memoryview (stats.words: no numpy scalar per frame).
        self.counters = words(counters if counters is not None else np.zeros(dispatch.LANE_WORDS, np.int64))
        self.loop_cpus = tuple(loop_cpus)
        self.scheduling = scheduling
        self.priority = priority
        self.duty = duty_ceiling
        self.release_nice = release_nice  # a hardened lane: drop CAP_SYS_NICE once the priority is taken (sandbox)
        self.spin = spin_us / 1e6
        self.idle_timeout = idle_timeout_ms / 1e3
        self.events: list[Log] = []  # for the control thread to log (errors: rare, and rate-limited there)
        self.dropped: list[GaveUp] = []  # rings the loop gave up on
        self.muted: list[str] = []  # streams whose doorbell the loop stopped sleeping on, for the control thread
        # Frames counted short, for the control thread to say why (once a minute per stream, process.py).
        # Bounded: counted in stats anyway.
        self.shorts: list[Short] = []
        self.realtime_active = False
        self.native_tid = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._mailbox: collections.deque[Mail] = collections.deque()  # control thread → loop (append/popleft: atomic)
        self._bell = bell if bell is not None else ring.Doorbell()  # our doorbell (mail, and other lanes' kicks)
        self._peers = tuple(peers)  # the other lanes' doorbells: rung when we free a stream that has news
        self._peer_counters = dict(peer_counters or {})  # model → counters of the other lanes holding it
        self._waitset = ring.WaitSet()
        self._attached: list[LaneStream] = []      # loop-owned: streams with a ring, in wait-set order
        self._natives: list = []               # their native consumers (the wait set)
        self._waited = 0          # ns the loop slept before the frame being served
        self._woke = 0            # when the loop last woke (monotonic ns): its frames' pick stage starts there
        self._fault_stall = 0.0   # seconds; set by the fault hook only
        self._run_options = ort.RunOptions()  # one object, reused: terminate cancels the current run
        self.runs_cancelled = 0
        self.running: FusedSession | None = None  # the session of the run in progress (the control thread's watch)
        # Sessions on a provider other than the CPU one whose run failed (raised, or was cancelled), with why: the
        # control thread moves their model to the CPU provider (process.py). Bounded: a few frames fail at most
        # before it does.
        self.provider_failed: list[tuple[FusedSession, str]] = []

    @property
    def progress(self) -> int:
        """Loop iterations (the watchdog's evidence of life)."""
        return int(self.counters[dispatch.LANE_PROGRESS])

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # The loop needs the GIL back the moment ORT returns; a long switch
        # interval lets another thread keep it for up to 5 ms.
        sys.setswitchinterval(0.0005)
        self._apply_mail()  # what was posted before the start
        self._thread = threading.Thread(target=self._run, name="edgeinfer-rt", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Asks the loop to finish its current frame and exit; True if it did."""
        self._stop = True
        self._bell.ring()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---------------------------------------------------------------- the control thread's side

    def attach(self, stream: LaneStream, reader: ring.FrameReader, session: FusedSession, epoch: int = 0) -> None:
        """Serve `reader` (the producer generation `epoch`) as `stream` from the next iteration on."""
        self._post(Serve(stream, reader, session, epoch))

    def detach(self, stream: LaneStream, reader: ring.FrameReader) -> None:
        """Stop serving `reader` (if it is still the stream's ring)."""
        self._post(Unserve(stream, reader))

    def swap_model(self, name: str, model: SessionSet, sessions: dict[LaneStream, FusedSession]) -> None:
        """Serve model `name` as `model` from the next frame on, with `sessions` ({stream: FusedSession} for
        every attached stream of it). A frame never mixes two models: the loop applies it between frames."""
        self._post(SwapModel(name, model, sessions))

    def start_trial(self, name: str, trial: Trial, sessions: dict[LaneStream, FusedSession]) -> None:
        """From the next frame on, `trial` (lanes/trial.py) measures model `name`'s candidate; `sessions`: the
        candidate's FusedSession of each canary stream attached now."""
        self._post(BeginTrial(name, trial, sessions))

    def end_trial(self, name: str, model: SessionSet, sessions: dict[LaneStream, FusedSession]) -> None:
        """The trial of `name` ends: `model` serves it from the next frame on (the candidate: promoted; the serving
        version: aborted), with `sessions` for the attached streams whose session changes. The loop stops the
        trial's thread once it no longer uses it."""
        self._post(EndTrial(name, model, sessions))

    def _post(self, msg: Mail) -> None:
        self._mailbox.append(msg)
        self._bell.ring()

    # ---------------------------------------------------------------- thread set-up

    def _setup_thread(self) -> None:
        self.native_tid = threading.get_native_id()
        self.counters[dispatch.LANE_TID] = self.native_tid
        try:  # the kernel's thread name, so `ps -L`, `top -H` and `chrt -p` users can find the loop
            sandbox.name_thread(f"edgeinfer-rt{self.lane_id - 1}")
        except OSError:
            pass  # cosmetic only
        if self.loop_cpus:
            os.sched_setaffinity(0, self.loop_cpus)  # 0 = this thread
        if self.scheduling != "other":
            try:
                os.sched_setscheduler(0, _POLICIES[self.scheduling], os.sched_param(self.priority))
                self.realtime_active = True
                self.counters[dispatch.LANE_REALTIME] = 1
            except OSError as e:
                self.events.append(Log("warning", f"real-time scheduling ({self.scheduling}, priority {self.priority}) "
                                                  f"refused: {e.strerror}; the loop runs at normal priority"))
        if self.release_nice:  # from here on this thread holds no capability
            sandbox.release_nice()

    # ---------------------------------------------------------------- the loop

    def _apply_mail(self) -> None:
        """Applies the control thread's news, in order (loop thread, or before it starts), by its type."""
        changed = False
        while self._mailbox:
            msg = self._mailbox.popleft()
            if isinstance(msg, Serve):
                s, reader = msg.stream, msg.reader
                if s.reader is not None and s.reader is not reader:
                    s.reader.close()  # an earlier producer's ring whose detach was overtaken
                s.reader, s.session, s.epoch = reader, msg.session, msg.epoch
                lay = reader.layout
                s.geometry = (lay["width"], lay["height"])
                changed = True
            elif isinstance(msg, Unserve):
                if msg.stream.reader is msg.reader:
                    msg.stream.reader, msg.stream.session = None, None
                    changed = True
                msg.reader.close()  # nobody serves it here any more: our fd now, the mapping with its last reference
            elif isinstance(msg, BeginTrial):
                self.trials[msg.name] = msg.trial
                for s, session in msg.sessions.items():
                    s.session = session
            else:  # SwapModel (a reload's swap) or EndTrial
                if isinstance(msg, EndTrial) and msg.name in self.trials:
                    self.trials.pop(msg.name).stop()  # the loop's last touch of it: its thread may go now
                self.models[msg.name] = msg.model
                for s, session in msg.sessions.items():
                    s.session = session
        if changed:
            self._attached = [s for s in self.streams if s.reader is not None]
            self._natives = [s.reader.native for s in self._attached]

    def _note_muted(self, muted: int) -> None:
        """At most once per EI_MUTE_NS per stream and lane (ring.h), so bounded whatever the camera does."""
        for i, s in enumerate(self._attached):
            if muted >> i & 1:
                self.counters[dispatch.LANE_DOORBELL_MUTES] += 1
                self.muted.append(s.name)

    def _run(self) -> None:
        self._setup_thread()
        bell = self._bell
        counters = self.counters
        resume_at = 0
        try:
            while not self._stop:
                counters[dispatch.LANE_PROGRESS] += 1
                if bell.take():
                    self._apply_mail()
                now = ring.monotonic_ns()
                if now < resume_at:  # duty ceiling: stay off the CPU (other lanes take what arrives)
                    time.sleep((resume_at - now) / 1e9)
                waited_from = ring.monotonic_ns()
                mask = self._waitset.wait(self._natives, self.idle_timeout, self.spin, True, bell)
                if self._waitset.muted:  # a camera rang its doorbell without frames: now polled (ring.h)
                    self._note_muted(self._waitset.muted)
                if self._fault_stall:  # test-only fault hook (runtime.fault_injection), off in production
                    stall, self._fault_stall = self._fault_stall, 0.0
                    time.sleep(stall)
                mask &= (1 << len(self._natives)) - 1  # the bell's bit: handled at the top
                if not mask:
                    continue
                self._woke = ring.monotonic_ns()
                counters[dispatch.LANE_WAKEUPS] += 1
                self._waited = self._woke - waited_from
                picked = self._pick(mask)
                if picked is None:  # another lane claimed them first
                    continue
                group = self._group(*picked)
                started = ring.monotonic_ns()
                try:
                    self._serve(group)
                except Exception as e:  # whatever a camera's ring makes go wrong is its stream's, not the lane's
                    for s in group:  # the frame it consumed and did not count yet: an error (exactly one outcome)
                        st = s.stats
                        missing = s.reader.native.owed_total - st.outcomes_total() if s.reader is not None else 0
                        if missing > 0:
                            st.error += 1
                            st.overload += missing - 1
                    self.events.append(Log("error", f"stream {', '.join(s.name for s in group)}: "
                                                    f"{type(e).__name__}: {e}"))
                finally:
                    news = False
                    for s in group:
                        if s.reader is not None:
                            s.reader.native.release()  # a frame still held after a failure goes back
                            if s.reader.native.unclaim():
                                news = True
                    if news:
                        for peer in self._peers:  # news while we served it: a free lane may take it now
                            peer.ring()
                busy = ring.monotonic_ns() - started
                counters[dispatch.LANE_BUSY_NS] += busy
                resume_at = started + busy + int(busy * (1.0 - self.duty) / self.duty)
        except BaseException as e:  # the loop must never die silently
            self.events.append(Log("error", f"real-time loop stopped: {type(e).__name__}: {e}"))
            raise

    def _pick(self, mask: int) -> tuple[LaneStream, list[LaneStream]] | None:
        """Claims the first ready stream in the policy's order (pick.py: earliest deadline, the daemon's own
        arrival time + max_age, except that a stream passed over as many times as there are other ready streams
        goes first: nobody starves). (It, the ready streams in that order), or None if other lanes claimed every
        one first."""
        attached = self._attached
        if not mask & (mask - 1):  # one stream ready (the common case): nothing to order, nobody passed over
            s = attached[mask.bit_length() - 1]
            native = s.reader.native
            if native.claim(self.lane_id):
                native.picked()
                return s, ()  # _group finds no other ready stream to batch with
            return None
        ready = [attached[i] for i in range(len(attached)) if mask >> i & 1]
        now = ring.monotonic_ns()
        for s in ready:  # the cursors' words, read once into the records the policy orders (pick.py)
            native = s.reader.native
            s.deadline = pick.deadline(native.pending_since_ns, s.max_age_ns, now)
            s.passed_over = native.passed_over
        pick.rank(ready)
        for s in ready:
            native = s.reader.native
            if native.claim(self.lane_id):
                native.picked()
                for other in ready:
                    if other is not s:
                        other.reader.native.pass_over()
                return s, ready
        return None

    def _group(self, first: LaneStream, ready: list[LaneStream]) -> list[LaneStream]:
        """`first`, and with micro-batching (models.NAME.batch > 1) up to batch - 1 more ready streams of the
        same model and geometry, in the same order, claimed for this lane."""
        batch = self.models[first.model].batch
        if batch <= 1:
            return [first]
        # Work-conserving: with other lanes of this model idle, take only our share of the ready frames (pick.py).
        idle = pick.idle_lanes(self._peer_counters.get(first.model, ()))
        same = 1 + sum(1 for s in ready if s is not first and s.session is first.session) if idle > 1 else 0
        limit = pick.batch_limit(batch, same, idle)
        group = [first]
        for s in ready:
            if len(group) >= limit:
                break
            if s is not first and s.session is first.session and s.reader.native.claim(self.lane_id):
                s.reader.native.picked()  # served now: its pass-over count starts again
                group.append(s)
        return group

    def inject_stall(self, seconds: float) -> None:
        """Test fault hook: the loop stops making progress for `seconds` once."""
        self._fault_stall = seconds
        self._bell.ring()

    def cancel_overdue_run(self, deadline_s: float) -> bool:
        """Control thread: cancels a run that has taken longer than deadline_s (once)."""
        started = int(self.counters[dispatch.LANE_RUN_STARTED])
        if started and ring.monotonic_ns() - started > deadline_s * 1e9 and not self._run_options.terminate:
            self._run_options.terminate = True
            return True
        return False

    def _give_up(self, s: LaneStream, why: str) -> None:
        """Stops serving a ring that cannot be trusted any more; the control plane drops its producer."""
        self.dropped.append(GaveUp(s, s.reader, why))
        s.reader.native.unclaim()
        s.reader, s.session = None, None
        self._attached = [x for x in self._attached if x is not s]
        self._natives = [x.reader.native for x in self._attached]

    def _take(self, s: LaneStream):
        """The stream's newest frame, or None (a drop, counted): (frame, start, age)."""
        st = s.stats
        st.last_lane = self.lane_id - 1
        reader = s.reader
        frame = reader.take()
        if frame is None:
            status = reader.status
            if status == ring.TAKE_SHORT:
                st.short += 1
                native = reader.native
                st.overload += native.skipped
                if len(self.shorts) < SHORTS_PENDING_MAX:
                    self.shorts.append(Short(s.name, native.last_seq, native.short_len, native.frame_bytes,
                                        reader.geometry_key))
            elif status == ring.TAKE_CORRUPT:
                st.torn += 1
            else:
                reader.native.acknowledge_flags()  # woken by a flag (the producer closed the ring): seen
            return None
        st.overload += frame.skipped
        start = ring.monotonic_ns()
        if frame.capture_ns == 0 or frame.capture_ns > start:
            # Zero, future or wrapped: same host, same CLOCK_MONOTONIC, so never honest. Its age (and every
            # latency after it) would be meaningless, and out of int64 range for the histograms.
            frame.release()
            st.bad_timestamp += 1
            return None
        age = start - frame.capture_ns
        if age > s.max_age_ns:
            frame.release()
            st.stale += 1
            return None
        return frame, start, age

    def _serve(self, group: list[LaneStream]) -> None:
        first = group[0]
        trial = self.trials.get(first.model) if self.trials else None
        by_candidate = trial is not None and first.session in trial.candidate_sessions  # a canary stream
        # One model for the whole run, even if a reload swaps it meanwhile (a group shares one session, so one
        # version).
        model = trial.candidate if by_candidate else self.models[first.model]
        taken = []
        for s in group:
            got = self._take(s)
            if got is not None:
                taken.append((s, *got))
        if not taken:
            return
        session = taken[0][0].session
        if len(taken) == 1:
            s, frame, start, age = taken[0]
            frames = frame.batch  # the slot itself, read in place
        else:
            # Micro-batching: each frame copied once into the session's preallocated batch tensor, its slot
            # returned to its camera at once.
            for i, (s, frame, start, age) in enumerate(taken):
                np.copyto(session.rows[i], frame.array)
                frame.release()
                if s.reader.truncated:
                    s.stats.torn += 1
                    self._give_up(s, "the ring lost pages while mapped (SIGBUS absorbed)")
                    return
            frames = session.firsts[len(taken)]
            self.counters[dispatch.LANE_BATCHES] += 1
            self.counters[dispatch.LANE_COPIES] += len(taken)
        # During a trial both versions' run times are this thread's CPU time (the trial thread's runs are
        # preempted by this loop: wall time would count that against the candidate).
        run_from = time.thread_time_ns() if trial is not None else 0
        outputs = self._run_session(session, frames, taken)
        if outputs is None:
            if by_candidate:
                for _ in taken:
                    trial.failed()
            return
        if trial is not None:  # before the slot goes back: a sampled frame is copied for the trial's thread
            single = len(taken) == 1
            run_ns = (time.thread_time_ns() - run_from) // len(taken)  # per frame, as the trial thread's runs
            for i, (s, frame, start, age) in enumerate(taken):
                if trial.ran(frame.array if single else session.rows[i], s.reader.geometry_key, s.geometry, outputs,
                             -1 if single else i, run_ns, by_candidate):
                    self.counters[dispatch.LANE_COPIES] += 1
        if len(taken) == 1:
            s, frame, start, age = taken[0]
            frame.release()  # the slot goes back to the camera before we decode
            if s.reader.truncated:  # defence in depth: a sealed ring cannot lose pages; if it did, ORT read zeros
                s.stats.torn += 1
                self._give_up(s, "the ring lost pages while mapped (SIGBUS absorbed)")
                return
        inferred = ring.monotonic_ns()
        for i, (s, frame, start, age) in enumerate(taken):
            rows = outputs if len(taken) == 1 else [o[i:i + 1] for o in outputs]
            self._publish(s, model, frame, rows, start, age, inferred, trial if by_candidate else None)

    def _run_session(self, session: FusedSession, frames, taken):
        """session.run on `frames`, cancellable at run_deadline_ms; None (each frame counted an error) on failure."""
        counters = self.counters
        self._run_options.terminate = False
        # The run's own start, not the frames' `start`: waiting for the GIL in between must not count
        # against run_deadline_ms, or a slow pick gets a healthy run cancelled.
        counters[dispatch.LANE_RUN_STARTED] = ring.monotonic_ns()
        self.running = session
        try:
            return session.run(frames, self._run_options)
        except Exception as e:
            names = ", ".join(s.name for s, *_ in taken)
            for s, frame, *_ in taken:
                frame.release()
                s.stats.error += 1
            if self._run_options.terminate:
                self.runs_cancelled += 1
                counters[dispatch.LANE_CANCELLED] += 1
                why = "inference passed its deadline and was cancelled"
            else:
                why = f"inference failed: {e}"
            self.events.append(Log("error", f"stream {names}: {why}"))
            if not session.provider.is_cpu and len(self.provider_failed) < PROVIDER_FAILED_MAX:
                self.provider_failed.append((session, why))
            return None
        finally:
            counters[dispatch.LANE_RUN_STARTED] = 0
            self.running = None

    def _publish(self, s: LaneStream, model, frame, outputs, start: int, age: int, inferred: int,
                 trial=None) -> None:
        """trial: the rollout's trial when `model` is its candidate (a canary stream)."""
        st = s.stats
        try:
            payload, items = model.decoder.decode(outputs, s.geometry[0], s.geometry[1])
        except DecoderError as e:  # an output this frame made larger than its record: an error, never cut short
            st.error += 1
            if trial is not None:
                trial.decode_failed()
            self.events.append(Log("error", f"stream {s.name}: {e}"))
            return
        done = ring.monotonic_ns()
        writer = s.writer
        writer.resume()  # another lane may have written this stream's last record
        writer.set_wake(s.flags is None or s.flags[dispatch.FLAG_WAKE] != 0)
        st.publishing_head = writer.head  # the publish journal (stats.py): head first, then whose record it is
        st.publishing = s.reader.native.owed_total
        writer.write_served(frame, start, done, model.decoder.kind, payload, items, model.name_b, model.version_b,
                            s.geometry[0], s.geometry[1])
        published = ring.monotonic_ns()
        st.processed += 1
        self.counters[dispatch.LANE_FRAMES] += 1
        st.record(published - frame.capture_ns, inferred - start, age, published)
        st.stages.record_frame(self._waited, age, start - self._woke, inferred - start, done - inferred,
                               published - done, published - frame.capture_ns)
        st.last_frame_id = frame.frame_id
