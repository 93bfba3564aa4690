"""A lane as the control plane holds it: its process, socket and state, its restarts, its progress as last seen,
and what the status says of it (supervisor.py drives it)."""
from __future__ import annotations

import collections
import socket
import time

from edgeinfer.lanes import dispatch


class LaneHandle:
    def __init__(self, index: int, plan):
        self.index = index
        self.plan = plan                  # LaneConfig: cpus, models
        self.pid = 0
        self.pidfd: int | None = None
        self.sock: socket.socket | None = None
        self.state = "starting"           # starting, ready, down
        self.restarts = 0                 # in total
        self.recent: collections.deque = collections.deque()  # monotonic times of recent restarts
        self.last_progress = -1
        self.progress_at = time.monotonic()
        self.seen = (-1, self.progress_at)  # /healthz's own (progress, when first seen): never the control plane's
        self.last_error: str | None = None
        self.gc_frozen = 0                # objects its collector never walks (frozen by the zygote), as it said
        # model → (the provider its sessions run on, why that is the CPU one and not the configured one): as its
        # Staged reply said, for the version staged, then (on commit or promotion) for the one it serves
        self.staged_providers: dict[str, tuple[str, str | None]] = {}
        self.providers: dict[str, tuple[str, str | None]] = {}
        self.extra_providers: set[str] = set()  # providers it loads beyond its models' configured ones (rollouts)

    @property
    def name(self) -> str:
        return f"lane{self.index}"

    def is_stuck(self, counters, now: float, deadline_s: float) -> bool:
        """Down, or its loop made no progress within deadline_s. Any thread: the progress counter is read from
        shared memory now, not from what the control plane last saw (a stalled control plane must not make serving
        lanes look stuck). `seen` is one tuple, replaced whole: a caller that loses a race to another leaves an
        older (value, time) pair, which only makes the next call see a change sooner."""
        progress = int(counters[dispatch.LANE_PROGRESS])
        value, since = self.seen
        if progress != value:
            self.seen, since = (progress, now), now
        return self.state != "ready" or now - since > deadline_s

    def watchdog_ok(self, since: float, restarts_allowed: int) -> bool:
        """It made progress after `since` (an idle loop still counts), or is being restarted within its budget. A
        hung lane is not: the watchdog pauses until the control plane has killed and restarted it
        (runtime.lane_hang_s, below the unit's WatchdogSec), so systemd acts only when that recovery fails."""
        return self.progress_at > since if self.state == "ready" else len(self.recent) < restarts_allowed

    def status(self, c) -> dict:
        """What the status dict and /metrics say of this lane; `c`: its counters in the dispatch table."""
        return {"state": self.state, "pid": self.pid, "cpus": list(self.plan.cpus), "models": list(self.plan.models),
                "restarts": self.restarts, "progress": int(c[dispatch.LANE_PROGRESS]),
                "busy_ns": int(c[dispatch.LANE_BUSY_NS]), "frames": int(c[dispatch.LANE_FRAMES]),
                "realtime": bool(c[dispatch.LANE_REALTIME]), "tid": int(c[dispatch.LANE_TID]),
                "runs_cancelled": int(c[dispatch.LANE_CANCELLED]), "sessions": int(c[dispatch.LANE_SESSIONS]),
                "session_evictions": int(c[dispatch.LANE_EVICTIONS]), "batches": int(c[dispatch.LANE_BATCHES]),
                "batch_copies": int(c[dispatch.LANE_COPIES]), "doorbell_mutes": int(c[dispatch.LANE_DOORBELL_MUTES]),
                "wakeups": int(c[dispatch.LANE_WAKEUPS]), "gc_ns": int(c[dispatch.LANE_GC_NS]),
                "gc_longest_ns": int(c[dispatch.LANE_GC_LONGEST_NS]), "gc_frozen": self.gc_frozen,
                "last_error": self.last_error}
