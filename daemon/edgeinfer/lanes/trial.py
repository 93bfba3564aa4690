"""A rollout's candidate inside a lane: the second version of a model, and what it is measured on.

The control plane stages a candidate like a reload (Stage), then starts a trial (Trial) instead of committing:

- shadow: the serving version serves every stream. A sample of its frames (`sample`, counted by credit, not by
  chance) is copied once into a buffer made when the trial starts, with the serving version's outputs, and handed
  to the trial's own thread, which runs the candidate on it and compares both answers (models/agreement.py).
  That thread runs at SCHED_IDLE, pinned to the loop's CPUs: the kernel gives it only time the real-time loop
  leaves idle and takes the CPU back the moment the loop wakes, so a shadow run never delays a serving frame (a
  frame arriving meanwhile waits at most for the GIL, which the loop's 0.5 ms switch interval bounds). A sample
  taken while the thread is still busy is skipped, counted. Shadow outputs are never published.
- canary: the candidate serves the streams of `canary` (whole streams: one camera's results come from one
  version at a time, and say which); the others stay on the serving version. The thread runs the *serving*
  version on a sample of the canary streams' frames, so agreement is measured the same way.

Run times: the loop records every serving run (and in canary every candidate run) in a log-scale histogram
(8 buckets an octave, at most 12.5 % wide), the trial thread the candidate's shadow runs; both as the running
thread's CPU time, so like is compared with like (the trial thread's wall time would count every preemption by
the loop against the candidate). With ort_threads > 1 the intra-op pool's threads are not counted, for either
version. The lane reports the cumulative figures (TrialReport) about once
a second; the control plane (control/rollout.py) decides. Promote: the candidate becomes the lane's model. Abort:
the canary streams go back to the serving version. Either way the thread stops.

Threads: the loop writes the sampling state, the slot and (canary) the histograms; the trial thread writes the
meter, the candidate's counters in shadow and frees the slot. One writer per field; no lock is shared with the
loop (a slot flag and an eventfd).
"""
from __future__ import annotations

import copy
import os
import threading
import time

import numpy as np
import onnxruntime as ort

from edgeinfer.models.agreement import AgreementMeter
from edgeinfer.models.decoders import DecoderError

OCTAVE = 8                  # histogram buckets per doubling
BUCKETS = OCTAVE * 36       # up to about 2^35 µs: anything longer lands in the last bucket


def bucket(ns: int) -> int:
    """A run time's bucket: exact below 8 µs (1,024 ns units), then 8 per octave."""
    us = ns >> 10
    if us < OCTAVE:
        return max(us, 0)
    b = us.bit_length()
    return min((b - 3) * OCTAVE + ((us >> (b - 4)) & (OCTAVE - 1)), BUCKETS - 1)


def bucket_floor_us(i: int) -> float:
    """The lower bound of bucket i, in µs (of 1,024 ns)."""
    if i < OCTAVE:
        return float(i)
    octave, sub = divmod(i, OCTAVE)
    return float((OCTAVE + sub) << (octave - 1))


def quantile_us(hist, q: float) -> float | None:
    """The q-quantile of a bucket histogram, as its bucket's upper bound in µs (None: empty)."""
    total = sum(hist)
    if not total:
        return None
    need, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= need:
            return bucket_floor_us(i + 1) * 1.024
    return bucket_floor_us(len(hist)) * 1.024


class Trial:
    def __init__(self, name: str, mode: str, candidate, serving, sample: float, canary: frozenset,
                 cpus=()):
        """candidate, serving: the lane's two SessionSets of model `name`; canary: stream indices the candidate
        serves (canary mode); cpus: the loop's CPUs (the trial thread runs there, at SCHED_IDLE)."""
        self.name, self.mode, self.sample = name, mode, sample
        self.candidate, self.serving = candidate, serving
        self.canary = canary if mode == "canary" else frozenset()
        self.cpus = tuple(cpus)
        # The thread decodes with copies: a decoder reuses its buffers, and the loop decodes with the originals.
        self.meter = AgreementMeter(copy.deepcopy(serving.decoder), copy.deepcopy(candidate.decoder))
        self._candidate_decoder = self.meter.b
        self.serving_hist = [0] * BUCKETS
        self.candidate_hist = [0] * BUCKETS
        # The candidate's runs and, of those, the ones that failed, were cancelled or could not be decoded. One
        # writer each way: the loop in canary (it runs the candidate), the trial thread in shadow. A run is
        # counted before its failure, and report() reads the failures first: never more errors than runs.
        self.runs = 0
        self.errors = 0
        self.skipped = 0       # samples not taken: the thread was still busy, or no session for the geometry
        self.compare_errors = 0  # comparisons that raised (not the candidate's failure: said by the lane)
        self.credit = 0.0
        # Per geometry both versions have (resolved now: the thread never touches the sets' LRU), the two
        # sessions and one buffer the loop copies a sampled frame into.
        self.sessions = {}
        # The candidate's own sessions: a stream running one of these is served by the candidate (a canary stream
        # of a geometry the candidate lacks stays on the serving version).
        self.candidate_sessions = frozenset(candidate.get(g) for g in candidate.geometries)
        for g in candidate.geometries:
            mine, theirs = serving.get(g), candidate.get(g)
            if mine is not None and theirs is not None:
                self.sessions[g] = (mine, theirs, np.empty((1, *theirs.frame_shape), np.uint8))
        self.busy = False      # set by the loop when it fills the slot, cleared by the thread
        self.slot = None       # (geometry, (width, height), the served outputs, served by the candidate)
        self.thread_error: str | None = None  # the last comparison that raised
        self.sched_error: str | None = None   # SCHED_IDLE or the CPUs refused
        # The trial thread's run, cancellable like the loop's: the lane's control thread terminates it once it
        # has used more than the run deadline of the thread's own CPU time (a run at SCHED_IDLE may wait long
        # for a CPU; that is not the candidate's fault).
        self.run_options = ort.RunOptions()
        self.run_cpu_from = 0  # the thread's CPU time (ns) when its current run began; 0: not in a run
        self.cpu_clock: int | None = None
        self._stop = False
        self._efd = os.eventfd(0, os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-trial-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Called by the loop when it lets go of the trial (or before it ever had it): the thread finishes the
        run it is in, closes the eventfd and ends. Never blocks."""
        self._stop = True
        os.eventfd_write(self._efd, 1)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def cancel_overdue_run(self, deadline_s: float) -> bool:
        """The lane's control thread: cancels the trial thread's run once it used deadline_s of CPU (once)."""
        started, clock = self.run_cpu_from, self.cpu_clock
        if not started or clock is None or self.run_options.terminate:
            return False
        try:
            used = time.clock_gettime_ns(clock) - started
        except OSError:  # the thread has just ended
            return False
        if used > deadline_s * 1e9:
            self.run_options.terminate = True
            return True
        return False

    # ---------------------------------------------------------------- the loop's side (no lock; no allocation
    # unless the frame is sampled)

    def ran(self, frame: np.ndarray, geometry, size, outputs, row: int, run_ns: int, by_candidate: bool) -> bool:
        """A frame of this model was run by the loop (frame: its [H,W,C] view, still valid; size: (width,
        height); outputs: the run's, of a batch whose frame `row` this is (-1: not a batch); run_ns: the run's
        CPU time for this frame). True if the frame was copied for the trial thread (the lane counts copies)."""
        if by_candidate:
            self.runs += 1
        (self.candidate_hist if by_candidate else self.serving_hist)[bucket(run_ns)] += 1
        if self.mode == "canary" and not by_candidate:
            return False  # canary: agreement from the candidate's streams (the thread runs the serving version)
        self.credit += self.sample
        if self.credit < 1.0:
            return False
        self.credit -= 1.0
        pair = self.sessions.get(geometry)
        if self.busy or pair is None:
            self.skipped += 1
            return False
        np.copyto(pair[2][0], frame)
        self.slot = (geometry, size, outputs if row < 0 else [o[row:row + 1] for o in outputs], by_candidate)
        self.busy = True
        os.eventfd_write(self._efd, 1)
        return True

    def failed(self) -> None:
        """A candidate run by the loop (canary) failed, was cancelled or could not be decoded: counted a run (if
        the loop did not count it yet) and an error."""
        self.runs += 1
        self.errors += 1

    def decode_failed(self) -> None:
        """A candidate run the loop counted in ran() gave outputs its decoder refused (canary)."""
        self.errors += 1

    # ---------------------------------------------------------------- the trial thread

    def _setup(self) -> None:
        self.cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
        try:
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as e:  # then it competes at normal priority: said by the lane, never hidden
            self.sched_error = f"SCHED_IDLE refused ({e.strerror}): the candidate's runs compete with the loop"

    def _run(self) -> None:
        self._setup()
        try:
            self._serve()
        finally:
            os.close(self._efd)  # the loop writes no more once it stopped us

    def _serve(self) -> None:
        while True:
            os.eventfd_read(self._efd)
            if self._stop:
                return
            if self.slot is None:
                continue
            geometry, (w, h), served, by_candidate = self.slot
            try:
                self._compare(geometry, w, h, served, by_candidate)
            except Exception as e:  # the trial must not die silently: counted, said by the lane
                self.compare_errors += 1
                self.thread_error = f"{type(e).__name__}: {e}"
            finally:
                self.slot = None
                self.busy = False

    def _compare(self, geometry, w: int, h: int, served, by_candidate: bool) -> None:
        serving, candidate, buf = self.sessions[geometry]
        self.run_options.terminate = False
        self.run_cpu_from = started = time.thread_time_ns()
        try:
            outputs = (serving if by_candidate else candidate).run(buf, self.run_options)
        except Exception:
            if not by_candidate:  # shadow: the candidate's run failed or was cancelled
                self.runs += 1
                self.errors += 1
            return
        finally:
            self.run_cpu_from = 0
        if not by_candidate:  # shadow: the candidate's run, as this thread's own CPU time
            self.runs += 1
            self.candidate_hist[bucket(time.thread_time_ns() - started)] += 1
            try:
                self._candidate_decoder.decode(outputs, w, h)
            except DecoderError:
                self.errors += 1
                return
        serving_out, candidate_out = (outputs, served) if by_candidate else (served, outputs)
        self.meter.add(serving_out, candidate_out, w, h)

    def report(self) -> dict:
        """The cumulative figures, each read before the one it may not exceed (agreed before answers, errors
        before runs): the writers update them the other way round."""
        m = self.meter
        agreed, errors = m.agreed, self.errors
        return {"frames": m.frames, "agreed": agreed, "answers": m.total, "runs": self.runs, "errors": errors,
                "skipped": self.skipped}
