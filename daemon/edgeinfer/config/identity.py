"""Who may produce or read a stream: names in the configuration, kernel
credentials on the connection.

A client's credentials come from the kernel (SO_PEERCRED: uid and primary gid
at connect(); SO_PEERGROUPS: its supplementary groups), never from anything the
client says. A producer identity names a user and/or a group (both must match
when both are given); a reader list names users and groups (any one matches).
Names are resolved to ids once, when the daemon starts (and checked when the
configuration is loaded, so a typo is an error with its line).
"""
from __future__ import annotations

import dataclasses
import grp
import pwd

from pydantic import model_validator

from edgeinfer.support.strictmodel import StrictModel


def user_id(user: str | int) -> int:
    if isinstance(user, int):
        return user
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ValueError(f"no such user: {user!r}") from None


def group_id(group: str | int) -> int:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no such group: {group!r}") from None


_HOST_UIDS: set = set()  # uids found in the user database (a user rarely leaves it: cached for good)


def host_user(uid: int) -> bool:
    """Whether `uid` is a user of this host's user database (NSS: /etc/passwd, LDAP, systemd's dynamic users).
    A uid outside it (a user namespace's subordinate uid, from /etc/subuid, or any uid nobody named) is no
    party the daemon can tell apart from another such uid. Misses are looked up again each time (a user may
    be added while the daemon runs); hits are cached."""
    if uid in _HOST_UIDS:
        return True
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    _HOST_UIDS.add(uid)
    return True


@dataclasses.dataclass(frozen=True)
class Peer:
    """A connected client as the kernel sees it."""

    uid: int
    gid: int
    pid: int
    groups: frozenset = frozenset()  # supplementary groups (SO_PEERGROUPS)

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups

    def __str__(self) -> str:
        try:
            name = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            name = "?"
        return f"uid {self.uid} ({name}), gid {self.gid}, pid {self.pid}"


@dataclasses.dataclass(frozen=True)
class Ids:
    """Resolved ids: who matches. `all_of`: every non-empty set must match (a
    producer's user AND group); otherwise any member of either matches."""

    uids: frozenset = frozenset()
    gids: frozenset = frozenset()
    all_of: bool = False

    def allows(self, peer: Peer) -> bool:
        user_ok = peer.uid in self.uids
        group_ok = any(peer.in_group(g) for g in self.gids)
        if self.all_of:
            return (not self.uids or user_ok) and (not self.gids or group_ok) and bool(self.uids or self.gids)
        return user_ok or group_ok


class Identity(StrictModel):
    """streams[].producer: `user` and/or `group` (names or numeric ids). A group alone lets any member of it
    take the stream first: the configuration accepts that only with `trust_any_member: true` (schema.py)."""

    user: str | int | None = None
    group: str | int | None = None
    trust_any_member: bool = False

    @model_validator(mode="after")
    def _some(self):
        if self.user is None and self.group is None:
            raise ValueError("name a user and/or a group")
        return self

    def resolve(self) -> Ids:
        """ValueError for a name that does not exist."""
        uids = {user_id(self.user)} if self.user is not None else set()
        gids = {group_id(self.group)} if self.group is not None else set()
        return Ids(frozenset(uids), frozenset(gids), all_of=True)

    def __str__(self) -> str:
        parts = [f"user {self.user}" if self.user is not None else "",
                 f"group {self.group}" if self.group is not None else ""]
        return " and ".join(p for p in parts if p)


@dataclasses.dataclass(frozen=True)
class LegacyUids:
    """The producers of a stream that names none, in a 0.1 configuration that set shm.allowed_uids: any
    of those uids (not a configuration key of its own)."""

    uids: tuple

    def resolve(self) -> Ids:
        return Ids(frozenset(self.uids), frozenset())

    def __str__(self) -> str:
        return f"one of uids {list(self.uids)} (shm.allowed_uids)"


class Acl(StrictModel):
    """streams[].readers: any of these users or groups (names or numeric ids)."""

    users: list[str | int] = []
    groups: list[str | int] = []

    def resolve(self, strict: bool = True) -> Ids:
        """strict: a name that does not exist is a ValueError; else it matches nobody."""
        uids, gids = set(), set()
        for u in self.users:
            try:
                uids.add(user_id(u))
            except ValueError:
                if strict:
                    raise
        for g in self.groups:
            try:
                gids.add(group_id(g))
            except ValueError:
                if strict:
                    raise
        return Ids(frozenset(uids), frozenset(gids))

    def __str__(self) -> str:
        parts = [f"users {self.users}" if self.users else "", f"groups {self.groups}" if self.groups else ""]
        return " or ".join(p for p in parts if p) or "nobody"
