"""Anti-rollback: the highest accepted version of every model name, kept in the
state directory. An older version is refused unless the operator allowed that
exact version (`edgeinferctl model allow-downgrade NAME VERSION`).

The state file is replaced atomically (temp file, fsync, rename, fsync of the
directory): a crash mid-write leaves the old or the new content, never a mix.
"""
from __future__ import annotations

import json
import os
import tempfile

from packaging.version import InvalidVersion, Version

from edgeinfer.bundle import BundleError

STATE_FILE = "model-versions.json"


class StateWriteError(BundleError):
    """The state file could not be written; the previous record is unchanged."""


class RollbackRefused(BundleError):
    """An older version than the one installed, not explicitly allowed."""


def _version(v: str, where: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        raise BundleError(f"{where}: version {v!r} is not a comparable version") from None


def write_atomically(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # the rename itself is durable
    finally:
        os.close(dfd)


class RollbackState:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, STATE_FILE)

    def load(self) -> dict:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            # Fail closed: without the record we cannot tell a rollback from an upgrade.
            raise BundleError(f"{self.path}: unreadable anti-rollback state ({e}); fix or remove it") from None
        if not isinstance(data, dict):
            raise BundleError(f"{self.path}: unreadable anti-rollback state (not a JSON object)")
        return data

    def check(self, name: str, version: str, where: str) -> None:
        entry = self.load().get(name)
        if not entry:
            return
        highest = entry.get("highest")
        if highest and _version(version, where) < _version(highest, self.path) and entry.get("allow") != version:
            raise RollbackRefused(
                f"{where}: version {version} of model '{name}' is older than the accepted {highest}: rollback refused "
                f"(to allow it: edgeinferctl model allow-downgrade {name} {version})")

    def accept(self, name: str, version: str) -> None:
        """Records `version` as accepted: it becomes the floor (also after an allowed downgrade)."""
        state = self.load()
        entry = state.get(name) or {}
        highest = entry.get("highest")
        if entry.get("allow") == version or not highest or Version(version) >= Version(highest):
            state[name] = {"highest": version}
        else:
            return
        self._save(state)

    def allow_downgrade(self, name: str, version: str) -> None:
        _version(version, "allow-downgrade")
        state = self.load()
        entry = dict(state.get(name) or {})
        entry["allow"] = version
        state[name] = entry
        self._save(state)

    def _save(self, state: dict) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_atomically(self.path, json.dumps(state, indent=1, sort_keys=True).encode() + b"\n")
        except OSError as e:
            raise StateWriteError(f"{self.path}: cannot write the anti-rollback state ({e.strerror or e}); "
                                  f"the previous record is unchanged") from None
