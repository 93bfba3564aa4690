"""Files the daemon keeps (the state directory, /var/lib/edgeinfer; the stats file), written whoever writes them.

The daemon runs as user edgeinfer (UMask=0077) and must read back every file there, but an operator runs
some of the writers as root (`edgeinferctl model allow-downgrade`). A file replaced here keeps the owner,
group and mode of the file it replaces. A new file has mode 0600 and is the writer's own, except that
root gives it the directory's owner and group (the state directory is the daemon's). A writer that may
not give the file its owner (not root, not the owner) fails with the reason and leaves the old file as
it was: it never leaves a file the daemon cannot read.

The replace is atomic (temp file in the same directory, rename): a crash mid-write leaves the old or the
new content, never a mix. Durable (the default) also fsyncs the file before the rename and the directory
after it, so the new content survives a power cut once this returns.
"""
from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import stat
import tempfile

NEW_FILE_MODE = 0o600


def _name(uid: int, gid: int) -> str:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"


def write_atomically(path: str, data: bytes, durable: bool = True) -> None:
    """Replaces `path` with `data`, keeping its owner, group and mode (new: mode 0600, the writer's own, or
    the directory's owner and group when root writes it). Raises OSError (strerror says why) with the old
    file unchanged."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(path)
        uid, gid, mode = st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        st = os.stat(d) if os.geteuid() == 0 else None
        uid, gid = (st.st_uid, st.st_gid) if st else (os.geteuid(), -1)  # -1: the group mkstemp gave it
        mode = NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            own = os.fstat(f.fileno())
            gid = own.st_gid if gid == -1 else gid
            if (own.st_uid, own.st_gid) != (uid, gid):
                try:
                    os.fchown(f.fileno(), uid, gid)
                except PermissionError as e:
                    owner = _name(uid, gid)
                    raise PermissionError(e.errno or errno.EPERM, f"it must stay owned by {owner} for the daemon "
                                          f"to read it, and this user may not give it that owner (run this as "
                                          f"root or as {owner.split(':')[0]})") from None
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the rename itself is durable
        finally:
            os.close(dfd)


def read_json(path: str):
    """The JSON document in `path`, or None when there is no such file. Raises OSError (unreadable) or
    ValueError (not JSON): a state file that cannot be read is the caller's to refuse, never taken as empty."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def write_json(path: str, data) -> None:
    """`data` as JSON in `path` (its directory made if missing), durably, as write_atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")
