"""Whether a process of one main loop and a few threads it needs is alive: the evidence the watchdog pings on
(support/systemd.Watchdog reads `watchdog_ok`) and /healthz lists (`problems`).

The gateway (fronts/gateway.py: the keeper loop, the Frigate front's thread) and the MQTT bridge
(bridges/bridge.py: the reader loop, paho's network thread) each hold one. It is told only what it watches:
when the loop last turned, and a callable per thread.
"""
from __future__ import annotations

import time
from typing import Callable

__all__ = ["Liveness", "STUCK_AFTER_S"]

STUCK_AFTER_S = 5.0   # a loop that has not turned for this long is stuck (/healthz says so)


class Liveness:
    """The loop calls `turned()` once a turn; `watch` adds a thread the process cannot do without."""

    def __init__(self, loop: str):
        self.loop = loop                  # how /healthz names the loop ("the keeper")
        self.turned_at = time.monotonic()
        self._threads: dict[str, Callable[[], bool]] = {}   # /healthz's line when stopped → is it alive

    def turned(self) -> None:
        self.turned_at = time.monotonic()

    def watch(self, stopped: str, alive: Callable[[], bool]) -> None:
        """`alive()` says whether the thread still runs; `stopped` is /healthz's line once it does not."""
        self._threads[stopped] = alive

    def watchdog_ok(self, since: float) -> bool:
        """The loop turned since the watchdog's last ping, and every watched thread is alive."""
        return self.turned_at > since and all(alive() for alive in self._threads.values())

    def problems(self) -> list[str]:
        out = [f"{self.loop} is stuck"] if time.monotonic() - self.turned_at > STUCK_AFTER_S else []
        return out + [stopped for stopped, alive in self._threads.items() if not alive()]
