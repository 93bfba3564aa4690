"""The last known-good bundle of every model, kept in the state directory.

When a model's configured bundle is refused at start (not signed by a trusted key, under the anti-rollback
floor, a model that does not load), a daemon that served that model before starts on the bundle it last
served instead of serving nothing, and says so (control/registry.py). What is remembered is where that bundle was
and what it was: known-good.json maps the configuration's model name to

    {"bundle": "/var/lib/edgeinfer/models/foo-1.2", "sha256": "<model.onnx>", "name": "foo", "version": "1.2"}

written once the model serves (at start, after the lanes run; at every accepted reload). The record is no
trust: at start the bundle it names is verified again like any other (signature, size limits, the
anti-rollback floor, the model's own checks) and must still hold the same model.onnx (sha256). The bundle
path is the directory the configured path resolved to (a `current` symlink's target), never the symlink.

The file is replaced atomically and keeps the daemon's owner whoever writes it (statefile.py).
"""
from __future__ import annotations

import os

from edgeinfer.models.bundle import BundleError
from edgeinfer.support.statefile import read_json, write_json

STATE_FILE = "known-good.json"
FIELDS = ("bundle", "sha256", "name", "version")


class KnownGood:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, STATE_FILE)

    def load(self) -> dict[str, dict]:
        try:
            data = read_json(self.path)
        except (OSError, ValueError) as e:
            raise BundleError(f"{self.path}: unreadable record of the last known-good bundles ({e}); fix or "
                              "remove it") from None
        if data is None:
            return {}
        if not isinstance(data, dict) or not all(
                isinstance(v, dict) and all(isinstance(v.get(k), str) for k in FIELDS) for v in data.values()):
            raise BundleError(f"{self.path}: unreadable record of the last known-good bundles (not what this "
                              f"daemon writes: {{model: {{{', '.join(FIELDS)}}}}}); fix or remove it")
        return data

    def get(self, model: str) -> dict | None:
        return self.load().get(model)

    def record(self, entries: dict[str, dict]) -> None:
        """Sets each model's entry (others are kept). Raises BundleError if the file is unreadable (not
        overwritten: it is looked at), OSError if it cannot be written (the previous record unchanged)."""
        state = self.load()
        if all(state.get(m) == e for m, e in entries.items()):
            return
        state.update(entries)
        write_json(self.path, state)
