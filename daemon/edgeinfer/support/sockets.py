"""The daemon's Unix listeners (ingress, results) and a calibration source's: bound with their mode and group
set before anyone can connect; and the fd limit a server of many connections needs."""
from __future__ import annotations

import errno
import grp
import os
import resource
import socket
import stat


def bind_listener(path: str, group: str | int | None) -> socket.socket:
    """A SOCK_SEQPACKET listener at `path`, mode 0660 (group `group`, default ours). A stale socket
    file (nobody listening) is replaced; a live daemon's is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
            raise OSError(errno.EADDRINUSE, f"another edgeinferd listens on {path}")
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # left by a daemon that died
        finally:
            probe.close()
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    old = os.umask(0o177)  # the socket file is born 0600, then opened to its group: no window for others
    try:
        s.bind(path)
    finally:
        os.umask(old)
    if group is not None:
        gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
        os.chown(path, -1, gid)
    os.chmod(path, 0o660)
    s.listen(128)
    return s


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: a server's every connection costs an fd (the daemon's and the
    gateway's caps keep the count bounded; select() is not used)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
