"""The real-time loop: newest frame of every stream → model → result ring.

One thread, created after the first ONNX Runtime sessions exist (so ORT's
threads never inherit SCHED_FIFO), pinned and real-time as configured. Per
iteration: sleep on every stream's doorbell at once, pick the ready stream
whose frame is oldest (earliest deadline), drop it if stale, run the fused
model on the slot view in place, release the slot, decode, publish, record.

The loop never logs and shares no lock with other threads: what the main
thread must hear about goes into `events` (list.append is atomic), counters
and latencies into preallocated StreamStats. A duty ceiling keeps it from
running a CPU at 100 % (which trips the kernel's RT throttle: ~50 ms stalls):
after busy time d it stays off the CPU for d·(1−duty)/duty, and frames that
arrive meanwhile are superseded and counted as overload.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import onnxruntime as ort

from edgeinfer import ring
from edgeinfer.bundle import BundleError
from edgeinfer.model import FusedSession, ModelRuntime
from edgeinfer.stats import StreamStats

_POLICIES = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR, "other": os.SCHED_OTHER}
STATUS_OK = 0


class Stream:
    """One configured camera stream as the loop sees it."""

    def __init__(self, name: str, reader: ring.FrameReader, writer: ring.ResultWriter, max_age_ms: float,
                 priority: int = 0):
        self.name = name
        self.reader = reader
        self.writer = writer
        self.max_age_ns = int(max_age_ms * 1e6)
        self.priority = priority
        self.stats = StreamStats(name)
        self.session: FusedSession | None = None
        self.attach_seen = -1  # reader.attach_count the session was chosen for
        self.model_seen = None  # the model the session belongs to
        self.geometry = (0, 0)  # (width, height) of the attached ring
        self.reported_error: str | None = None  # main thread: the refusal last logged
        self.reported_attach = 0                # main thread: the attach last logged
        self.reported_truncations = 0           # main thread: shrunk segments already logged


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
        self.realtime_active = False
        self.progress = 0       # bumped every iteration (the watchdog's evidence of life)
        self.native_tid = 0
        self._stop = False
        self._thread: threading.Thread | None = None
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
        self._thread = threading.Thread(target=self._run, name="edgeinfer-rt", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Asks the loop to finish its current frame and exit; True if it did."""
        self._stop = True
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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

    def _run(self) -> None:
        self._setup_thread()
        readers = [s.reader for s in self.streams]
        by_reader = {id(s.reader): s for s in self.streams}
        resume_at = 0
        try:
            while not self._stop:
                self.progress += 1
                now = ring.monotonic_ns()
                if now < resume_at:  # duty ceiling: stay off the CPU
                    time.sleep((resume_at - now) / 1e9)
                waited_from = ring.monotonic_ns()
                ready = ring.wait_any(readers, self.idle_timeout, self.spin)
                if self._fault_stall:  # test-only fault hook (runtime.fault_injection), off in production
                    stall, self._fault_stall = self._fault_stall, 0.0
                    time.sleep(stall)
                if not ready:
                    continue
                self._waited = ring.monotonic_ns() - waited_from
                stream = by_reader[id(ready[0])]
                if len(ready) > 1:
                    # Earliest deadline first: the oldest frame relative to its stream's max age.
                    best = None
                    for r in ready:
                        s = by_reader[id(r)]
                        deadline = r.peek_capture_ns() + s.max_age_ns
                        if best is None or deadline < best:
                            best, stream = deadline, s
                started = ring.monotonic_ns()
                self._serve(stream)
                busy = ring.monotonic_ns() - started
                resume_at = started + busy + int(busy * (1.0 - self.duty) / self.duty)
        except BaseException as e:  # the loop must never die silently
            self.events.append(("error", f"real-time loop stopped: {type(e).__name__}: {e}"))
            raise

    def inject_stall(self, seconds: float) -> None:
        """Test fault hook: the loop stops making progress for `seconds` once."""
        self._fault_stall = seconds

    def cancel_overdue_run(self, deadline_s: float) -> bool:
        """Main thread: cancels a run that has taken longer than deadline_s (once)."""
        started = self._run_started
        if started and ring.monotonic_ns() - started > deadline_s * 1e9 and not self._run_options.terminate:
            self._run_options.terminate = True
            return True
        return False

    def swap_model(self, model: ModelRuntime) -> None:
        """Serves `model` from the next frame on (one attribute store: the loop
        reads self.model once per frame, so a frame never mixes two models)."""
        self.model = model

    def _session_for(self, stream: Stream, model: ModelRuntime) -> FusedSession | None:
        if stream.reader.attach_count != stream.attach_seen or stream.model_seen is not model:
            # A new segment (first attach, restarted producer) or a new model: choose the session once.
            stream.attach_seen = stream.reader.attach_count
            stream.model_seen = model
            layout = stream.reader.layout
            fmt = ring.PIXEL_FORMAT_NAMES[layout["pixel_format"]]
            stream.geometry = (layout["width"], layout["height"])
            try:
                stream.session = model.session_for(fmt, layout["height"], layout["width"])
            except BundleError as e:
                stream.session = None
                self.events.append(("error", f"stream {stream.name}: cannot serve {layout['width']}x"
                                             f"{layout['height']} {fmt} frames: {e}"))
        return stream.session

    @staticmethod
    def _detach_if_truncated(s: Stream) -> None:
        """Detaches a ring whose producer shrank it under our mapping (its lost pages read as zeros,
        native/sigbus_guard.h); the reason is the stream's last_error, which the main thread logs."""
        if s.reader.truncated:
            try:
                s.reader.refresh()
            except ring.RingError as e:
                s.reader.last_error = e

    def _serve(self, s: Stream) -> None:
        st = s.stats
        model = self.model  # one model for the whole frame, even if a reload swaps it meanwhile
        try:
            frame = s.reader.acquire_latest()
        except ring.CorruptFrame:
            st.torn += 1
            self._detach_if_truncated(s)
            return
        if frame is None:
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
        session = self._session_for(s, model)
        if session is None:
            frame.release()
            st.error += 1
            return
        self._run_options.terminate = False
        # The run's own start, not the frame's `start`: picking a session (or waiting for the GIL) in between
        # must not count against run_deadline_ms, or a slow pick gets a healthy run cancelled.
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
        if s.reader.truncated:  # the producer shrank the ring mid-run: ORT read zero pages, not its frame
            st.torn += 1
            self._detach_if_truncated(s)
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
