"""sd_notify, the honest watchdog and the fd store, against the real daemon.

The notify socket here is a datagram socket this test owns, standing in for
systemd's (PID 1 is not systemd on this machine); it keeps the fds stored with
FDSTORE=1 and hands them to the next daemon as systemd does (LISTEN_FDS). What
systemd does with the messages (restart on WATCHDOG=trigger, the unit's state)
is the job of the system tests in a booted systemd (issue #5)."""
from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import sys
import time

import pytest

from conftest import read_line
from daemon_helpers import edgeinferd_args, poll, read_stats, sockets, write_config
from edgeinfer.abi import ring
from edgeinfer.support.systemd import Notifier, NotifyError
from ring_helpers import F_GET_SEALS, FRAME_SEALS

CTL = [sys.executable, "-m", "edgeinfer.cli"]


class FakeSystemd:
    """Collects notify datagrams with the time they arrived, and keeps the fds sent with them (the fd
    store): [(time, message, fds)] in `stored`. close() closes them."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self.stored: list[tuple[float, str, list[int]]] = []

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 4096, 16)
            except socket.timeout:
                continue
            now = time.monotonic()
            self.messages.append((now, data.decode()))
            if fds:
                self.stored.append((now, data.decode(), fds))

    def wait_for(self, field: str, timeout: float) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, m in self.messages:
                if field in m.split("\n"):
                    return t
            self.pump(0.1)
        pytest.fail(f"no {field!r} within {timeout}s; got {[m for _, m in self.messages][-8:]}")

    def times(self, field: str, since: float = 0.0) -> list[float]:
        return [t for t, m in self.messages if field in m.split("\n") and t >= since]

    def fds_named(self, name: str) -> list[list[int]]:
        """The fd lists sent with FDSTORE=1 and FDNAME=`name`, in order."""
        return [fds for _, m, fds in self.stored if {"FDSTORE=1", f"FDNAME={name}"} <= set(m.split("\n"))]

    def close(self) -> None:
        for _, _, fds in self.stored:
            for fd in fds:
                os.close(fd)
        self.stored = []
        self.sock.close()


@pytest.fixture
def fake_systemd(tmp_path):
    sd = FakeSystemd(tmp_path / "notify")
    yield sd
    sd.close()


def test_notify_without_socket_is_a_no_op_and_a_bad_socket_is_an_error(tmp_path):
    n = Notifier({})
    assert not n.enabled and n.watchdog_s == 0
    n.send("READY=1")  # nothing to send to, nothing raised
    with pytest.raises(NotifyError, match="NOTIFY_SOCKET=.*cannot connect"):
        Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent")})


def test_ready_status_honest_watchdog_reload_and_stopping(children, tmp_path, stream, bundles, fake_systemd):
    sd = fake_systemd
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}],
                       runtime={"fault_injection": "true", "status_interval_s": 0.5})
    env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "1000000"}
    proc = children.spawn(edgeinferd_args(cfg), env=env)
    started = time.monotonic()
    ready = sd.wait_for("READY=1", 60)
    assert ready > started
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "96", "--height", "48",
                           "--fps", "30", "--socket", sockets(cfg)[0]])
    sd.pump(3.0)
    pings = sd.times("WATCHDOG=1", since=ready)
    assert len(pings) >= 4, "about two pings a second with WATCHDOG_USEC=1s"
    status = [m for _, m in sd.messages if m.startswith("STATUS=") and stream in m]
    assert status and "fps" in status[-1] and "ppocr-cls 2.0" in status[-1]

    stall_at = time.monotonic()
    proc.send_signal(signal.SIGUSR1)  # test-only hook: the loop makes no progress for 3 s
    sd.pump(2.5)
    # The watchdog may only be fed while the loop is progressing. The stall begins at
    # the loop's next iteration (≤ 0.2 s after the signal) and one ping may still
    # report progress made before it (≤ 0.5 s later); after that, silence, then
    # WATCHDOG=trigger once a whole interval (1 s) passed without progress.
    during = sd.times("WATCHDOG=1", since=stall_at + 0.8)
    assert during == [], f"pinged while the loop was stuck: {during}"
    trigger = sd.times("WATCHDOG=trigger", since=stall_at)
    assert trigger and 0.8 < trigger[0] - stall_at < 2.5

    proc.send_signal(signal.SIGHUP)  # reload: RELOADING=1 … READY=1
    t_hup = time.monotonic()
    sd.pump(4.0)
    msgs = [m for t, m in sd.messages if t >= t_hup]
    reloading = next(i for i, m in enumerate(msgs) if "RELOADING=1" in m.split("\n"))
    assert "MONOTONIC_USEC=" in msgs[reloading]
    assert any("READY=1" in m.split("\n") for m in msgs[reloading + 1:])
    feed.terminate()
    feed.wait(10)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    sd.pump(0.3)
    assert sd.times("STOPPING=1", since=t_stop)


def test_a_run_past_its_deadline_is_cancelled_and_the_loop_lives_on(children, tmp_path, stream, bundles,
                                                                    fake_systemd):
    """The detector takes ~100 ms here; with a 10 ms run deadline every run is
    terminated (RunOptions.terminate), counted as an error, and the loop keeps
    going: the watchdog keeps being fed, no WATCHDOG=trigger."""
    sd = fake_systemd
    cfg = write_config(tmp_path, bundles("detector"), [{"name": stream, "width": 416, "height": 416}],
                       runtime={"run_deadline_ms": 10})
    stats = str(tmp_path / "stats.json")
    env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "2000000"}
    proc = children.spawn(edgeinferd_args(cfg, "--stats-file", stats), env=env)
    sd.wait_for("READY=1", 60)
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "416", "--height", "416",
                           "--fps", "5", "--socket", sockets(cfg)[0]])
    sd.pump(5.0)
    feed.terminate()
    feed.wait(10)
    import json
    s = json.load(open(stats))["streams"][stream]
    # The main thread looks every 50 ms, so a run shorter than that may finish before it is cancelled (on a
    # fast or idle CI machine most do): some runs cancelled, and the loop went on serving after them.
    assert s["error"] >= 3, s
    assert s["error"] + s["processed"] >= 10, s
    assert sd.times("WATCHDOG=1") and not sd.times("WATCHDOG=trigger")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def _kill_and_read(proc) -> str:
    proc.kill()
    proc.wait(10)
    return proc.stderr.read()


# What systemd does between two daemons: hand the fd store back as LISTEN_FDS (from fd 3) with LISTEN_FDNAMES,
# and LISTEN_PID set to the new daemon's pid. This launcher does it and then becomes the daemon (exec).
LAUNCH_WITH_FDS = """
import fcntl, os, sys
fds, names = [int(x) for x in sys.argv[1].split(",")], sys.argv[2]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]  # out of the way of 3, 4, ...
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=names, LISTEN_PID=str(os.getpid()))
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


def launch(children, cfg: str, fds: list[tuple[int, str]], env: dict, *extra: str):
    """edgeinferd started the way systemd starts it: `fds` [(fd, name)] passed from fd 3 on."""
    if not fds:
        return children.spawn(edgeinferd_args(cfg, *extra), env=env)
    return children.spawn([sys.executable, "-c", LAUNCH_WITH_FDS, ",".join(str(fd) for fd, _ in fds),
                           ":".join(name for _, name in fds), *edgeinferd_args(cfg, *extra)[1:]], env=env,
                          pass_fds=[fd for fd, _ in fds])


@pytest.mark.parametrize("socket_unit", [False, True], ids=["own-sockets", "socket-unit"])
def test_fd_store_keeps_a_camera_across_a_daemon_restart(children, tmp_path, stream, bundles, c_producer,
                                                         fake_systemd, socket_unit):
    """An accepted camera's ring and connection go to systemd's fd store (FDSTORE=1, FDNAME=ring.S and
    conn.S). A daemon that stops leaves them there; the next one, handed them as systemd would
    (LISTEN_FDS), serves the camera on: the camera never notices (no reconnection), results flow again.
    A camera that leaves is taken out of the store (FDSTOREREMOVE=1). Both with the listeners passed by a
    socket unit (first, as systemd orders them) and with sockets the daemon binds itself: a stored
    connection has its listener's address and must not be taken for a listener. Accounting goes on across
    the restart: the two daemons' outcomes add up to the frames the camera published, exactly."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reliability"))
    from rel_helpers import consumed, open_ring_of, published, stop

    sd = fake_systemd
    stats = str(tmp_path / "stats.json")
    first_stats = str(tmp_path / "stats-first.json")
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}])
    ingress, results_sock = sockets(cfg)
    env = {**os.environ, "NOTIFY_SOCKET": sd.path}
    listeners = []
    if socket_unit:  # what edgeinferd.socket holds across restarts of the daemon
        for path in (ingress, results_sock):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(path)
            s.listen(16)
            listeners.append(s)
    unit_fds = [(s.fileno(), "edgeinferd.socket") for s in listeners]
    ring_copy = None
    try:
        first = launch(children, cfg, unit_fds, env, "--stats-file", first_stats)
        sd.wait_for("READY=1", 60)
        prod = children.spawn([c_producer, stream, "96", "48", "--fps", "30", "--socket", ingress])
        assert read_line(prod) == "CONNECTED accepted=1"
        deadline = time.monotonic() + 10
        while not (sd.fds_named(f"ring.{stream}") and sd.fds_named(f"conn.{stream}")) and \
                time.monotonic() < deadline:
            sd.pump(0.1)
        rings, conns = sd.fds_named(f"ring.{stream}"), sd.fds_named(f"conn.{stream}")
        assert len(rings) == 1 and len(rings[0]) == 1 and len(conns) == 1 and len(conns[0]) == 1, sd.stored
        ring_fd, conn_fd = rings[0][0], conns[0][0]
        assert os.readlink(f"/proc/self/fd/{ring_fd}").startswith(f"/memfd:edgeinfer-frames:{stream}")
        assert fcntl.fcntl(ring_fd, F_GET_SEALS) & FRAME_SEALS == FRAME_SEALS  # sealed: it cannot shrink
        conn = socket.socket(fileno=os.dup(conn_fd))
        assert conn.type == socket.SOCK_SEQPACKET and conn.getsockname() == ingress
        conn.close()

        ring_copy = open_ring_of(prod.pid, stream)  # ours: the ring's header counters, read-only
        t_stop = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(10) == 0
        first_count = read_stats(first_stats)["streams"][stream]["offered"]  # its final counts
        assert first_count == consumed(ring_copy) > 0
        sd.pump(0.3)
        assert not [m for t, m in sd.messages if t >= t_stop and "FDSTOREREMOVE=1" in m.split("\n")]  # kept

        second = launch(children, cfg, [*unit_fds, (ring_fd, f"ring.{stream}"), (conn_fd, f"conn.{stream}")], env,
                        "--stats-file", stats)
        # restored_producers is there from the first stats the daemon writes (the restore comes before).
        poll(lambda: second.poll() is not None or "restored_producers" in read_stats(stats), 60)
        restored = read_stats(stats).get("restored_producers")
        assert restored == 1, f"not restored ({restored}); the second daemon's log: " + (
            second.stderr.read() if second.poll() is not None else _kill_and_read(second))
        reader = ring.ResultReader.connect(stream, socket=results_sock)
        try:
            assert reader.read(10.0) is not None, "no result from the restored camera"
        finally:
            reader.close()
        st = read_stats(stats)["streams"][stream]
        assert st["connected"] and st["attaches"] == 1, st
        ready, _, _ = select.select([prod.stdout], [], [], 0.5)
        assert not ready, f"the camera saw the restart: {prod.stdout.readline()!r}"  # no DISCONNECTED/CONNECTED
        # The ingress socket is served too: a second camera is answered (refused: the stream has its camera).
        with ring.FrameWriter.connect(stream, 96, 48, socket=ingress, wait=5.0) as other:
            assert not other.connected and "already has its producer" in str(other.connection["last_error"]), \
                other.connection
        # No more frames (the connection stays): once the second daemon has taken the last one, the two
        # daemons' counts are every frame published, none twice (it did not count the first one's again).
        assert stop(prod), "the camera did not stop"
        total = published(ring_copy)
        def second_count():
            return read_stats(stats).get("streams", {}).get(stream, {}).get("offered")
        poll(lambda: consumed(ring_copy) == total and second_count() == total - first_count, 20)
        assert first_count + second_count() == total, (first_count, read_stats(stats).get("streams"), total)

        t_kill = time.monotonic()
        prod.send_signal(signal.SIGKILL)  # a camera that dies is taken out of the store
        prod.wait(10)
        want = {f"ring.{stream}", f"conn.{stream}"}
        deadline = time.monotonic() + 10
        removed: set = set()
        while removed != want and time.monotonic() < deadline:
            sd.pump(0.1)
            removed = {line.removeprefix("FDNAME=") for t, m in sd.messages if t >= t_kill and
                       "FDSTOREREMOVE=1" in m.split("\n") for line in m.split("\n") if line.startswith("FDNAME=")}
        assert removed == want, sd.messages[-6:]
        second.send_signal(signal.SIGTERM)
        assert second.wait(10) == 0
    finally:
        for s in listeners:
            s.close()
        if ring_copy is not None:
            os.close(ring_copy)


def test_the_stop_path_cleans_up_when_the_notify_socket_is_gone(children, tmp_path, stream, bundles):
    """STOPPING=1 to a NOTIFY_SOCKET that went away (issue 23): the send fails, and the stop goes on all the same:
    exit 0, the sockets the daemon made are removed, the failure said in one warning line."""
    sd = FakeSystemd(tmp_path / "notify")
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}])
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        proc = children.spawn([*edgeinferd_args(cfg)], env={**os.environ, "NOTIFY_SOCKET": sd.path}, stderr=out)
    try:
        sd.wait_for("READY=1", 60)
    finally:
        sd.close()
        os.unlink(sd.path)  # systemd's socket gone: the next send is refused
    made = sockets(cfg)
    assert all(os.path.exists(p) for p in made)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, log.read_text()[-2000:]
    assert [p for p in made if os.path.exists(p)] == []
    assert "cannot tell systemd we are stopping" in log.read_text()
