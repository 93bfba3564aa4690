"""The models a daemon serves, each verified, anti-rollback-checked and
reloaded on its own (control plane).

Loading a model here means: read its bundle's files once, verify the
signature on those bytes, check the anti-rollback floor, parse it (graph,
input, decoder). The lanes build and warm the ONNX Runtime sessions (lane.py);
a reload is staged in every lane holding the model and committed only when
all of them warmed it. A refused reload keeps that model's old version
serving and touches no other model; the reason is recorded per model.
"""
from __future__ import annotations

import logging
import os
import time

from edgeinfer.model import ModelRuntime
from edgeinfer.rollback import RollbackRefused, RollbackState, StateWriteError
from edgeinfer.bundlecheck import check_bundle
from edgeinfer.signing import SignatureError

log = logging.getLogger("edgeinferd")

STATE_RETRY_S = 10.0  # seconds between attempts to write an anti-rollback record that failed
REASONS = ("signature", "rollback", "load")


class ServedModel:
    """One entry of `models:` and what is known of it."""

    def __init__(self, name: str, entry):
        self.name = name
        self.entry = entry
        self.runtime: ModelRuntime | None = None  # the verified, parsed version being served (no sessions here)
        self.target: str | None = None            # the bundle directory its path resolved to
        self.reloads = 0
        self.failures = {r: 0 for r in REASONS}
        self.last_error: str | None = None

    @property
    def version(self) -> str | None:
        return self.runtime.version if self.runtime else None


class Models:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rollback = RollbackState(cfg.model.state_dir)
        self.served = {name: ServedModel(name, e) for name, e in cfg.model_entries().items()}
        self.unrecorded: dict[str, tuple[str, str]] = {}  # (family, version) accepted, not on disk yet, by model
        self.state_write_failures = 0
        self.last_state_error: str | None = None
        self._next_state_retry = 0.0

    def load(self, name: str) -> ModelRuntime:
        """Verify → anti-rollback → parse the bundle of model `name`. Raises BundleError."""
        return check_bundle(self.served[name].entry.bundle, self.cfg.model.trust_dir, self.cfg.model.size_limits(),
                            self.rollback, log.error, self.cfg.runtime.max_sessions, self.served[name].entry.batch)

    def accept(self, name: str, model: ModelRuntime) -> None:
        m = self.served[name]
        m.runtime, m.target, m.last_error = model, model.target, None
        self.unrecorded[name] = (model.meta.floor_family, model.version)
        self.record_accepted()

    def refuse(self, name: str, e: Exception) -> None:
        m = self.served[name]
        reason = ("signature" if isinstance(e, SignatureError) else
                  "rollback" if isinstance(e, RollbackRefused) else "load")
        m.failures[reason] += 1
        m.last_error = str(e)
        try:  # do not retry the same refused target until it changes again
            m.target = os.path.realpath(m.entry.bundle)
        except OSError:
            pass
        log.error("model %s: reload refused, still serving %s %s: %s", name,
                  m.runtime.name if m.runtime else "-", m.version or "-", e)

    def changed(self, name: str) -> bool:
        """The model's configured path now resolves to another directory (a `current` symlink flipped)."""
        try:
            return os.path.realpath(self.served[name].entry.bundle) != self.served[name].target
        except OSError:
            return False

    def record_accepted(self, force: bool = False) -> None:
        """Raises each anti-rollback floor to the served version. A full or read-only state directory must
        not stop a verified model from serving: logged, counted, retried every STATE_RETRY_S."""
        if not self.unrecorded or (not force and time.monotonic() < self._next_state_retry):
            return
        self._next_state_retry = time.monotonic() + STATE_RETRY_S
        for name, (family, version) in list(self.unrecorded.items()):
            try:
                self.rollback.accept(family, version)
            except StateWriteError as e:
                self.state_write_failures += 1
                if self.last_state_error != str(e):
                    log.error("%s; serving %s %s anyway (the floor is not raised until the write succeeds)", e,
                              family, version)
                self.last_state_error = str(e)
                return
            del self.unrecorded[name]
            if self.last_state_error:
                log.info("anti-rollback state written: %s %s recorded", family, version)
        self.last_state_error = None

    @property
    def reload_failures(self) -> dict[str, int]:
        out = {r: 0 for r in REASONS}
        for m in self.served.values():
            for r, n in m.failures.items():
                out[r] += n
        return out

    @property
    def reloads(self) -> int:
        return sum(m.reloads for m in self.served.values())

    @property
    def last_reload_error(self) -> str | None:
        errors = [f"{m.name}: {m.last_error}" for m in self.served.values() if m.last_error]
        return "; ".join(errors) or None
