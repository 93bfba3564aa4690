"""Per-stream counters and recent latencies, written by the RT loop only and
read (without locks, approximately) by the main thread for status output.

Preallocated: recording a frame stores integers into fixed numpy arrays and
bumps counters; nothing grows. (The native histograms of the observability
issue replace the latency rings.)
"""
from __future__ import annotations

import numpy as np
import numpy.ma  # noqa: F401  np.percentile imports it lazily: at the fd limit that import would fail

from edgeinfer._hist import StageHistograms

OUTCOMES = ("processed", "stale", "overload", "torn", "short", "error", "bad_timestamp")
WINDOW = 4096  # recent frames kept for quantiles


class StreamStats:
    def __init__(self, name: str):
        self.name = name
        self.processed = 0
        self.stale = 0      # acquired, but older than max_age_ms: dropped
        self.overload = 0   # published, never acquired: newer frames won while we were busy or shedding
        self.torn = 0       # refused by the ring's checks: `latest` naming no published frame, bad slot or length
        self.short = 0      # payload_len shorter than the frame: the producer says it did not write it all
        self.error = 0      # inference or decoding failed
        self.bad_timestamp = 0  # capture time zero or later than the moment it was served: cannot be scheduled
        self.e2e_ns = np.zeros(WINDOW, np.int64)     # capture → result published
        self.infer_ns = np.zeros(WINDOW, np.int64)   # session.run
        self.age_ns = np.zeros(WINDOW, np.int64)     # capture → inference start
        self.done_ns = np.zeros(WINDOW, np.int64)    # when each was published (for fps)
        self.count = 0  # frames recorded in the windows (monotonic; index = count % WINDOW)
        self.stages = StageHistograms()  # native per-stage histograms, exported on scrape
        self.last_frame_id = 0  # producer frame id of the last result published

    def record(self, e2e: int, infer: int, age: int, done: int) -> None:
        i = self.count % WINDOW
        self.e2e_ns[i] = e2e
        self.infer_ns[i] = infer
        self.age_ns[i] = age
        self.done_ns[i] = done
        self.count += 1

    @property
    def offered(self) -> int:
        return sum(getattr(self, o) for o in OUTCOMES)

    def rolling_quantiles_ms(self) -> dict:
        """Exact p50/p95/p99 of the recent e2e window (ms)."""
        n = min(self.count, WINDOW)
        if not n:
            return {}
        e2e = self.e2e_ns[:n] / 1e6
        return {q: float(np.percentile(e2e, p)) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}

    def rolling_window(self) -> tuple[dict, int, float]:
        """({"0.5": s, "0.95": s, "0.99": s}, frames in the window, their e2e sum in s)."""
        n = min(self.count, WINDOW)
        if not n:
            return {}, 0, 0.0
        e2e = self.e2e_ns[:n] / 1e9
        return ({q: float(np.quantile(e2e, float(q))) for q in ("0.5", "0.95", "0.99")}, n, float(e2e.sum()))

    def snapshot(self, now_ns: int, window_s: float = 5.0) -> dict:
        """Counters and recent quantiles (main thread; tolerates a concurrent write)."""
        n = min(self.count, WINDOW)
        out = {o: getattr(self, o) for o in OUTCOMES}
        out["offered"] = self.offered
        if n:
            done = self.done_ns[:n]
            recent = done >= now_ns - int(window_s * 1e9)
            out["fps"] = float(recent.sum()) / window_s
            out["e2e_ms"] = self.rolling_quantiles_ms()
            out["infer_ms_p50"] = float(np.percentile(self.infer_ns[:n] / 1e6, 50))
        else:
            out["fps"] = 0.0
            out["e2e_ms"] = {}
        out["last_frame_id"] = self.last_frame_id
        return out
