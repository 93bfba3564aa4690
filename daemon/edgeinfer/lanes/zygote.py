"""The lanes' zygote: a process forked from the control plane before it
starts any thread, that forks lanes on request, at start and whenever one
must be restarted.

Why a zygote: a lane must inherit the dispatch table and the result rings'
one writable mapping (a result ring is sealed against every mapping made
after the daemon's own, so it cannot be passed by fd), and forking the control
plane itself once its HTTP and other threads run could copy a lock held by
one of them. The zygote stays single-threaded and does nothing but fork.

Control plane → zygote: ("spawn", lane) + [the lane's end of its socketpair].
Zygote → control plane: ("spawned", lane, pid) + [a pidfd of the lane, when it could open one].
Every process here dies with its parent (PR_SET_PDEATHSIG): no lane outlives the daemon.
"""
from __future__ import annotations

import ast
import ctypes
import gc
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING

from edgeinfer.lanes import process as lanes_proc

if TYPE_CHECKING:
    from edgeinfer.config.schema import Config
    from edgeinfer.config.sections import LaneConfig
    from edgeinfer.lanes.dispatch import DispatchTable
    from edgeinfer.lanes.stream import Stream
    from edgeinfer.support.sandbox import LaneIdentity

PR_SET_PDEATHSIG = 1
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGPIPE)


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Zygote:
    """The control plane's handle on the zygote."""

    def __init__(self, cfg: Config, plans: list[LaneConfig], streams: list[Stream], table: DispatchTable,
                 lane_identity: LaneIdentity | None = None) -> None:
        if len(threading.enumerate()) != 1:
            raise RuntimeError("the lanes' zygote must be forked before any thread starts")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote
            ours.close()
            code = 1
            try:
                _die_with_parent(parent)
                for sig in _IGNORED:  # the control plane stops lanes; a terminal's Ctrl-C reaches the group
                    signal.signal(sig, signal.SIG_IGN)
                signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # lanes are reaped by the kernel
                # Every fd of the control plane (the fd store's rings and camera connections, listeners, the
                # result rings' memfds) stays out of the zygote and the lanes: a lane writes a result ring
                # through the mapping it inherits, and gets each frame ring by fd when it is attached.
                for s in streams:
                    s.writer.drop_fd()
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
                try:  # for ps and top
                    with open("/proc/self/comm", "w") as f:
                        f.write("edgeinfer-zygote")
                except OSError:
                    pass
                # Every object alive now (the modules, ORT's and numpy's included: ~45,000) goes to the
                # collector's permanent generation, so no lane's collection ever walks them: unfrozen, a lane's
                # first full collection took 68 ms here (the loop waits for the GIL meanwhile), and writing
                # their GC headers copied the pages the lanes share with the zygote.
                gc.freeze()
                code = _serve(theirs, cfg, plans, streams, table, lane_identity)
            finally:
                os._exit(code)
        theirs.close()
        self.sock = ours
        self.pid = pid

    def spawn(self, lane: int, timeout_s: float = 10.0, extra_providers: tuple = ()) -> tuple[int, int | None,
                                                                                               socket.socket]:
        """Forks lane `lane` (loading `extra_providers` too: provider names); returns (pid, pidfd or None, the
        control plane's end of its socket)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self.sock, [repr(("spawn", lane, tuple(extra_providers))).encode()], [theirs.fileno()])
        finally:
            theirs.close()
        self.sock.settimeout(timeout_s)
        try:
            data, fds, _f, _a = socket.recv_fds(self.sock, 256, 1)
        finally:
            self.sock.settimeout(None)
        if not data:
            ours.close()
            raise RuntimeError("the lanes' zygote is gone")
        kind, lane_, pid = ast.literal_eval(data.decode())
        return pid, (fds[0] if fds else None), ours

    def close(self) -> None:
        self.sock.close()  # the zygote sees EOF and exits; its lanes are stopped by the control plane


def _serve(sock: socket.socket, cfg: Config, plans: list[LaneConfig], streams: list[Stream], table: DispatchTable,
           lane_identity: LaneIdentity | None) -> int:
    zygote = os.getpid()
    while True:
        data, fds, _f, _a = socket.recv_fds(sock, 256, 1)
        if not data:
            return 0
        kind, lane, extra = ast.literal_eval(data.decode())
        if kind != "spawn" or not fds:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:  # the lane
            code = 1
            try:
                sock.close()
                _die_with_parent(zygote)
                code = lanes_proc.lane_main(lane, plans, cfg, streams, table, socket.socket(fileno=fds[0]),
                                            lane_identity, extra)
            finally:
                os._exit(code)
        os.close(fds[0])
        try:
            pidfd = [os.pidfd_open(pid)]
        except OSError:  # already gone (and reaped): the control plane sees no pidfd and restarts it
            pidfd = []
        socket.send_fds(sock, [repr(("spawned", lane, pid)).encode()], pidfd)
        for fd in pidfd:
            os.close(fd)
