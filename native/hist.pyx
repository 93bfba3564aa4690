# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, auto_pickle=False
"""edgeinfer._hist: preallocated log-linear latency histograms (HDR-style).

Values are nanoseconds. Bucket b covers [lo(b), lo(b+1)): 32 linear
sub-buckets per power of two from 2^10 ns (~1 µs) to 2^34 ns (~17 s), plus one
underflow and one overflow bucket. A bucket's width is at most 1/32 of its
lower bound, so a quantile read at a bucket's midpoint is within 1.6 % of the
exact value over 1 µs - 10 s.

The RT loop is the only writer (plain 64-bit stores, no lock, no allocation:
record() is a few integer operations); readers (the exporter on scrape) copy
the counters and tolerate a count being one frame behind another.
"""
from libc.stdint cimport uint8_t, uint64_t, int64_t
from libc.string cimport memcpy, memset

import numpy as np

cdef enum:
    SUB_BITS = 5                       # 32 linear sub-buckets per power of two
    SUB = 32
    EXP_MIN = 10                       # 2^10 ns = 1.024 µs: below is the underflow bucket
    EXP_MAX = 34                       # 2^34 ns = 17.2 s: at and above is the overflow bucket
    NBUCKETS = (34 - 10) * 32 + 2      # (EXP_MAX - EXP_MIN) * SUB + underflow + overflow
    NSTAGES = 7                        # len(STAGES)

# wait: the loop asleep before the frame; age: capture → the frame's start; pick: the loop's wake → the frame's
# start (the daemon's own part of age: picking, claiming and taking the frame; the rest is the kernel's wake);
# inference; decode; publish; e2e: capture → record published.
STAGES = ("wait", "age", "pick", "inference", "decode", "publish", "e2e")
N_BUCKETS = NBUCKETS


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil


cdef inline int bucket_of(uint64_t v) nogil:
    """Index of the bucket holding v (ns)."""
    cdef int e
    if v < (<uint64_t>1 << EXP_MIN):
        return 0
    e = 63 - __builtin_clzll(v)
    if e >= EXP_MAX:
        return NBUCKETS - 1
    return 1 + (e - EXP_MIN) * SUB + <int>((v >> (e - SUB_BITS)) & (SUB - 1))


def bucket_bounds():
    """(lower, upper) ns of every bucket, as two float64 arrays (underflow: [0, 2^10))."""
    lo = np.zeros(NBUCKETS, np.float64)
    hi = np.zeros(NBUCKETS, np.float64)
    hi[0] = float(<uint64_t>1 << EXP_MIN)
    cdef int e, s, b
    for e in range(EXP_MIN, EXP_MAX):
        for s in range(SUB):
            b = 1 + (e - EXP_MIN) * SUB + s
            lo[b] = float((<uint64_t>1 << e) + s * (<uint64_t>1 << (e - SUB_BITS)))
            hi[b] = lo[b] + float(<uint64_t>1 << (e - SUB_BITS))
    lo[NBUCKETS - 1] = float(<uint64_t>1 << EXP_MAX)
    hi[NBUCKETS - 1] = float("inf")
    return lo, hi


HIST_BYTES = (NSTAGES * NBUCKETS + 2 * NSTAGES) * 8  # one StageHistograms block, in bytes


cdef class StageHistograms:
    """One histogram per pipeline stage of one stream (STAGES), in one block:
    its own memory, or HIST_BYTES of a shared buffer (the lanes' dispatch
    table: whichever lane serves the stream records, the control plane reads)."""
    cdef uint64_t *counts  # borrowed: [NSTAGES][NBUCKETS] frames recorded per stage and bucket
    cdef uint64_t *sums    # borrowed: [NSTAGES] sum of recorded ns (for _sum)
    cdef uint64_t *totals  # borrowed: [NSTAGES] frames recorded (for _count)
    cdef object memory     # owns the block `counts` starts (a bytearray, or the shared buffer)

    def __cinit__(self, buffer=None, Py_ssize_t offset=0):
        cdef uint8_t[::1] view
        if buffer is None:
            buffer, offset = bytearray(HIST_BYTES), 0  # zeroed
        view = buffer
        if offset < 0 or offset + HIST_BYTES > view.shape[0] or offset % 8:
            raise ValueError(f"histogram block at {offset} outside the buffer or misaligned")
        self.memory = buffer
        self.counts = <uint64_t *>&view[offset]
        self.sums = self.counts + NSTAGES * NBUCKETS
        self.totals = self.sums + NSTAGES

    cdef inline void _add(self, int stage, int64_t ns) nogil:
        cdef uint64_t v = <uint64_t>ns if ns > 0 else 0
        self.counts[stage * NBUCKETS + bucket_of(v)] += 1
        self.sums[stage] += v
        self.totals[stage] += 1

    def record_frame(self, int64_t wait, int64_t age, int64_t pick, int64_t inference, int64_t decode,
                     int64_t publish, int64_t e2e):
        """Records one frame's stage durations (ns) in one call."""
        self._add(0, wait)
        self._add(1, age)
        self._add(2, pick)
        self._add(3, inference)
        self._add(4, decode)
        self._add(5, publish)
        self._add(6, e2e)

    def record(self, int stage, int64_t ns):
        if not 0 <= stage < NSTAGES:
            raise IndexError(stage)
        self._add(stage, ns)

    def snapshot(self, int stage):
        """(counts copy as uint64 array, sum ns, total) of one stage."""
        if not 0 <= stage < NSTAGES:
            raise IndexError(stage)
        out = np.empty(NBUCKETS, np.uint64)
        cdef uint64_t[::1] view = out
        memcpy(&view[0], &self.counts[stage * NBUCKETS], NBUCKETS * sizeof(uint64_t))
        return out, self.sums[stage], self.totals[stage]


def quantile(counts, double q):
    """The q-quantile (ns) of a counts array, read at its bucket's midpoint; nan if empty."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    if total == 0:
        return float("nan")
    lo, hi = bucket_bounds()
    rank = q * total
    idx = int(np.searchsorted(np.cumsum(counts), rank, side="left"))
    idx = min(idx, NBUCKETS - 1)
    if idx == NBUCKETS - 1:
        return lo[idx]
    return (lo[idx] + hi[idx]) / 2.0


def cumulative_at(counts, bounds_seconds):
    """Cumulative counts at each upper bound (seconds), Prometheus-style: a native
    bucket counts toward a bound when its upper edge is at or below it."""
    counts = np.asarray(counts, np.uint64)
    _, hi = bucket_bounds()
    cum = np.cumsum(counts)
    out = []
    for b in bounds_seconds:
        ns = b * 1e9
        k = int(np.searchsorted(hi, ns, side="right"))  # buckets 0..k-1 end at or below the bound
        out.append(int(cum[k - 1]) if k > 0 else 0)
    return out
