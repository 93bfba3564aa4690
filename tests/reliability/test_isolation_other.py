"""Isolation rows under `runtime.scheduling: other`, the documented fallback when real time is refused:
the lanes and the control plane share the CPUs with everything else, so what a camera costs the daemon
shows in its neighbour's frames (the issue: re-handing one ring ~40 times a second took the neighbour
from 29.9 to 22.2 results/s here, while SCHED_FIFO hid it).

A module of its own, so that test_isolation.py's arena, whose lanes run SCHED_FIFO on the same CPUs, is
stopped first: a real-time daemon beside this one would take the CPUs from its lanes whatever the attack.
The arena and the row are test_isolation.py's.
"""
from __future__ import annotations

import pytest

from test_isolation import Arena, rehand_row


@pytest.fixture(scope="module")
def arena_other(tmp_path_factory, users, sandbox, signing_key, c_producer, c_reader):
    a = Arena(tmp_path_factory.mktemp("arena-other"), users, sandbox, signing_key, c_producer, c_reader,
              runtime={"scheduling": "other"})
    try:
        yield a
    finally:
        a.close()


def test_rehanding_the_same_ring_counts_as_churn_under_scheduling_other(request, matrix, arena_other, users):
    rehand_row(request, matrix, arena_other, users, "other")
