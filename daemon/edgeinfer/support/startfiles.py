"""The files a service reads at start, checked before it reads them: a file its user cannot open (or that is not
there) is refused with one line naming the file, the key that names it, who owns it now and the owner and mode it
needs, and the service exits 2, which its unit's RestartPreventExitStatus=2 keeps from a restart loop: a restart
cannot give a file another owner (docs/operations/install-and-upgrade.md, "Files each service reads at start")."""
from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class StartFile:
    path: str
    key: str   # what names it: a configuration key ("grpc.tls.key") or the command line ("--config")
    need: str  # the owner and mode it needs, e.g. "root:edgeinfer-gw 0640"
    directory: bool = False  # a directory the service lists (the trust store): it needs r and x


class StartFileError(ValueError):
    """Every start file the process cannot read, one line each; the service exits 2 on it."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _name(table, ident: int) -> str:
    try:
        return table(ident)[0]
    except KeyError:
        return str(ident)


def whoami() -> str:
    """This process's user and groups, as a refusal says them: 'edgeinfer-gw (groups edgeinfer-gw, edgeinfer)'."""
    groups = [os.getegid()] + [g for g in os.getgroups() if g != os.getegid()]
    return (f"{_name(pwd.getpwuid, os.geteuid())} (groups "
            f"{', '.join(_name(grp.getgrgid, g) for g in groups)})")


def _now(path: str) -> str:
    """'0600 root:root' as the file is now, or why that cannot be said."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be looked at: {e.strerror}"
    return f"{stat.S_IMODE(st.st_mode):04o} {_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)}"


def problem(f: StartFile, err: OSError) -> str:
    """The refusal's line for one file."""
    what = "directory" if f.directory else "file"
    if isinstance(err, FileNotFoundError):
        return f"{f.key}: {f.path}: no such {what}; it must exist, {f.need}"
    return (f"{f.key}: {f.path}: {err.strerror} for {whoami()}: it is {_now(f.path)}; it must be {f.need}")


def check_start_files(files: list[StartFile]) -> None:
    """Opens each file (lists each directory) as this process: raises StartFileError naming every one it cannot."""
    problems = []
    for f in files:
        try:
            if f.directory:
                os.listdir(f.path)
            else:
                os.close(os.open(f.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY))
        except OSError as e:
            problems.append(problem(f, e))
    if problems:
        raise StartFileError(problems)
