"""What Python's cyclic garbage collector costs a lane, in its counters.

A collection holds the GIL from start to end, whichever of the lane's threads
runs it: the loop waits the whole time. Unfrozen, a lane's first full
collection walked every object the modules made (onnxruntime's and numpy's
included, ~45,000) and took 68 ms on the 2-vCPU VM of docs/performance.md,
one frame's worth of latency at 15 fps. The zygote freezes its heap before it
forks a lane (zygote.py), so a lane's collections walk only what the lane made
itself (0.4 ms measured); this watch makes the cost visible to an operator
(edgeinfer_lane_gc_seconds_total, edgeinfer_lane_gc_longest_seconds).

The callback runs on whichever thread collects, the loop included: two clock
reads and two counter words, no allocation of its own beyond the clock's int.
"""
from __future__ import annotations

import gc
import time

from edgeinfer.lanes import dispatch
from edgeinfer.lanes.stats import words


def watch(counters) -> None:
    """Adds every collection's duration to counters[LANE_GC_NS] and keeps the longest in
    counters[LANE_GC_LONGEST_NS] (the lane's counters in the dispatch table), as int64 words (stats.words: no
    numpy scalar on the loop's thread when it collects)."""
    counters = words(counters)
    started = [0]
    clock = time.monotonic_ns

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            started[0] = clock()
            return
        took = clock() - started[0]
        counters[dispatch.LANE_GC_NS] += took
        if took > counters[dispatch.LANE_GC_LONGEST_NS]:
            counters[dispatch.LANE_GC_LONGEST_NS] = took

    gc.callbacks.append(on_gc)


def frozen() -> int:
    """Objects in the collector's permanent generation: never walked by this process's collections."""
    return gc.get_freeze_count()
