"""What a lane gives up before it reads its first camera byte, with or without systemd (native/harden.h).

A lane parses bytes a camera wrote, so it keeps only what serving needs:
- **its uid:** a daemon started as root runs its lanes as `runtime.lane_user` (default: the package's user
  `edgeinfer`; where that user does not exist and none is configured, a dynamic uid of its own, as systemd's
  DynamicUser= allocates one, said at every start: never `nobody`, whose other processes could signal a lane).
  A daemon started as another user (systemd's `User=edgeinfer`) runs its lanes as that user;
- **its capabilities:** none, except CAP_SYS_NICE for as long as the loop thread needs it to take its real-time
  priority when RLIMIT_RTPRIO does not allow it (raised to the priority first where this process may, as under
  systemd's `LimitRTPRIO=`); the loop thread then drops it, and so does the lane's other thread. From the first
  frame on no thread of a lane holds a capability;
- **new privileges:** no_new_privs (no setuid binary, no file capability can give any back);
- **system calls:** a seccomp filter allowing only what a lane makes (harden.h says which and how narrowed).

Call `harden_lane` in the freshly forked lane, before it starts a thread (capabilities are per thread).
"""
from __future__ import annotations

import fcntl
import grp
import os
import pwd
from typing import NamedTuple

from edgeinfer import _harden

DEFAULT_LANE_USER = "edgeinfer"  # the package's user (packaging/debian/edgeinfer.postinst)
# Without it: a uid (and a gid of the same number) from systemd's range for dynamic users, which no passwd or
# group entry names (nss-systemd lists the ones systemd gave out) and no process holds, locked for the daemon's
# life (docs/decisions/0033-a-dynamic-lane-uid-and-self-only-affinity.md). The lock is systemd's own: a BSD lock on
# /run/systemd/dynamic-uid/UID, which systemd's allocator (src/core/dynamic-user.c, pick_uid) takes before it gives
# a uid to a DynamicUser= service and skips when it cannot. So neither a later DynamicUser= service nor another
# edgeinferd gets the lanes' uid, while they live.
DYNAMIC_UIDS = range(61184, 65520)
DYNAMIC_UID_LOCKS = "/run/systemd/dynamic-uid"
_held_locks: list[int] = []  # the lock of each dynamic uid this process took: held until it exits


class LaneIdentity(NamedTuple):
    """The uid and gid a root daemon's lanes take (None: the daemon is not root, lanes keep its ids)."""
    uid: int
    gid: int
    name: str
    dynamic: bool = False  # a uid of DYNAMIC_UIDS, locked for this daemon: no user's, no other process's


def lane_identity(configured: str | None) -> tuple[LaneIdentity | None, str | None]:
    """(who lanes run as, a warning to log at every start or None). Not root: None, lanes keep the daemon's ids.
    A configured user is checked when the configuration is loaded (config/sections.py); here it exists."""
    if os.geteuid() != 0:
        return None, None
    name = configured or DEFAULT_LANE_USER
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if configured:
            raise ValueError(f"runtime.lane_user: no such user: {configured!r}") from None
        uid = dynamic_uid()
        return (LaneIdentity(uid, uid, f"dynamic uid {uid}", dynamic=True),
                f"edgeinferd runs as root and there is no user {DEFAULT_LANE_USER}: its lanes run as dynamic uid "
                f"{uid}, which no other process has. Create the user (the package does: useradd --system "
                f"{DEFAULT_LANE_USER}) or name one in runtime.lane_user")
    if pw.pw_uid == 0:
        raise ValueError(f"runtime.lane_user: {name!r} is root; lanes never run as root")
    return LaneIdentity(pw.pw_uid, pw.pw_gid, pw.pw_name), None


def _uids_in_use() -> set[int]:
    """Every real, effective, saved and file-system uid a live process holds now."""
    used = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            used.update(int(u) for u in line.split()[1:])
                            break
            except OSError:
                continue  # gone meanwhile
    return used


def _named(uid: int) -> bool:
    """Whether a passwd or group entry (files, nss-systemd's dynamic users, LDAP...) has this number."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


def _still_linked(fd: int, path: str) -> bool:
    """Whether the file `fd` locks is still the one at `path`: a lock on an unlinked file guards nothing, since
    the next allocator creates a new file there (systemd's pick_uid checks the same)."""
    try:
        st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return st.st_nlink > 0 and (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def dynamic_uid(uids: range = DYNAMIC_UIDS, locks: str = DYNAMIC_UID_LOCKS) -> int:
    """Root: a uid of `uids` that no passwd or group entry names and no process holds, locked (flock on
    `locks`/<uid>) for as long as this process and its children live. OSError when every one is taken."""
    os.makedirs(locks, mode=0o755, exist_ok=True)  # systemd's mode for it; each lock file is 0600
    used = _uids_in_use()
    for uid in uids:
        if uid in used or _named(uid):
            continue
        path = os.path.join(locks, str(uid))
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # systemd's (a DynamicUser= service), or another daemon's whose lanes have not started yet
            continue
        if not _still_linked(fd, path):  # its holder unlinked it (systemd does, freeing a uid) before we locked
            os.close(fd)
            continue
        if uid in _uids_in_use():  # a lane of a daemon that took it and has since died
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            continue
        _held_locks.append(fd)
        return uid
    raise OSError(f"no free dynamic uid for the lanes in {uids.start}-{uids.stop - 1}: create the user "
                  f"{DEFAULT_LANE_USER} or name one in runtime.lane_user")


def harden_lane(identity: LaneIdentity | None, scheduling: str, priority: int, jit: bool = False) -> bool:
    """The lane's uid, capabilities, no_new_privs and seccomp filter, in that order; jit: its filter lets memory
    be made writable and executable (a provider that compiles kernels at run time: native/harden.h). Returns
    whether the calling thread kept CAP_SYS_NICE (the loop thread, started next, inherits it: both call
    `release_nice`)."""
    keep_nice = False
    if scheduling != "other":
        try:
            keep_nice = _harden.allow_rtprio(priority) < priority
        except OSError:
            keep_nice = True
    if identity is not None:
        _harden.become(identity.uid, identity.gid, keep_nice)
    else:
        _harden.limit_capabilities(keep_nice)
    _harden.install_lane_filter(jit)
    return keep_nice


def release_nice() -> None:
    """The calling thread's last capability (CAP_SYS_NICE) dropped, if it had one."""
    _harden.limit_capabilities(False)


def name_thread(name: str) -> None:
    """The kernel's name of the calling thread (what ps -L, top -H show), at most 15 bytes."""
    _harden.name_thread(name.encode()[:15])
