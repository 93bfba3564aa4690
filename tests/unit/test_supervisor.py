"""The supervisor (lanes/supervisor.py, Supervisor): restarts, their backoff and budget, hangs, the watchdog's decision.

No root and no real lane: as gunicorn's tests/test_arbiter.py mocks os.fork, a fake zygote answers each spawn with
a fake lane, a thread speaking the real lane protocol (lanes/protocol.py) on the real SOCK_SEQPACKET socketpair the
supervisor reads. A lane "dies" when its end of the socket shuts (the supervisor's hang-up path; no pidfd, as when
the zygote could not open one, so nothing is signalled). The clock the supervisor reads is ours, so backoff and
the restart window are crossed without sleeping. The dispatch table is the real one (anonymous shared memory).
tests/integration/test_lanes.py kills and hangs real lanes."""
from __future__ import annotations

import os
import select
import socket
import threading
import time
import types

import pytest

from edgeinfer.config.sections import RuntimeConfig
from edgeinfer.lanes import dispatch, supervisor
from edgeinfer.models.providers import CPU_SPEC
from edgeinfer.lanes.protocol import TO_LANE, Ready, Staged, receive, send


class FakeLane(threading.Thread):
    """A lane as the supervisor meets it: says Ready, answers Stage with Staged, keeps what it was told."""

    def __init__(self, sock: socket.socket, pid: int):
        super().__init__(daemon=True)
        self.sock, self.pid, self.told = sock, pid, []
        send(sock, Ready(pid))
        self.start()

    def run(self):
        while True:
            try:
                msg, fds = receive(self.sock, TO_LANE)
            except OSError:
                return
            for fd in fds:
                os.close(fd)
            if msg is None:
                return
            self.told.append(msg)
            if type(msg).__name__ == "Stage":
                send(self.sock, Staged(msg.name, "1", None), wait_s=1.0)

    def die(self):
        """Its end of the socket goes: the supervisor reads a hang-up."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.join(2.0)
        self.sock.close()


class FakeZygote:
    """The zygote's interface to the supervisor (zygote.py): `sock`, readable only when the zygote is gone, and
    spawn(lane) → (pid, pidfd, the control plane's end of the lane's socket)."""

    def __init__(self):
        self.sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lanes: list[FakeLane] = []

    def spawn(self, lane: int, extra_providers=()):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fake = FakeLane(theirs, 1000 + len(self.lanes))
        self.lanes.append(fake)
        return fake.pid, None, ours

    def exit(self):
        self._theirs.close()

    def close(self):
        for fake in self.lanes:
            if fake.is_alive():
                fake.die()
        self.sock.close()
        self._theirs.close()


class FakeRuntime:
    """A verified model as the supervisor hands it on: what goes into the Stage memfd (pickled)."""
    version = "1"
    provider = CPU_SPEC

    def session_set(self):
        return {"model": "fake"}

    def fused_model(self, width, height):
        return b"fused"


class Clock:
    def __init__(self):
        self.offset = 0.0

    def monotonic(self):
        return time.monotonic() + self.offset


RESTARTS = 3


@pytest.fixture
def lanes(monkeypatch):
    """A Supervisor of one lane holding model `m`, started on the fake zygote; the supervisor's clock is ours."""
    clock = Clock()
    monkeypatch.setattr(supervisor, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    cfg = types.SimpleNamespace(runtime=RuntimeConfig(lane_restarts=RESTARTS, lane_restart_window_s=60.0,
                                                      lane_hang_s=5.0))
    plan = types.SimpleNamespace(cpus=[0], models=["m"])
    zygote = FakeZygote()
    table = dispatch.DispatchTable(0, 1)
    ls = supervisor.Supervisor(cfg, [plan], [], table, zygote, on_dropped=lambda *a: None)
    ls.clock = clock
    try:
        ls.start({"m": FakeRuntime()}, {})
        yield ls
    finally:
        ls.stop(timeout_s=0.5)
        zygote.close()


def _progress(ls, lane=0):
    ls.table.lane_counters(lane)[dispatch.LANE_PROGRESS] += 1


def _after(ls, seconds):
    ls.clock.offset += seconds


def test_a_started_lane_is_ready_and_was_given_its_model(lanes):
    ln = lanes.lanes[0]
    assert (ln.state, ln.pid, ln.restarts) == ("ready", 1000, 0)
    fake = lanes.zygote.lanes[0]
    deadline = time.monotonic() + 2
    while len(fake.told) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(m).__name__ for m in fake.told] == ["Stage", "Commit"]


def test_a_lane_that_dies_is_restarted_counted_and_given_its_model_again(lanes):
    lanes.zygote.lanes[0].die()
    lanes.poll()
    ln = lanes.lanes[0]
    assert (ln.state, ln.restarts, ln.pid) == ("ready", 1, 1001)
    assert ln.last_error == "exited"
    assert len(lanes.zygote.lanes) == 2
    fresh = lanes.zygote.lanes[1]
    deadline = time.monotonic() + 2
    while len(fresh.told) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(m).__name__ for m in fresh.told] == ["Stage", "Commit"]


def test_a_second_death_at_once_waits_out_the_backoff(lanes):
    lanes.zygote.lanes[0].die()
    lanes.poll()
    lanes.zygote.lanes[1].die()
    lanes.poll()
    ln = lanes.lanes[0]
    assert (ln.state, ln.restarts, len(lanes.zygote.lanes)) == ("down", 1, 2)  # 0.2 s backoff after one restart
    lanes.poll()
    assert len(lanes.zygote.lanes) == 2
    _after(lanes, 0.3)
    lanes.poll()
    assert (ln.state, ln.restarts, len(lanes.zygote.lanes)) == ("ready", 2, 3)


def test_past_its_restart_budget_a_lane_stays_down_and_the_watchdog_starves(lanes):
    ln = lanes.lanes[0]
    for i in range(RESTARTS):
        lanes.zygote.lanes[-1].die()
        lanes.poll()
        assert (ln.state, ln.restarts) == ("ready", i + 1)
        _after(lanes, 6.0)  # past the longest backoff (5 s), within the 60 s window
    since = lanes.clock.monotonic()
    lanes.zygote.lanes[-1].die()
    lanes.poll()
    _after(lanes, 6.0)
    lanes.poll()
    assert (ln.state, ln.restarts, len(lanes.zygote.lanes)) == ("down", RESTARTS, RESTARTS + 1)
    assert not lanes.watchdog_ok(since)  # recovery failed: systemd restarts the daemon
    assert lanes.stuck(1.0) == ["lane0"]


def test_once_the_window_has_passed_a_lane_down_is_restarted_again(lanes):
    ln = lanes.lanes[0]
    for _ in range(RESTARTS + 1):
        lanes.zygote.lanes[-1].die()
        lanes.poll()
        _after(lanes, 6.0)
    assert ln.state == "down"
    _after(lanes, 60.0)  # the restarts fall out of lane_restart_window_s
    lanes.poll()
    assert (ln.state, ln.restarts) == ("ready", RESTARTS + 1)


def test_a_lane_down_within_its_budget_keeps_the_watchdog_fed(lanes):
    lanes.zygote.lanes[0].die()
    lanes.poll()
    lanes.zygote.lanes[1].die()
    lanes.poll()  # down, in its backoff: being restarted within its budget
    assert lanes.lanes[0].state == "down"
    assert lanes.watchdog_ok(lanes.clock.monotonic())


def test_a_ready_lane_feeds_the_watchdog_only_while_its_loop_progresses(lanes):
    lanes.poll()  # the counter's first reading (a fresh lane's) counts as progress
    since = lanes.clock.monotonic()
    _after(lanes, 1.0)
    lanes.poll()
    assert not lanes.watchdog_ok(since)  # no progress since `since`
    _progress(lanes)
    lanes.poll()
    assert lanes.watchdog_ok(since)


def test_a_lane_without_progress_past_lane_hang_s_is_killed_and_restarted(lanes):
    _progress(lanes)
    lanes.poll()
    _after(lanes, 4.0)
    lanes.poll()
    assert lanes.lanes[0].restarts == 0  # within lane_hang_s (5 s)
    _after(lanes, 2.0)
    lanes.poll()
    ln = lanes.lanes[0]
    assert (ln.state, ln.restarts, len(lanes.zygote.lanes)) == ("ready", 1, 2)
    assert ln.last_error.startswith("made no progress for 6.0 s")


def test_the_zygotes_exit_is_fatal(lanes):
    lanes.zygote.exit()
    lanes.poll()
    assert lanes.fatal == "the lanes' zygote exited: no lane can be restarted"


def test_what_a_lane_said_of_a_hung_run_before_a_kill_crossed_it_is_still_taken(lanes):
    """A lane says its provider's run hung, then exits; a kill for no progress (or its exit seen first) may come
    before the supervisor read the message. It is read as the lane is settled: the restart stages the model on
    the CPU provider, and the reason is bounded (a lane is not trusted with the journal's size)."""
    from edgeinfer.lanes.protocol import ProviderFallback
    fake = lanes.zygote.lanes[0]
    send(fake.sock, ProviderFallback("m", "cpu", "openvino:GPU: a run did not end " + "x" * 10_000, True))
    deadline = time.monotonic() + 2
    while not select.select([lanes.lanes[0].sock], [], [], 0)[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    lanes._lost(lanes.lanes[0], "made no progress for 6.0 s: killed")  # before any poll() read it
    hung, why = lanes.hung_providers["m"]
    assert hung == "cpu" and why.startswith("openvino:GPU: a run did not end") and len(why) < 2100, why
    fresh = lanes.zygote.lanes[1]
    deadline = time.monotonic() + 2
    while not fresh.told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fresh.told[0].on_cpu == why  # staged on the CPU provider, saying why
