"""Which ready stream a lane serves next, and which ready streams go with it: the loop's policy, pure.

The loop (loop.py) owns the effects: it reads each ready stream's cursor (lanes.h: the arrival stamp and the
fairness count, shared by every lane holding the stream) into the stream's record, asks this module for the
order, then claims in that order. What is decided here, over plain records and counters, touches no ring, no
session and no clock, and allocates nothing but what the loop allocated before (one sort key per ready stream):

- A stream's deadline is the daemon's own arrival time of its pending frame plus the stream's max_age (a
  producer's capture stamp is never consulted: back-dating frames buys no priority).
- Ready streams go in order of deadline, earliest first; equal deadlines keep their order (the wait set's).
- Except that a stream passed over (by any lane) as many times as there are other ready streams is owed a turn
  and goes first, the most passed over first: under overload every stream gets at least its share.
- A model with micro-batching (models.NAME.batch > 1) runs up to `batch` ready frames of one session (one
  model, one geometry) together; with other lanes of the model idle, a lane takes only its share of them.

The records are the loop's LaneStreams; anything with the named attributes will do (the unit tests' own).
"""
from __future__ import annotations

from edgeinfer.lanes import dispatch

__all__ = ["deadline", "rank", "idle_lanes", "batch_limit"]


def deadline(pending_since_ns: int, max_age_ns: int, now: int) -> int:
    """The deadline of a stream's pending frame: its arrival (now, if no lane stamped one yet) + max_age."""
    return (pending_since_ns or now) + max_age_ns


def rank(ready: list) -> None:
    """Sorts `ready` in place into the order a lane tries to claim them: owed a turn first (passed over at least
    as many times as there are other ready streams; the most passed over first), then earliest deadline; the
    sort is stable, so ties keep their order. Records: `.passed_over` and `.deadline`, read by the loop just
    before."""
    others = len(ready) - 1
    ready.sort(key=lambda s: (-s.passed_over if others and s.passed_over >= others else 0, s.deadline))


def idle_lanes(peer_counters) -> int:
    """1 (this lane) + the other lanes of a model that are idle: ready (dispatch.LANE_READY) and not running
    (no dispatch.LANE_RUN_STARTED). `peer_counters`: their counter words."""
    idle = 1
    for c in peer_counters:
        if c[dispatch.LANE_READY] and not c[dispatch.LANE_RUN_STARTED]:
            idle += 1
    return idle


def batch_limit(batch: int, same: int, idle: int) -> int:
    """How many frames one run takes: the model's `batch`, but with `idle` lanes (idle_lanes) free to serve the
    `same` ready frames of this session, only this lane's share of them, rounded up (work-conserving: a lane
    that claimed all 4 streams of 4 left its idle peer nothing for a whole run)."""
    if batch <= 1:
        return 1
    if idle > 1:
        return min(batch, -(-same // idle))
    return batch
