"""Per-stream counters and recent latencies, written by the lane serving the
stream (one at a time: the dispatch cursor's claim) and read, without locks
and approximately, by the control plane for status and metrics.

Preallocated in one block of the dispatch table (dispatch.py), a shared
mapping the control plane and its lanes inherit: recording a frame stores
integers into fixed numpy arrays and bumps counters; nothing grows. Without a
block (tests, tools) the same layout lives in private memory.
"""
from __future__ import annotations

import numpy as np
import numpy.ma  # noqa: F401  np.percentile imports it lazily: at the fd limit that import would fail

from edgeinfer.abi.hist import HIST_BYTES, StageHistograms
from edgeinfer.abi.vocabulary import OUTCOMES

WINDOW = 4096  # recent frames kept for quantiles
# Counter slots: the outcomes, then frames recorded in the windows, the last frame id, the lane that served last,
# and the publish journal: the cursor's journal total (lanes.h j_total) of the frame whose result is being written,
# and the result ring's head before that write (written in that order, head first): a lane that dies between the
# write and its count leaves a result that the control plane's settlement counts as processed (dispatch.py).
_COUNTERS = OUTCOMES + ("count", "last_frame_id", "last_lane", "publishing", "publishing_head")
_NCOUNTERS = 16
_WINDOWS = ("e2e_ns", "infer_ns", "age_ns", "done_ns")
STATS_BYTES = _NCOUNTERS * 8 + len(_WINDOWS) * WINDOW * 8 + HIST_BYTES  # one stream's block


_MAX = (1 << 63) - 1


def _counter(i: int):
    def get(self) -> int:
        return self._w[i]

    def set_(self, v: int) -> None:
        self._w[i] = v if v <= _MAX else _MAX  # saturates: a camera's forged skips must not overflow it
    return property(get, set_)


def _frame_id():
    def get(self) -> int:
        return self._u[8]

    def set_(self, v: int) -> None:
        self._u[8] = v & 0xFFFFFFFFFFFFFFFF  # the producer's own 64-bit number
    return property(get, set_)


def words(a: np.ndarray, fmt: str = "q") -> memoryview:
    """A memoryview of int64 (or "Q": uint64) words over a numpy array's memory. The loop writes its counters
    through these: a memoryview's item is a plain int, where numpy's scalar machinery costs the loop several
    µs a frame, most of it cold in the caches after each inference (issue 28)."""
    return memoryview(a).cast("B").cast(fmt)


class StreamStats:
    """A stream's counters (one per outcome: edgeinfer.abi.vocabulary.OUTCOMES says what each means) and its
    recent latencies, in a block of shared memory the serving lane writes and the control plane reads."""

    def __init__(self, name: str, buffer=None, offset: int = 0):
        self.name = name
        if buffer is None:
            buffer, offset = bytearray(STATS_BYTES), 0
        mem = np.frombuffer(buffer, np.uint8, STATS_BYTES, offset)
        self._c = mem[: _NCOUNTERS * 8].view(np.int64)  # read as numpy (sums); written through _w, _u
        self._w, self._u = words(self._c), words(self._c, "Q")
        at = _NCOUNTERS * 8
        for w in _WINDOWS:  # e2e: capture → published; infer: session.run; age: capture → start; done: when
            setattr(self, w, mem[at: at + WINDOW * 8].view(np.int64))
            at += WINDOW * 8
        self._windows = tuple(words(getattr(self, w)) for w in _WINDOWS)  # the loop's writes
        self.stages = StageHistograms(buffer, offset + at)  # native per-stage histograms, exported on scrape

    def record(self, e2e: int, infer: int, age: int, done: int) -> None:
        c = self._w
        i = c[7] % WINDOW  # count
        w_e2e, w_infer, w_age, w_done = self._windows
        w_e2e[i] = e2e
        w_infer[i] = infer
        w_age[i] = age
        w_done[i] = done
        c[7] += 1

    def outcomes_total(self) -> int:
        """The outcome counters' exact sum (Python ints: no int64 wrap), against a cursor's journal total."""
        return sum(self._w[: len(OUTCOMES)])

    @property
    def offered(self) -> int:
        return int(self._c[: len(OUTCOMES)].sum())

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
        """Counters and recent quantiles (control plane; tolerates a concurrent write)."""
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
        out["last_lane"] = self.last_lane
        return out


for _i, _name in enumerate(_COUNTERS):
    setattr(StreamStats, _name, _frame_id() if _name == "last_frame_id" else _counter(_i))
