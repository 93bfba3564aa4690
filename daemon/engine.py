"""The real-time loop: newest frame of every attached stream → model → result ring.

One thread, created after the first ONNX Runtime sessions exist (so ORT's
threads never inherit SCHED_FIFO), pinned and real-time as configured. Per
iteration: apply the control plane's news (streams attached or detached, a
model swapped: a mailbox plus a doorbell the loop sleeps on), sleep on every
attached ring's doorbell at once, pick the ready stream with the earliest
deadline, drop its frame if stale, run the fused model on the slot view in
place, release the slot, decode, publish, record.

Deadlines come from the loop's own clock: the moment it first saw a stream's
news, plus the stream's max_age. A producer's capture stamp decides staleness
and latency only, so back-dating frames buys no priority. A stream passed over
as many times as there are other ready streams is served next: under overload
every stream gets at least its share.

The loop never logs and shares no lock with other threads: what the main
thread must hear about goes into `events` (list.append is atomic), counters
and latencies into preallocated StreamStats. A duty ceiling keeps it from
running a CPU at 100 % (which trips the kernel's RT throttle: ~50 ms stalls):
after busy time d it stays off the CPU for d·(1−duty)/duty, and frames that
arrive meanwhile are superseded and counted as overload.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

import onnxruntime as ort

from edgeinfer import ring
from edgeinfer.model import FusedSession, ModelRuntime
from edgeinfer.stats import StreamStats

_POLICIES = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR, "other": os.SCHED_OTHER}
STATUS_OK = 0


class Stream:
    """One configured camera stream. The loop owns `reader`, `session`, `geometry`,
    `passed_over` and `stats`; the control plane (admission.py) owns the rest."""

    def __init__(self, name: str, writer: ring.ResultWriter, max_age_ms: float, priority: int = 0):
        self.name = name
        self.writer = writer
        self.max_age_ns = int(max_age_ms * 1e6)
        self.priority = priority
        self.stats = StreamStats(name)
        # loop-owned
        self.reader: ring.FrameReader | None = None
        self.session: FusedSession | None = None
        self.geometry = (0, 0)  # (width, height) of the attached ring
        self.passed_over = 0    # picks that went to other streams while this one was ready
        self.deadline = 0       # of the pending frame, set while picking
        # control-plane-owned
        self.conn = None                # the admitted producer's connection (ingress.Client)
        self.ring: ring.FrameReader | None = None  # the ring handed to the loop for it
        self.geometry_key = None        # (pixel format, height, width) being served
        self.last_geometry = None       # of the previous producer (geometry churn)
        self.geometry_changes: collections.deque = collections.deque()  # monotonic times of recent changes
        self.cooldown_until = 0.0       # producers refused until then (changed geometry too often)
        self.attach_count = 0           # producers admitted so far
        self.reader_count = 0           # reader connections held
        self.producer_desc = self.readers_desc = ""  # who may produce / read it, in words

    @property
    def connected(self) -> bool:
        """A producer is connected (its connection is the liveness)."""
        return self.conn is not None


class Engine:
    def __init__(self, model: ModelRuntime, streams: list[Stream], *, loop_cpus=(), scheduling: str = "fifo",
                 priority: int = 50, duty_ceiling: float = 0.9, spin_us: int = 0, idle_timeout_ms: int = 100):
        self.model = model
        self.streams = streams
        self.loop_cpus = tuple(loop_cpus)
        self.scheduling = scheduling
        self.priority = priority
        self.duty = duty_ceiling
        self.spin = spin_us / 1e6
        self.idle_timeout = idle_timeout_ms / 1e3
        self.events: list[tuple[str, str]] = []  # (level, message) for the main thread to log
        self.dropped: list[tuple[Stream, ring.FrameReader, str]] = []  # rings the loop gave up on, for the main thread
        self.realtime_active = False
        self.progress = 0       # bumped every iteration (the watchdog's evidence of life)
        self.native_tid = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._mailbox: collections.deque = collections.deque()  # control plane → loop (append/popleft are atomic)
        self._bell = ring.Doorbell()
        self._waitset = ring.WaitSet()
        self._attached: list[Stream] = []      # loop-owned: streams with a ring, in wait-set order
        self._natives: list = []               # their native consumers (the wait set)
        self._waited = 0          # ns the loop slept before the frame being served
        self._fault_stall = 0.0   # seconds; set by the fault hook only
        self._run_options = ort.RunOptions()  # one object, reused: terminate cancels the current run
        self._run_started = 0     # monotonic ns when the current run began, 0 outside runs
        self.runs_cancelled = 0

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # The loop needs the GIL back the moment ORT returns; a long switch
        # interval lets another thread keep it for up to 5 ms.
        sys.setswitchinterval(0.0005)
        self._apply_mail()  # what was posted before the start (restored streams)
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

    # ---------------------------------------------------------------- the control plane's side

    def attach(self, stream: Stream, reader: ring.FrameReader, session: FusedSession) -> None:
        """Control plane: serve `reader` as `stream` from the next iteration on."""
        self._post(("attach", stream, reader, session))

    def detach(self, stream: Stream, reader: ring.FrameReader) -> None:
        """Control plane: stop serving `reader` (if it is still the stream's ring)."""
        self._post(("detach", stream, reader, None))

    def swap_model(self, model: ModelRuntime, sessions: dict) -> None:
        """Control plane: serve `model` from the next frame on, with `sessions` ({stream: FusedSession}
        for every attached stream). A frame never mixes two models: the loop applies it between frames."""
        self._post(("model", model, sessions, None))

    def _post(self, msg) -> None:
        self._mailbox.append(msg)
        self._bell.ring()

    # ---------------------------------------------------------------- thread set-up

    def _setup_thread(self) -> None:
        self.native_tid = threading.get_native_id()
        try:  # the kernel's thread name, so `ps -L`, `top -H` and `chrt -p` users can find the loop
            with open(f"/proc/self/task/{self.native_tid}/comm", "w") as f:
                f.write("edgeinfer-rt")
        except OSError:
            pass  # cosmetic only
        if self.loop_cpus:
            os.sched_setaffinity(0, self.loop_cpus)  # 0 = this thread
        if self.scheduling != "other":
            try:
                os.sched_setscheduler(0, _POLICIES[self.scheduling], os.sched_param(self.priority))
                self.realtime_active = True
            except OSError as e:
                self.events.append(("warning", f"real-time scheduling ({self.scheduling}, priority {self.priority}) "
                                               f"refused: {e.strerror}; the loop runs at normal priority"))

    # ---------------------------------------------------------------- the loop

    def _apply_mail(self) -> None:
        """Applies the control plane's news, in order (loop thread, or before it starts)."""
        changed = False
        while self._mailbox:
            kind, a, b, c = self._mailbox.popleft()
            if kind == "attach":
                a.reader, a.session = b, c
                lay = b.layout
                a.geometry = (lay["width"], lay["height"])
                a.passed_over = 0
                changed = True
            elif kind == "detach":
                if a.reader is b:
                    a.reader, a.session = None, None
                    changed = True
                b.close()  # nobody serves it any more: our fd now, the mapping with its last reference
            else:  # model
                self.model = a
                for s, session in b.items():
                    s.session = session
        if changed:
            self._attached = [s for s in self.streams if s.reader is not None]
            self._natives = [s.reader.native for s in self._attached]

    def _run(self) -> None:
        self._setup_thread()
        bell = self._bell
        resume_at = 0
        try:
            while not self._stop:
                self.progress += 1
                if bell.take():
                    self._apply_mail()
                now = ring.monotonic_ns()
                if now < resume_at:  # duty ceiling: stay off the CPU
                    time.sleep((resume_at - now) / 1e9)
                waited_from = ring.monotonic_ns()
                mask = self._waitset.wait(self._natives, self.idle_timeout, self.spin, True, bell)
                if self._fault_stall:  # test-only fault hook (runtime.fault_injection), off in production
                    stall, self._fault_stall = self._fault_stall, 0.0
                    time.sleep(stall)
                mask &= (1 << len(self._natives)) - 1  # the bell's bit: handled at the top
                if not mask:
                    continue
                self._waited = ring.monotonic_ns() - waited_from
                stream = self._pick(mask)
                started = ring.monotonic_ns()
                self._serve(stream)
                busy = ring.monotonic_ns() - started
                resume_at = started + busy + int(busy * (1.0 - self.duty) / self.duty)
        except BaseException as e:  # the loop must never die silently
            self.events.append(("error", f"real-time loop stopped: {type(e).__name__}: {e}"))
            raise

    def _pick(self, mask: int) -> Stream:
        """Earliest deadline first (the loop's own arrival time + max_age), except that a stream passed
        over as many times as there are other ready streams goes first: nobody starves."""
        attached = self._attached
        ready = [attached[i] for i in range(len(attached)) if mask >> i & 1]
        if len(ready) == 1:
            return ready[0]
        now = ring.monotonic_ns()
        best = None
        for s in ready:
            since = s.reader.native.pending_since_ns or now
            s.deadline = since + s.max_age_ns
            if best is None or (s.passed_over, -s.deadline) > (best.passed_over, -best.deadline):
                best = s
        if best.passed_over < len(ready) - 1:  # nobody is owed a turn: plain earliest deadline
            best = min(ready, key=lambda s: s.deadline)
        for s in ready:
            s.passed_over = 0 if s is best else s.passed_over + 1
        return best

    def inject_stall(self, seconds: float) -> None:
        """Test fault hook: the loop stops making progress for `seconds` once."""
        self._fault_stall = seconds
        self._bell.ring()

    def cancel_overdue_run(self, deadline_s: float) -> bool:
        """Main thread: cancels a run that has taken longer than deadline_s (once)."""
        started = self._run_started
        if started and ring.monotonic_ns() - started > deadline_s * 1e9 and not self._run_options.terminate:
            self._run_options.terminate = True
            return True
        return False

    def _give_up(self, s: Stream, why: str) -> None:
        """Stops serving a ring that cannot be trusted any more; the main thread drops its producer."""
        self.dropped.append((s, s.reader, why))
        s.reader, s.session = None, None
        self._attached = [x for x in self._attached if x is not s]
        self._natives = [x.reader.native for x in self._attached]

    def _serve(self, s: Stream) -> None:
        st = s.stats
        model = self.model  # one model for the whole frame, even if a reload swaps it meanwhile
        reader = s.reader
        frame = reader.take()
        if frame is None:
            status = reader.status
            if status == ring.TAKE_SHORT:
                st.short += 1
                st.overload += reader.native.skipped
            elif status == ring.TAKE_CORRUPT:
                st.torn += 1
            else:
                reader.native.acknowledge_flags()  # woken by a flag (the producer closed the ring): seen
            return
        st.overload += frame.skipped
        start = ring.monotonic_ns()
        if frame.capture_ns == 0 or frame.capture_ns > start:
            # Zero, future or wrapped: same host, same CLOCK_MONOTONIC, so never honest. Its age (and every
            # latency after it) would be meaningless, and out of int64 range for the histograms.
            frame.release()
            st.bad_timestamp += 1
            return
        age = start - frame.capture_ns
        if age > s.max_age_ns:
            frame.release()
            st.stale += 1
            return
        session = s.session
        self._run_options.terminate = False
        # The run's own start, not the frame's `start`: waiting for the GIL in between must not count
        # against run_deadline_ms, or a slow pick gets a healthy run cancelled.
        self._run_started = ring.monotonic_ns()
        try:
            outputs = session.run(frame.batch, self._run_options)  # the slot itself, read in place
        except Exception as e:
            self._run_started = 0
            frame.release()
            st.error += 1
            if self._run_options.terminate:
                self.runs_cancelled += 1
                self.events.append(("error", f"stream {s.name}: inference passed its deadline and was cancelled"))
            else:
                self.events.append(("error", f"stream {s.name}: inference failed: {e}"))
            return
        self._run_started = 0
        frame.release()  # the slot goes back to the camera before we decode
        if reader.truncated:  # defence in depth: a sealed ring cannot lose pages; if it did, ORT read zeros
            st.torn += 1
            self._give_up(s, "the ring lost pages while mapped (SIGBUS absorbed)")
            return
        inferred = ring.monotonic_ns()
        payload, items = model.decoder.decode(outputs, s.geometry[0], s.geometry[1])
        done = ring.monotonic_ns()
        s.writer.write(frame_seq=frame.seq, frame_id=frame.frame_id, capture_ns=frame.capture_ns,
                       capture_realtime_ns=frame.capture_realtime_ns, start_ns=start, done_ns=done,
                       status=STATUS_OK, kind=model.decoder.kind, payload=payload, item_count=items,
                       model_name=model.name, model_version=model.version)
        published = ring.monotonic_ns()
        st.processed += 1
        st.record(published - frame.capture_ns, inferred - start, age, published)
        st.stages.record_frame(self._waited, age, inferred - start, done - inferred, published - done,
                               published - frame.capture_ns)
        st.last_frame_id = frame.frame_id
