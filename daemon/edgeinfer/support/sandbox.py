"""What a lane gives up before it reads its first camera byte, with or without systemd (native/harden.h).

A lane parses bytes a camera wrote, so it keeps only what serving needs:
- **its uid:** a daemon started as root runs its lanes as `runtime.lane_user` (default: the package's user
  `edgeinfer`; where that user does not exist and none is configured, `nobody`, said at every start). A daemon
  started as another user (systemd's `User=edgeinfer`) runs its lanes as that user;
- **its capabilities:** none, except CAP_SYS_NICE for as long as the loop thread needs it to take its real-time
  priority when RLIMIT_RTPRIO does not allow it (raised to the priority first where this process may, as under
  systemd's `LimitRTPRIO=`); the loop thread then drops it, and so does the lane's other thread. From the first
  frame on no thread of a lane holds a capability;
- **new privileges:** no_new_privs (no setuid binary, no file capability can give any back);
- **system calls:** a seccomp filter allowing only what a lane makes (harden.h says which and how narrowed).

Call `harden_lane` in the freshly forked lane, before it starts a thread (capabilities are per thread).
"""
from __future__ import annotations

import os
import pwd
from typing import NamedTuple

from edgeinfer import _harden

DEFAULT_LANE_USER = "edgeinfer"  # the package's user (packaging/debian/edgeinfer.postinst)
FALLBACK_LANE_USER = "nobody"


class LaneIdentity(NamedTuple):
    """The uid and gid a root daemon's lanes take (None: the daemon is not root, lanes keep its ids)."""
    uid: int
    gid: int
    name: str


def lane_identity(configured: str | None) -> tuple[LaneIdentity | None, str | None]:
    """(who lanes run as, a warning to log at every start or None). Not root: None, lanes keep the daemon's ids.
    A configured user is checked when the configuration is loaded (config.py); here it exists."""
    if os.geteuid() != 0:
        return None, None
    name = configured or DEFAULT_LANE_USER
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if configured:
            raise ValueError(f"runtime.lane_user: no such user: {configured!r}") from None
        pw = pwd.getpwnam(FALLBACK_LANE_USER)
        return (LaneIdentity(pw.pw_uid, pw.pw_gid, pw.pw_name),
                f"edgeinferd runs as root and there is no user {DEFAULT_LANE_USER}: its lanes run as "
                f"{FALLBACK_LANE_USER}. Create the user (the package does: useradd --system {DEFAULT_LANE_USER}) "
                f"or name one in runtime.lane_user")
    if pw.pw_uid == 0:
        raise ValueError(f"runtime.lane_user: {name!r} is root; lanes never run as root")
    return LaneIdentity(pw.pw_uid, pw.pw_gid, pw.pw_name), None


def harden_lane(identity: LaneIdentity | None, scheduling: str, priority: int) -> bool:
    """The lane's uid, capabilities, no_new_privs and seccomp filter, in that order. Returns whether the calling
    thread kept CAP_SYS_NICE (the loop thread, started next, inherits it: both call `release_nice`)."""
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
    _harden.install_lane_filter()
    return keep_nice


def release_nice() -> None:
    """The calling thread's last capability (CAP_SYS_NICE) dropped, if it had one."""
    _harden.limit_capabilities(False)


def name_thread(name: str) -> None:
    """The kernel's name of the calling thread (what ps -L, top -H show), at most 15 bytes."""
    _harden.name_thread(name.encode()[:15])
