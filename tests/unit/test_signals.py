"""The one signal path (signals.py): handlers only record; the loop takes and dispatches, in order."""
from __future__ import annotations

import os
import signal

from edgeinfer.support.signals import Signals


def test_signals_are_recorded_then_taken_in_order_and_a_stop_stays_requested():
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)}
    try:
        sig = Signals(signal.SIGHUP, signal.SIGUSR1)
        sig.also(signal.SIGUSR2)
        assert not sig.requested(signal.SIGHUP) and sig.take() == []
        for s in (signal.SIGHUP, signal.SIGUSR2, signal.SIGUSR1):
            os.kill(os.getpid(), s)  # delivered to this (main) thread before kill returns to Python code
        ran = []
        sig.dispatch({signal.SIGHUP: lambda: ran.append("reload"), signal.SIGUSR1: lambda: ran.append("fault")})
        assert ran == ["reload", "fault"]  # SIGUSR2 has no handler: recorded, nothing runs
        assert sig.take() == []  # each taken once
        assert sig.requested(signal.SIGUSR2) and sig.requested(signal.SIGHUP)  # sticky
        assert not sig.requested()  # no stop (SIGTERM/SIGINT) came
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
