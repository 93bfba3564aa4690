"""The dispatch table: the memory the control plane and its lanes share.

One anonymous shared mapping, made before the lanes' zygote is forked, so
every lane inherits it at the same place (no name, no fd: nothing outside the
daemon can reach it). It holds, per stream, the dispatch cursor (native
lanes.h: which lane serves it now, what was consumed, the arrival stamp, the
fairness count), a flag word the control plane writes, and the stream's
statistics block (stats.py); per lane, its doorbell and its counters.

Writers: a stream's block by the lane holding its cursor; a lane's counters by
that lane; the flags by the control plane. Readers read without locks.
"""
from __future__ import annotations

import mmap
from typing import NamedTuple

import numpy as np

from edgeinfer.lanes.stats import STATS_BYTES, StreamStats

LINE = 64
CURSOR_BYTES = LINE          # ei_stream_cursor (lanes.h), one cache line
STREAM_FLAGS_BYTES = LINE    # int64 words the control plane writes for the lanes
STREAM_BYTES = -(-(CURSOR_BYTES + STREAM_FLAGS_BYTES + STATS_BYTES) // LINE) * LINE
LANE_BYTES = 3 * LINE        # doorbell line + two lines of counters

# Stream flag words.
FLAG_WAKE = 0      # readers connected: FUTEX_WAKE on every record

# Lane counter words (int64).
LANE_PROGRESS = 0  # loop iterations: the evidence of life, idle or not
LANE_BUSY_NS = 1   # time spent serving frames
LANE_FRAMES = 2    # frames served (results published)
LANE_RUN_STARTED = 3  # monotonic ns when the current run began, 0 outside runs
LANE_REALTIME = 4  # 1 when the loop runs with a real-time policy
LANE_TID = 5       # the loop thread's kernel id
LANE_READY = 6     # 1 once the lane loaded its models and runs its loop
LANE_CANCELLED = 7  # runs cancelled at run_deadline_ms (second line: the control thread's)
LANE_SESSIONS = 8   # ONNX Runtime sessions held, all models
LANE_EVICTIONS = 9  # sessions dropped to stay within runtime.max_sessions
LANE_BATCHES = 10   # runs of more than one frame (micro-batching)
LANE_COPIES = 11    # frames copied into a batch tensor or for a rollout's trial (the only copies the daemon makes)
LANE_DOORBELL_MUTES = 12  # times a camera's doorbell was muted: rung without frames (ring.h ei_wake_guard)
LANE_WAKEUPS = 13  # waits that ended with a ring ready: a frame nobody took yet (never a flag change alone)
LANE_GC_NS = 14    # time the lane's process spent in Python's cyclic collector (the loop waits meanwhile)
LANE_GC_LONGEST_NS = 15  # the longest single collection since the lane started (gcwatch.py)
LANE_WORDS = 2 * LINE // 8  # the counter words a lane has


class DispatchTable:
    def __init__(self, n_streams: int, n_lanes: int):
        self.n_streams, self.n_lanes = n_streams, n_lanes
        self._lanes_at = n_streams * STREAM_BYTES
        size = self._lanes_at + n_lanes * LANE_BYTES
        # MAP_SHARED | MAP_ANONYMOUS: shared with forked children only, zero-filled.
        self.memory = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self._words = np.frombuffer(self.memory, np.int64)

    def cursor_offset(self, stream: int) -> int:
        return stream * STREAM_BYTES

    def stream_flags(self, stream: int) -> np.ndarray:
        at = (stream * STREAM_BYTES + CURSOR_BYTES) // 8
        return self._words[at: at + STREAM_FLAGS_BYTES // 8]

    def stream_stats(self, stream: int, name: str) -> StreamStats:
        return StreamStats(name, self.memory, stream * STREAM_BYTES + CURSOR_BYTES + STREAM_FLAGS_BYTES)

    def doorbell_offset(self, lane: int) -> int:
        return self._lanes_at + lane * LANE_BYTES

    def lane_counters(self, lane: int) -> np.ndarray:
        at = (self._lanes_at + lane * LANE_BYTES + LINE) // 8
        return self._words[at: at + LANE_WORDS]

    def stats_offset(self, stream: int) -> int:
        """Where the stream's statistics block starts (its outcome counters first: stats.py)."""
        return stream * STREAM_BYTES + CURSOR_BYTES + STREAM_FLAGS_BYTES

    def free_cursors_of(self, lane: int) -> None:
        """Frees every stream cursor lane `lane` holds (the owner word, first of a cursor: lane id + 1).
        Only for a lane known dead: no other lane writes an owner word that is not 0."""
        for stream in range(self.n_streams):
            owner = np.frombuffer(self.memory, np.uint32, 1, stream * STREAM_BYTES)
            if owner[0] == lane + 1:
                owner[0] = 0

    def settle_cursors_of(self, lane: int, streams) -> list[Settled]:
        """For a lane known dead, before free_cursors_of: counts the outcomes it owed for the frames it held.

        A lane that consumed a frame (lanes.h ei_lane_consumed: the journal, then the cursor) and died before
        counting its outcome left a journal naming what the cursor says was consumed, with a total the stream's
        outcome counters have not reached. What is missing is counted here: the frame itself as `processed` if
        its result is in the result ring (the publish journal, stats.py: the ring's head moved past the one noted
        for this very consumption), else `error`; the frames skipped before it, if the lane died before counting
        them too, as `overload`. Idempotent: once counted, the counters reach the journal's total and a second
        call (or a lane that had counted it already) finds nothing owed. A lane that died before the cursor's
        store left the frame to the next lane (its journal does not match the cursor): nothing owed here.
        `streams`: every Stream (stream.py), by index. Returns what was counted."""
        settled = []
        for stream in range(self.n_streams):
            at = stream * STREAM_BYTES
            if np.frombuffer(self.memory, np.uint32, 1, at)[0] != lane + 1:
                continue
            cur = np.frombuffer(self.memory, np.uint64, CURSOR_BYTES // 8, at)
            seen_latest, j_latest, j_last_seq = int(cur[2]), int(cur[5]), int(cur[6])
            owed = int(np.frombuffer(self.memory, np.int64, 1, at + 56)[0])
            if j_latest == 0 or j_latest != seen_latest:
                continue
            st = streams[stream].stats
            missing = owed - st.outcomes_total()
            if missing <= 0:
                continue
            cur[3] = j_last_seq  # the cursor's own store of last_seq may not have happened: complete it
            writer = streams[stream].writer
            writer.resume()
            outcome = "processed" if st.publishing == owed and writer.head > st.publishing_head else "error"
            setattr(st, outcome, getattr(st, outcome) + 1)
            st.overload += missing - 1
            settled.append(Settled(streams[stream].name, j_last_seq, outcome, missing - 1))
        return settled


class Settled(NamedTuple):
    """What settle_cursors_of counted for a stream a dead lane held."""
    stream: str
    seq: int        # the frame the lane held
    outcome: str    # counted for it: processed (its result was written) or error
    skipped: int    # frames skipped before it, counted overload here (the lane died before counting them)
