"""The gateway's line for a model's rings (fronts/pool.py SizePool): first come first served, a slot handed to
the first waiter the moment it is freed, at most max_waiting waiting, shed beyond, a waiter's deadline honoured.
The slots are stand-ins: the line never touches them."""
from __future__ import annotations

import threading
import time

import pytest

from edgeinfer.fronts.pool import FrontError, SizePool


class _Slot:
    """A stand-in ring: connected or not (the line prefers a connected one)."""

    def __init__(self, connected: bool = True):
        self.connected = connected


def _deadline(s: float) -> int:
    return time.monotonic_ns() + int(s * 1e9)


def _wait_until(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_first_come_first_served_and_a_freed_slot_is_handed_over_at_once():
    a, b = _Slot(), _Slot()
    pool = SizePool([a, b], max_waiting=2)
    held = [pool.acquire(_deadline(1)), pool.acquire(_deadline(1))]
    assert set(map(id, held)) == {id(a), id(b)} and pool.in_flight == 2
    order = []

    def wait(name):
        slot = pool.acquire(_deadline(5))
        order.append((name, slot))
    first = threading.Thread(target=wait, args=("first",))
    first.start()
    _wait_until(lambda: pool.waiting == 1)
    second = threading.Thread(target=wait, args=("second",))
    second.start()
    _wait_until(lambda: pool.waiting == 2)
    pool.release(held[0])
    # Handed over: the first waiter left the line at release, so a newcomer now is third in line, not shed.
    assert pool.waiting == 1
    third = threading.Thread(target=wait, args=("third",))
    third.start()
    _wait_until(lambda: pool.waiting == 2)
    first.join(5)
    assert order[0] == ("first", held[0])
    pool.release(held[1])
    second.join(5)
    assert order[1] == ("second", held[1])
    pool.release(order[0][1])
    third.join(5)
    assert [n for n, _ in order] == ["first", "second", "third"] and pool.waiting == 0


def test_a_full_line_sheds_and_a_waiter_past_its_deadline_leaves_it():
    pool = SizePool([_Slot()], max_waiting=1)
    slot = pool.acquire(_deadline(1))
    errors = []

    def wait():
        try:
            pool.acquire(_deadline(0.3))
        except FrontError as e:
            errors.append(e)
    t = threading.Thread(target=wait)
    t.start()
    _wait_until(lambda: pool.waiting == 1)
    with pytest.raises(FrontError) as shed:
        pool.acquire(_deadline(1))
    assert shed.value.code == "RESOURCE_EXHAUSTED" and shed.value.reason == "shed"
    t.join(5)
    assert errors and errors[0].code == "DEADLINE_EXCEEDED" and errors[0].reason == "deadline_waiting"
    assert pool.waiting == 0
    pool.release(slot)
    assert pool.acquire(_deadline(1)) is slot  # back in the free list: nobody waited


def test_no_waiting_room_sheds_at_once():
    pool = SizePool([_Slot()], max_waiting=0)
    pool.acquire(_deadline(1))
    with pytest.raises(FrontError) as e:
        pool.acquire(_deadline(5))
    assert e.value.code == "RESOURCE_EXHAUSTED" and pool.waiting == 0


def test_a_connected_ring_is_taken_before_one_still_connecting():
    connecting, connected = _Slot(False), _Slot(True)
    pool = SizePool([connecting, connected], max_waiting=0)
    assert pool.acquire(_deadline(1)) is connected and not pool.connected
    assert pool.acquire(_deadline(1)) is connecting  # the only one left: its request says UNAVAILABLE itself


def test_a_request_whose_deadline_is_shorter_than_its_expected_wait_is_refused_not_queued():
    """Issue 35 item 11: admitted, such a request would hold a place in line, then a ring, for an answer nobody
    reads. L ahead on R rings held hold_ns each: (L/R + 1) x hold_ns expected; shorter: RESOURCE_EXHAUSTED at once
    (deadline_short, with the retry hint), never queued. A request with a ring free is never refused so."""
    a, b = _Slot(), _Slot()
    pool = SizePool([a, b], max_waiting=4)
    assert pool.wait_ns() == 0
    assert pool.acquire(_deadline(0.001)) is not None  # a free ring: taken, however short its deadline
    second = pool.acquire(_deadline(1))
    pool.hold_ns = 1_000_000_000  # the pace the pool measured: each request holds a ring about 1 s
    assert pool.wait_ns() == 1_000_000_000  # nobody ahead: the soonest ring, then its own run
    with pytest.raises(FrontError) as e:
        pool.acquire(_deadline(0.5))
    assert e.value.code == "RESOURCE_EXHAUSTED" and e.value.reason == "deadline_short" and e.value.retry_ms >= 1
    assert pool.waiting == 0
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(_deadline(30))))
    t.start()
    _wait_until(lambda: pool.waiting == 1)
    assert pool.wait_ns() == 1_500_000_000  # one ahead on two rings
    with pytest.raises(FrontError) as e:
        pool.acquire(_deadline(1.2))  # longer than the soonest ring, shorter than its turn behind the one waiting
    assert e.value.reason == "deadline_short" and pool.waiting == 1
    pool.release(second)
    t.join(5)
    assert got == [second] and pool.waiting == 0


def test_a_waiter_past_its_deadline_is_never_handed_a_ring():
    """The design's "never run afterwards": a ring freed after a waiter's deadline passed (before it woke to leave
    the line) goes to the next waiter in time, and the late one gets DEADLINE_EXCEEDED without it."""
    slot = _Slot()
    pool = SizePool([slot], max_waiting=2)
    held = pool.acquire(_deadline(1))
    outcomes = {}

    def wait(name, seconds):
        try:
            outcomes[name] = pool.acquire(_deadline(seconds))
        except FrontError as e:
            outcomes[name] = e
    late = threading.Thread(target=wait, args=("late", 0.2))
    late.start()
    _wait_until(lambda: pool.waiting == 1)
    in_time = threading.Thread(target=wait, args=("in_time", 30))
    in_time.start()
    _wait_until(lambda: pool.waiting == 2)
    with pool.cond:  # the late waiter cannot leave the line by itself while its deadline passes
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            time.sleep(0.05)
        pool.release(held)
    late.join(5)
    in_time.join(5)
    assert isinstance(outcomes["late"], FrontError) and outcomes["late"].code == "DEADLINE_EXCEEDED"
    assert outcomes["in_time"] is held and pool.waiting == 0 and pool.in_flight == 1
