"""One signal path for edgeinferd, the demo and edgeinferctl's long-running commands.

Installed once per process (`Signals(...)`, as early as the process can, before slow imports, so a stop
during start-up is orderly). A handler only records the signal: it appends its number to a list (atomic under
the GIL; it takes no lock and logs nothing). The main loop asks `requested(...)` (sticky: a stop stays
requested) or takes what came with `take()` and dispatches it to named handlers (`dispatch`).
"""
from __future__ import annotations

import signal
from collections.abc import Callable

STOP = (signal.SIGTERM, signal.SIGINT)


class Signals:
    def __init__(self, *signums: int):
        self._came: list[int] = []   # appended by the handlers, in order
        self._taken = 0              # how many of them take() has returned
        for s in signums:
            signal.signal(s, self._record)

    def also(self, *signums: int) -> None:
        """Records these too (e.g. SIGUSR1 once the configuration says fault injection is on)."""
        for s in signums:
            signal.signal(s, self._record)

    def _record(self, signum: int, _frame) -> None:
        self._came.append(signum)

    def requested(self, *signums: int) -> bool:
        """Whether any of `signums` came since the install (default: a stop, SIGTERM or SIGINT)."""
        return any(s in self._came for s in (signums or STOP))

    def take(self) -> list[int]:
        """The signals that came since the last take(), in order."""
        end = len(self._came)
        new, self._taken = self._came[self._taken:end], end
        return new

    def dispatch(self, handlers: dict[int, Callable[[], None]]) -> None:
        """Runs the named handler of each signal take() returns (a signal without one is only recorded)."""
        for s in self.take():
            handler = handlers.get(s)
            if handler is not None:
                handler()

    def stop_flag(self) -> Callable[[], bool]:
        """A callable for loops that take `stop=`: True once a stop came."""
        return self.requested
