"""A rollout's candidate inside a lane: the second version of a model, and what it is measured on.

The control plane stages a candidate like a reload (Stage), then starts a trial (Trial) instead of committing:

- shadow: the serving version serves every stream. A sample of its frames (`sample`, counted by credit, not by
  chance) is copied once into a buffer made when the trial starts and handed to the trial's own thread, which
  runs both versions on it, back to back, and compares both answers (models/agreement.py).
  That thread runs at SCHED_IDLE, pinned to the loop's CPUs: the kernel gives it only time the real-time loop
  leaves idle and takes the CPU back the moment the loop wakes, so a shadow run never delays a serving frame (a
  frame arriving meanwhile waits at most for the GIL, which the loop's 0.5 ms switch interval bounds). A sample
  taken while the thread is still busy is skipped, counted. Shadow outputs are never published.
- canary: the candidate serves the streams of `canary` (whole streams: one camera's results come from one
  version at a time, and say which); the others stay on the serving version. The thread runs both versions on
  a sample of the canary streams' frames, so agreement and run time are measured the same way.

Run times are *paired*: the trial thread runs the candidate and the serving version on the same frame, on the same
thread, one right after the other, alternating which goes first, each timed as the thread's own CPU time. What
slows the host (another process on the lane's CPU, a busy memory bus, the loop's preemptions) hits both runs of a
pair alike, and the alternation cancels what the first run leaves the second (warm caches). Each pair's ratio
candidate ÷ serving goes into a log-scale histogram (RATIO_STEPS buckets a doubling); the gate is on the median of
those ratios and its confidence bound (median_bounds), never on two tails measured at different times. Both
versions' run times also go into histograms (8 buckets an octave) for the p99 figures, which only inform. With
ort_threads > 1 the intra-op pool's threads are not counted, for either version. The loop only counts the
candidate's runs when it serves (canary): no clock is read and nothing is allocated for the trial on a frame that
is not sampled. The lane reports the cumulative figures (TrialReport) about once a second; the control plane (control/rollout.py) decides. Promote: the candidate becomes the lane's model. Abort:
the canary streams go back to the serving version. Either way the thread stops.

Threads: the loop writes the sampling state, the slot and (canary) the histograms; the trial thread writes the
meter, the candidate's counters in shadow and frees the slot. One writer per field; no lock is shared with the
loop (a slot flag and an eventfd).
"""
from __future__ import annotations

import copy
import math
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


# Paired run times: each sampled frame is run by both versions back to back on the trial thread (lanes/trial.py),
# and the ratio candidate ÷ serving of that pair lands in a log-scale histogram: RATIO_STEPS buckets a doubling,
# ratio 1 at RATIO_ZERO, from 1/256 to 256 (anything beyond lands in the end buckets).
RATIO_STEPS = 32
RATIO_ZERO = RATIO_STEPS * 8
RATIO_BUCKETS = 2 * RATIO_ZERO + 1


def ratio_bucket(candidate_ns: int, serving_ns: int) -> int:
    """The bucket of one pair's ratio (bucket i holds ratios within half a step of 2^((i - RATIO_ZERO) / steps))."""
    if serving_ns <= 0 or candidate_ns <= 0:
        return RATIO_BUCKETS - 1 if candidate_ns > 0 else 0 if serving_ns > 0 else RATIO_ZERO
    i = round(RATIO_STEPS * math.log2(candidate_ns / serving_ns)) + RATIO_ZERO
    return min(max(i, 0), RATIO_BUCKETS - 1)


def ratio_edges(i: int) -> tuple[float, float]:
    """The ratios bucket i holds: [low, high)."""
    return 2 ** ((i - RATIO_ZERO - 0.5) / RATIO_STEPS), 2 ** ((i - RATIO_ZERO + 0.5) / RATIO_STEPS)


def median_bounds(hist, confidence: float) -> tuple[float, float, float] | None:
    """(median, low, high) of the paired ratios in `hist` (RATIO_BUCKETS counts): the median and a
    distribution-free confidence interval for it (the order statistics k and n + 1 - k with k the binomial(n, ½)
    quantile, normal approximation), widened to their buckets' edges. None: no pair. With few pairs the interval
    spans the whole histogram (it is then (smallest, largest))."""
    from edgeinfer.models.agreement import z_score
    n = sum(hist)
    if not n:
        return None
    half = z_score(confidence) * math.sqrt(n) / 2
    k_low = max(1, math.floor(n / 2 - half))        # 1-based ranks
    k_high = min(n, math.ceil(n / 2 + half) + 1)
    k_mid = (n + 1) // 2
    found, seen = {}, 0
    for i, c in enumerate(hist):
        if not c:
            continue
        seen += c
        for name, k in (("low", k_low), ("mid", k_mid), ("high", k_high)):
            if name not in found and seen >= k:
                found[name] = i
    mid = ratio_edges(found["mid"])
    return math.sqrt(mid[0] * mid[1]), ratio_edges(found["low"])[0], ratio_edges(found["high"])[1]


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
        # Written by the trial thread only: the paired runs' times and ratios.
        self.serving_hist = [0] * BUCKETS
        self.candidate_hist = [0] * BUCKETS
        self.ratio_hist = [0] * RATIO_BUCKETS
        self.candidate_first = False  # which version the next pair runs first (alternates)
        # The candidate's runs and, of those, the ones that failed, were cancelled or could not be decoded. One
        # writer each way: the loop in canary (it runs the candidate), the trial thread in shadow. A run is
        # counted before its failure, and report() reads the failures first: never more errors than runs.
        self.runs = 0
        self.errors = 0
        self.trial_runs = 0    # the trial thread's own candidate runs, and of those the failures (its one writer)
        self.trial_errors = 0
        self.lost = 0          # pairs the serving version's run failed in (not the candidate's fault): skipped
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
        self.slot: tuple[tuple, tuple[int, int]] | None = None  # (geometry, (width, height))
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
        height); outputs, row, run_ns: the loop's run, not used: the trial thread runs both versions itself).
        True if the frame was copied for the trial thread (the lane counts copies)."""
        if by_candidate:
            self.runs += 1
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
        self.slot = (geometry, size)
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
            geometry, (w, h) = self.slot
            try:
                self._compare(geometry, w, h)
            except Exception as e:  # the trial must not die silently: counted, said by the lane
                self.compare_errors += 1
                self.thread_error = f"{type(e).__name__}: {e}"
            finally:
                self.slot = None
                self.busy = False

    def _timed(self, session, buf):
        """One run on this thread: (outputs, its CPU time in ns). Raises what the run raised (cancelled too)."""
        self.run_options.terminate = False
        self.run_cpu_from = started = time.thread_time_ns()
        try:
            outputs = session.run(buf, self.run_options)
            return outputs, time.thread_time_ns() - started
        finally:
            self.run_cpu_from = 0

    def _compare(self, geometry, w: int, h: int) -> None:
        """Both versions on the sampled frame, back to back, the first one alternating: a pair."""
        serving, candidate, buf = self.sessions[geometry]
        self.candidate_first = first = not self.candidate_first
        done = {}
        for is_candidate in ((True, False) if first else (False, True)):
            try:
                done[is_candidate] = self._timed(candidate if is_candidate else serving, buf)
            except Exception:
                if is_candidate:  # the candidate's run failed or was cancelled: its error
                    self.trial_runs += 1
                    self.trial_errors += 1
                else:  # the serving version's: the pair is lost, not the candidate's fault
                    self.lost += 1
                return
            if is_candidate:
                self.trial_runs += 1
        (c_out, c_ns), (s_out, s_ns) = done[True], done[False]
        self.candidate_hist[bucket(c_ns)] += 1
        self.serving_hist[bucket(s_ns)] += 1
        try:
            self._candidate_decoder.decode(c_out, w, h)
        except DecoderError:
            self.trial_errors += 1
            return
        self.ratio_hist[ratio_bucket(c_ns, s_ns)] += 1
        self.meter.add(s_out, c_out, w, h)

    def report(self) -> dict:
        """The cumulative figures, each read before the one it may not exceed (agreed before answers, errors
        before runs): the writers update them the other way round."""
        m = self.meter
        agreed, errors = m.agreed, self.errors + self.trial_errors
        return {"frames": m.frames, "agreed": agreed, "answers": m.total, "runs": self.runs + self.trial_runs,
                "errors": errors, "skipped": self.skipped + self.lost}
