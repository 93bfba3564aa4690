"""One signal path for edgeinferd, the demo and edgeinferctl's long-running commands.

Installed once per process (`Signals(...)`, as early as the process can, before slow imports, so a stop
during start-up is orderly). A handler only records the signal: it adds its number to a set and a deque (each atomic under
the GIL; it takes no lock and logs nothing). The main loop asks `requested(...)` (sticky: a stop stays
requested) or takes what came with `take()` and dispatches it to named handlers (`dispatch`).
"""
from __future__ import annotations

import collections
import signal
from collections.abc import Callable

STOP = (signal.SIGTERM, signal.SIGINT)


class Signals:
    def __init__(self, *signums: int):
        self._queue: collections.deque[int] = collections.deque()  # appended by the handlers, drained by take()
        self._seen: set[int] = set()  # every signal that came (a stop stays requested)
        for s in signums:
            signal.signal(s, self._record)

    def also(self, *signums: int) -> None:
        """Records these too (e.g. SIGUSR1 once the configuration says fault injection is on)."""
        for s in signums:
            signal.signal(s, self._record)

    def _record(self, signum: int, _frame) -> None:
        self._seen.add(signum)
        self._queue.append(signum)

    def requested(self, *signums: int) -> bool:
        """Whether any of `signums` came since the install (default: a stop, SIGTERM or SIGINT)."""
        return not self._seen.isdisjoint(signums or STOP)

    def take(self) -> list[int]:
        """The signals that came since the last take(), in order."""
        out = []
        while self._queue:
            out.append(self._queue.popleft())
        return out

    def dispatch(self, handlers: dict[int, Callable[[], None]]) -> None:
        """Runs the named handler of each signal take() returns (a signal without one is only recorded)."""
        for s in self.take():
            handler = handlers.get(s)
            if handler is not None:
                handler()

    def stop_flag(self) -> Callable[[], bool]:
        """A callable for loops that take `stop=`: True once a stop came."""
        return self.requested
