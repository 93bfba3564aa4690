"""The control plane's periodic work, and the clock of its loop.

`Chores` runs once per turn of the serve loop: the trim after a model swap,
the watchdog, the anti-rollback records, STATUS=, the bundle watch, the
stats file and the drift figures (drift.py). It gets what it uses, each a named collaborator; the loop's own
turns are timed by `LoopClock`, whose stalls /metrics reports.
"""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Callable

from edgeinfer.control.status import status_line
from edgeinfer.support.memtrim import DeferredTrim
from edgeinfer.support.statefile import write_atomically

if TYPE_CHECKING:
    from edgeinfer.config.schema import Config
    from edgeinfer.control.drift import Drift
    from edgeinfer.control.registry import ModelRegistry
    from edgeinfer.control.rollout import Rollouts
    from edgeinfer.lanes.supervisor import Supervisor
    from edgeinfer.support.systemd import Notifier, Watchdog

log = logging.getLogger("edgeinferd")

STALL_S = 1.0         # the control plane's loop turns every 50 ms or so: a turn longer than this is a stall


class LoopClock:
    """When the control plane's loop last turned. A turn that took longer than STALL_S is a stall (a reload
    waiting on its lanes, or a call that blocked): counted, summed, and logged once, with its length, when it
    ends. `age()` is read by the metrics thread, live during a stall (one float, written by the loop only)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.stalls = 0
        self.stalled_s = 0.0
        self.longest_s = 0.0

    def start(self) -> None:
        self.last = time.monotonic()

    def turn(self) -> None:
        now = time.monotonic()
        took, self.last = now - self.last, now
        if took > STALL_S:
            self.stalls += 1
            self.stalled_s += took
            self.longest_s = max(self.longest_s, took)
            log.warning("control plane: its loop did not turn for %.1f s (no handshake, reload or watchdog ping "
                        "meanwhile; the lanes served on); %d such stall(s) so far", took, self.stalls)

    def age(self) -> float:
        return time.monotonic() - self.last


class Chores:
    """The control plane's periodic work, each a named step (the serve loop runs them every turn)."""

    def __init__(self, cfg: Config, *, models: ModelRegistry, lanes: Supervisor, rollouts: Rollouts | None,
                 notifier: Notifier, watchdog: Watchdog | None, trim: DeferredTrim, status: Callable[[], dict],
                 reload: Callable[..., dict], status_interval: float = 0.0, stats_file: str | None = None,
                 print_status: Callable[[dict], None] | None = None, drift: Drift | None = None) -> None:
        """models: the registry; lanes: the Supervisor; rollouts: the models' rollouts (their gates are evaluated
        here); notifier: sd_notify; watchdog: its pinger; status: the status dict now; reload(only_moved=True):
        reloads the models whose bundle path moved; drift: the drift chore (control/drift.py), or None."""
        self.cfg = cfg
        self.models, self.lanes, self.notifier, self.watchdog, self.trim = models, lanes, notifier, watchdog, trim
        self.rollouts = rollouts
        self.status, self.reload, self.drift = status, reload, drift
        now = time.monotonic()
        self.next_notify = now + cfg.runtime.status_interval_s
        self.status_interval, self.stats_file, self.print_status = status_interval, stats_file, print_status
        self.next_status: float | None = now + status_interval if status_interval else None
        self.watch = cfg.model.watch_interval_s
        self.next_watch: float | None = now + self.watch if self.watch else None
        self.moved_since: float | None = None
        self.stats_error: str | None = None

    def run(self) -> None:
        now = time.monotonic()
        self.trim.run_due()
        if self.watchdog:
            self.watchdog.tick()
        self.models.record_accepted()
        if self.rollouts is not None:
            self.rollouts.evaluate(now)
        if self.notifier.enabled and now >= self.next_notify:
            self.next_notify += self.cfg.runtime.status_interval_s
            self.notifier.send("STATUS=" + status_line(self.status()))
        if self.next_watch and now >= self.next_watch:
            self.next_watch += self.watch
            self.watch_bundles(now)
        if self.next_status and now >= self.next_status:
            self.next_status += self.status_interval
            self.write_status()
        if self.drift is not None:
            self.drift.run_due(now)

    def inject_fault(self) -> None:
        """SIGUSR1 with runtime.fault_injection (test use only)."""
        if not self.cfg.runtime.fault_injection:
            return
        # Longer than a lane may hang (it is killed and restarted) and than the watchdog can miss.
        stall = max(3.0, 2 * self.notifier.watchdog_s, 2 * self.cfg.runtime.lane_hang_s)
        log.warning("fault injection: stalling every lane for %g s", stall)
        self.lanes.stall(stall)

    def watch_bundles(self, now: float) -> None:
        """Debounced: reload once a model's path has pointed elsewhere for a whole interval."""
        if any(self.models.changed(n) for n in self.models.served):
            if self.moved_since is None:
                self.moved_since = now
            elif now - self.moved_since >= self.watch:
                self.moved_since = None
                self.reload(only_moved=True)
        else:
            self.moved_since = None

    def write_status(self) -> None:
        st = self.status()
        if self.stats_file:
            try:
                write_json_atomically(self.stats_file, st)
                self.stats_error = None
            except OSError as e:  # a diagnostic aid: never a reason to stop serving
                if self.stats_error != e.strerror:
                    log.error("cannot write the stats file %s: %s", self.stats_file, e.strerror)
                self.stats_error = e.strerror
        if self.print_status:
            self.print_status(st)


def write_json_atomically(path: str, data: dict) -> None:
    """temp file + rename: a reader never sees half a file (not fsynced: it is rewritten every interval)."""
    write_atomically(path, json.dumps(data).encode(), durable=False)
