"""The lanes' pick and grouping policy (lanes/pick.py) over plain records: ties, deadlines, starvation, batching.

Pure functions, so no ring, no session, no root: each test runs in microseconds. The integration tests
(tests/integration/test_lanes.py: overload, micro-batching) check the same policy on real lanes and rings."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinfer.lanes import dispatch, pick


@dataclass
class Rec:
    """A ready stream as the policy sees it (the loop's LaneStream has the same attributes)."""
    name: str
    deadline: int = 0
    passed_over: int = 0
    session: object = None


def names(ready):
    return [r.name for r in ready]


def test_the_deadline_is_the_daemons_arrival_stamp_plus_max_age():
    assert pick.deadline(1_000, 50, now=5_000) == 1_050
    assert pick.deadline(0, 50, now=5_000) == 5_050  # no stamp yet: it arrived now


def test_the_earliest_deadline_goes_first():
    ready = [Rec("a", 300), Rec("b", 100), Rec("c", 200)]
    pick.rank(ready)
    assert names(ready) == ["b", "c", "a"]


def test_ties_keep_the_wait_sets_order():
    ready = [Rec("a", 100), Rec("b", 100), Rec("c", 50), Rec("d", 100)]
    pick.rank(ready)
    assert names(ready) == ["c", "a", "b", "d"]


def test_a_stream_passed_over_as_often_as_there_are_others_goes_first():
    # Three ready: owed a turn after 2 pass-overs, whatever its deadline.
    ready = [Rec("early", 100), Rec("mid", 200), Rec("late", 900, passed_over=2)]
    pick.rank(ready)
    assert names(ready)[0] == "late"


def test_one_pass_over_short_of_its_turn_waits_for_its_deadline():
    ready = [Rec("early", 100), Rec("mid", 200), Rec("late", 900, passed_over=1)]
    pick.rank(ready)
    assert names(ready) == ["early", "mid", "late"]


def test_among_streams_owed_a_turn_the_most_passed_over_goes_first():
    ready = [Rec("a", 100, passed_over=1), Rec("b", 300, passed_over=3), Rec("c", 200, passed_over=5)]
    pick.rank(ready)
    assert names(ready) == ["c", "b", "a"]


def test_a_lone_ready_stream_is_never_owed_anything():
    ready = [Rec("a", 100, passed_over=7)]
    pick.rank(ready)
    assert names(ready) == ["a"]


def test_under_overload_every_stream_is_served_within_its_share():
    """Four streams always ready, one of them with the earliest deadline every time: each is served at least once
    in every run of 4 picks after the first (the cursor's count as lanes.h keeps it: the pick resets it, every
    other ready stream's goes up)."""
    recs = [Rec("greedy"), Rec("b"), Rec("c"), Rec("d")]
    served = []
    for turn in range(40):
        for i, r in enumerate(recs):
            r.deadline = 1_000 + turn * 10 + (0 if r.name == "greedy" else 5 + i)
        ready = list(recs)
        pick.rank(ready)
        chosen = ready[0]
        chosen.passed_over = 0
        for other in ready[1:]:
            other.passed_over += 1
        served.append(chosen.name)
    for start in range(4, len(served) - 4):
        assert set(served[start:start + 4]) == {"greedy", "b", "c", "d"}, served
    assert served[0] == "greedy"  # its deadline wins while nobody is owed a turn


def test_without_batching_a_run_takes_one_frame():
    assert pick.batch_limit(1, same=4, idle=3) == 1
    assert pick.batch_limit(0, same=4, idle=1) == 1


def test_with_no_idle_peer_a_run_takes_the_whole_batch():
    assert pick.batch_limit(4, same=0, idle=1) == 4


def test_with_idle_peers_a_lane_takes_its_share_rounded_up():
    assert pick.batch_limit(4, same=4, idle=2) == 2
    assert pick.batch_limit(4, same=5, idle=2) == 3
    assert pick.batch_limit(2, same=8, idle=2) == 2  # never more than the batch
    assert pick.batch_limit(4, same=1, idle=3) == 1


def test_idle_lanes_counts_peers_ready_and_not_running():
    peers = [np.zeros(dispatch.LANE_WORDS, np.int64) for _ in range(4)]
    peers[0][dispatch.LANE_READY] = 1                                      # idle
    peers[1][dispatch.LANE_READY] = 1
    peers[1][dispatch.LANE_RUN_STARTED] = 123                              # running
    # peers[2]: not ready (starting, or down)
    peers[3][dispatch.LANE_READY] = 1                                      # idle
    assert pick.idle_lanes(peers) == 3
    assert pick.idle_lanes(()) == 1
