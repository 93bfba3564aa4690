"""The daemon's state as its reporters read it: one typed snapshot, built by the control plane on demand.

/metrics (metrics.py), `edgeinferctl status`, the stats file and systemd's
STATUS= (control/status.py) all read a `Snapshot`, never the daemon's objects.
Counters the lanes keep in shared memory (each stream's `stats`) are read live
through it: they are lock-free and written by the lanes only.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class StreamView:
    name: str
    model: str
    stats: Any                    # lanes.stats.StreamStats: the dispatch table's counters and histograms
    connected: bool               # a producer is connected
    producer: str | None          # who, in words
    geometry: tuple | None        # (pixel format, height, width) served now
    attaches: int                 # producers admitted so far
    readers: int                  # reader connections held
    pool: str | None = None       # the front's pool it is a stream of (pools: in the configuration); None: a camera's


@dataclasses.dataclass(frozen=True)
class Figures:
    """A rollout's window so far, over every lane."""
    frames: int                    # frames compared
    agreement: float | None        # share of answers agreed
    runs: int                      # candidate runs
    errors: int
    skipped: int                   # samples not taken (no idle time, or no session for the geometry)
    p99_candidate_us: float | None
    p99_serving_us: float | None
    elapsed_s: float
    # The evidence's strength (control/rollout.py): agreement's Wilson interval, and the median of the paired
    # run-time ratios candidate ÷ serving with its interval, both at the gates' confidence; pairs: ratios counted.
    agreement_low: float | None = None
    agreement_high: float | None = None
    time_ratio: float | None = None
    time_ratio_low: float | None = None
    time_ratio_high: float | None = None
    pairs: int = 0
    confidence: float | None = None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.runs if self.runs else None

    @property
    def p99_ratio(self) -> float | None:
        if self.p99_candidate_us is None or not self.p99_serving_us:
            return None
        return self.p99_candidate_us / self.p99_serving_us

    def said(self) -> str:
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        conf = f" at {self.confidence:.0%}" if self.confidence is not None else ""
        return (f"{self.frames} frames compared in {self.elapsed_s:.0f} s, agreement {f(self.agreement, '.4f')} "
                f"(bounds {f(self.agreement_low, '.4f')}–{f(self.agreement_high, '.4f')}{conf}), paired run-time "
                f"ratio median {f(self.time_ratio, '.2f')} (bounds {f(self.time_ratio_low, '.2f')}–"
                f"{f(self.time_ratio_high, '.2f')}{conf}, {self.pairs} pairs), p99 run {f(self.p99_candidate_us, '.0f')}"
                f" µs against {f(self.p99_serving_us, '.0f')} µs, errors {self.errors} of {self.runs} runs")


@dataclasses.dataclass(frozen=True)
class RolloutView:
    """What reporters show of a model's rollout (telemetry/snapshot.py)."""
    policy: str
    serving: str
    candidate: str | None          # its version while one is under way
    canary: tuple
    figures: Figures | None
    gates: dict                    # {min_agreement, max_time_ratio, max_error_rate, confidence, min_frames, ...}
    decisions: dict                # {(serving, candidate, decision): count} since the start
    last: dict | None              # the last decision: {decision, serving, candidate, why, figures}


@dataclasses.dataclass(frozen=True)
class ModelView:
    name: str                     # its name under `models:`
    bundle: str                   # the configured bundle path
    ort_threads: int
    served: tuple | None          # (name, version, sha256) of the version being served, None before the start
    reloads: int
    failures: dict                # reload refusals by reason
    last_error: str | None
    fallback: dict | None         # serving its last known-good bundle: what was refused and why
    rollout: RolloutView | None = None  # its rollout policy, the candidate under way and the decisions taken
    provider: str = "cpu"         # the configured execution provider (models/providers.py's label)
    lane_providers: dict = dataclasses.field(default_factory=dict)  # lane → (provider it serves on, why not the configured)

    def provider_fallback(self) -> dict | None:
        return provider_fallback(self.provider, self.lane_providers)


def provider_fallback(configured: str, lane_providers: dict) -> dict | None:
    """The lanes where a model serves on the CPU provider instead of the configured one, and why (None: none)."""
    fallen = {lane: why for lane, (_serving, why) in lane_providers.items() if why}
    if not fallen:
        return None
    return {"configured": configured, "serving": "cpu", "lanes": sorted(fallen), "reason": next(iter(fallen.values()))}


@dataclasses.dataclass(frozen=True)
class RegistryView:
    reloads: int
    reload_failures: int
    last_reload_error: str | None
    state_write_failures: int
    last_state_error: str | None
    last_known_good_error: str | None


@dataclasses.dataclass(frozen=True)
class LoopView:
    age_s: float                  # since the control plane's loop last turned
    stalls: int
    stalled_s: float


@dataclasses.dataclass(frozen=True)
class FdCloserView:
    waiting: int                  # fds handed to the closer threads, not closed yet
    slow: int                     # closes that took over 1 s
    limit: int                    # fds a party may have waiting before its new connections are refused
    full_parties: int             # parties at that limit now
    threads: int                  # closer threads now


@dataclasses.dataclass(frozen=True)
class DriftFigure:
    """How far one stream's window (or, stream "*", all the windows of a (model, version)) has moved from the
    reference of its model's version (control/drift.py)."""
    model: str                    # its name under `models:`
    version: str                  # the version that made the window's results
    stream: str                   # a stream, or "*": every stream on that version, pooled
    frames: int                   # frames in the window
    psi: float | None             # the largest of the features' PSI; None while the window is under min_window_frames
    features: dict                # {feature: PSI}: classes, score (and boxes, for a detector)


@dataclasses.dataclass(frozen=True)
class DriftReferenceView:
    model: str
    version: str
    frames: int                   # frames in the reference (so far, while it is being taken)
    complete: bool
    source: str                   # bundle, state (recorded by this host earlier), served (taken now), building


@dataclasses.dataclass(frozen=True)
class DriftView:
    figures: tuple                # DriftFigure, ...
    references: tuple             # DriftReferenceView, ...
    records: dict                 # {stream: (records read, records overwritten before they could be read)}
    cpu_s: float = 0.0            # the drift chore's CPU time so far


@dataclasses.dataclass(frozen=True)
class Snapshot:
    now_ns: int                   # monotonic
    uptime_s: float
    streams: tuple[StreamView, ...]
    models: tuple[ModelView, ...]
    lanes: dict                   # Supervisor.status(): {lane: {state, pid, progress, busy_ns, ...}}
    registry: RegistryView
    refusals: dict                # {(stream, role, reason): count}
    loop: LoopView
    fds: FdCloserView | None      # None before the ingress exists
    restored: int                 # producers served on from systemd's fd store at start
    chore_errors: int             # control-plane housekeeping failures (logged; serving went on)
    metrics_address: str | None
    drift: DriftView | None = None  # None: drift is off (drift.enabled)
