"""Anti-rollback: the highest accepted version of every model family, kept in
the state directory. A model's family is the `family` of its model.yaml, by
default its name, so a model renamed in a later version keeps its floor when
its bundles keep the family (bundles signed before the field existed: family =
name). An older version is refused unless the operator allowed that exact
version (`edgeinferctl model allow-downgrade FAMILY VERSION`).

The state file maps family → {"highest": version}; one written before families
existed is keyed by name, which is the family of every bundle without one.

The state file is replaced atomically (temp file, fsync, rename, fsync of the
directory): a crash mid-write leaves the old or the new content, never a mix.
It keeps its owner, group and mode whoever writes it (statefile.py): run as
root, `allow-downgrade` leaves it the daemon's.
"""
from __future__ import annotations

import os

from packaging.version import InvalidVersion, Version

from edgeinfer.models.bundle import BundleError
from edgeinfer.support.statefile import read_json, write_json

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


class RollbackState:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, STATE_FILE)

    def load(self) -> dict:
        try:
            data = read_json(self.path)
        except (OSError, ValueError) as e:
            # Fail closed: without the record we cannot tell a rollback from an upgrade.
            raise BundleError(f"{self.path}: unreadable anti-rollback state ({e}); fix or remove it") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise BundleError(f"{self.path}: unreadable anti-rollback state (not a JSON object)")
        return data

    def check(self, family: str, version: str, where: str, name: str | None = None) -> None:
        """Refuses `version` of the model `name` (default: the family) if its family accepted a newer one."""
        entry = self.load().get(family)
        if not entry:
            return
        highest = entry.get("highest")
        if highest and _version(version, where) < _version(highest, self.path) and entry.get("allow") != version:
            model = f"'{name}' (family '{family}')" if name and name != family else f"'{family}'"
            raise RollbackRefused(
                f"{where}: version {version} of model {model} is older than the accepted {highest}: rollback "
                f"refused (to allow it: edgeinferctl model allow-downgrade {family} {version})")

    def accept(self, family: str, version: str) -> None:
        """Records `version` as accepted: it becomes the family's floor (also after an allowed downgrade)."""
        state = self.load()
        entry = state.get(family) or {}
        highest = entry.get("highest")
        if entry.get("allow") == version or not highest or Version(version) >= Version(highest):
            state[family] = {"highest": version}
        else:
            return
        self._save(state)

    def allow_downgrade(self, family: str, version: str) -> None:
        _version(version, "allow-downgrade")
        state = self.load()
        entry = dict(state.get(family) or {})
        entry["allow"] = version
        state[family] = entry
        self._save(state)

    def _save(self, state: dict) -> None:
        try:
            write_json(self.path, state)
        except OSError as e:
            raise StateWriteError(f"{self.path}: cannot write the anti-rollback state ({e.strerror or e}); "
                                  f"the previous record is unchanged") from None
