"""A lane that dies holding a frame: the control plane settles what it owed, exactly once (issue 35, item 20).

A lane's path for one frame, in the loop's order (lanes/loop.py): claim the stream's cursor → take (lanes.h
ei_lane_consumed: the journal, then the cursor) → count the frames skipped before it → run → publish journal and
result → count the outcome → unclaim. A real lane dies by SIGKILL at any point of it; here "the lane" is a real
FrameReader sharing a real DispatchTable's cursor, and it dies by simply stopping at each point in turn (the kill
itself is tests/integration/test_lanes.py::test_every_frame_has_one_outcome_across_repeated_lane_sigkills). After
the settlement and a second lane serving what is left, every published frame has exactly one outcome."""
from __future__ import annotations

import pytest

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import OUTCOMES
from edgeinfer.lanes.dispatch import DispatchTable
from edgeinfer.lanes.stream import Stream

DEAD, NEXT = 0, 1  # lane indices (lane ids 1 and 2)
STEPS = ("claimed", "taken", "skips counted", "result written", "outcome counted")


def _publish(w: ring.FrameWriter, n: int) -> None:
    for _ in range(n):
        w.begin()[:] = 1
        w.publish()


def _lane(w: ring.FrameWriter, table: DispatchTable, join: bool) -> ring.FrameReader:
    r = ring.FrameReader(w.fd, "test ring", join=join)
    r.native.share(table.memory, table.cursor_offset(0), 1, table.stats_offset(0), len(OUTCOMES))
    return r


def _serve(r: ring.FrameReader, lane: int, s: Stream, stop_after: str | None = None) -> None:
    """The loop's order for one frame (loop.py _take, _publish), stopping (dying) after `stop_after`."""
    st = s.stats
    assert r.native.claim(lane + 1)
    if stop_after == "claimed":
        return
    frame = r.take()
    assert frame is not None
    if stop_after == "taken":
        return
    st.overload += frame.skipped
    if stop_after == "skips counted":
        return
    frame.release()
    s.writer.resume()
    st.publishing_head = s.writer.head
    st.publishing = r.native.owed_total
    s.writer.write(frame_seq=frame.seq)
    if stop_after == "result written":
        return
    st.processed += 1
    if stop_after == "outcome counted":
        return
    r.native.unclaim()


@pytest.mark.parametrize("step", STEPS)
def test_a_lane_dead_at_any_step_leaves_every_frame_exactly_one_outcome(step):
    table = DispatchTable(1, 2)
    with ring.FrameWriter.create(16, 8, slots=4) as w, ring.ResultWriter.create(64, records=16) as results:
        s = Stream("cam", results, 1000, index=0, stats=table.stream_stats(0, "cam"))
        dead, nxt = _lane(w, table, False), _lane(w, table, True)
        try:
            _publish(w, 1)
            _serve(dead, DEAD, s)             # frame 1: served whole
            _publish(w, 3)                    # 2 and 3 skipped, 4 taken by the lane that dies
            _serve(dead, DEAD, s, step)
            head_before = results.head
            settled = table.settle_cursors_of(DEAD, [s])
            again = table.settle_cursors_of(DEAD, [s])  # idempotent: nothing owed any more
            table.free_cursors_of(DEAD)
            assert again == []
            if step == "claimed":              # nothing consumed: the next lane takes frame 4 itself
                assert settled == []
            elif step == "outcome counted":    # counted already: nothing to settle
                assert settled == []
            else:
                (one,) = settled
                assert one.seq == 4
                assert one.outcome == ("processed" if step == "result written" else "error")
                assert one.skipped == (2 if step == "taken" else 0)
            assert results.head == head_before  # the settlement writes no result
            _publish(w, 1)                      # frame 5 (and 4 if nobody consumed it)
            _serve(nxt, NEXT, s)
            assert s.stats.offered == 5, {o: getattr(s.stats, o) for o in OUTCOMES}
            assert nxt.native.last_seq == 5
        finally:
            dead.close()
            nxt.close()


def test_a_dead_lane_that_held_no_claim_is_owed_nothing():
    table = DispatchTable(1, 2)
    with ring.FrameWriter.create(16, 8, slots=4) as w, ring.ResultWriter.create(64, records=16) as results:
        s = Stream("cam", results, 1000, index=0, stats=table.stream_stats(0, "cam"))
        with _lane(w, table, False) as other:
            _publish(w, 2)
            _serve(other, NEXT, s, "taken")  # another lane holds a frame it has not counted yet: not ours
            assert table.settle_cursors_of(DEAD, [s]) == []
            assert s.stats.offered == 0
