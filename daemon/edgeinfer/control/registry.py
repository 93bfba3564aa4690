"""The models a daemon serves, each verified, anti-rollback-checked and
reloaded on its own (control plane).

Loading a model here means: read its bundle's files once, verify the
signature on those bytes, check the anti-rollback floor, parse it (graph,
input, decoder). The lanes build and warm the ONNX Runtime sessions (lanes/process.py);
a reload is staged in every lane holding the model and committed only when
all of them warmed it. A refused reload keeps that model's old version
serving and touches no other model; the reason is recorded per model.

At start, a configured bundle that is refused is not the end of a model that
served before: the daemon starts on its last known-good bundle (knowngood.py),
verified again like any other, and says so in the log, in STATUS=, in /healthz
and in edgeinfer_model_known_good_fallback (RegisteredModel.fallback). Without a
known-good bundle the start fails with the refusal, as before.
"""
from __future__ import annotations

import logging
import os
import time

from edgeinfer.control.rollout import interrupted
from edgeinfer.models import providers
from edgeinfer.models.bundle import BundleError
from edgeinfer.models.knowngood import KnownGood
from edgeinfer.models.runtime import ModelRuntime
from edgeinfer.models.rollback import RollbackRefused, RollbackState, StateWriteError
from edgeinfer.models.check import check_bundle
from edgeinfer.models.verify import SignatureError

log = logging.getLogger("edgeinferd")

STATE_RETRY_S = 10.0  # seconds between attempts to write an anti-rollback record that failed
REASONS = ("signature", "rollback", "load")


class RegisteredModel:
    """One entry of `models:` and what is known of it."""

    def __init__(self, name: str, entry):
        self.name = name
        self.entry = entry
        self.provider = entry.provider.spec()  # the provider it serves on: as configured, or a promoted change
        self.runtime: ModelRuntime | None = None  # the verified, parsed version being served (no sessions here)
        self.target: str | None = None            # the bundle directory its path resolved to
        self.reloads = 0
        self.failures = {r: 0 for r in REASONS}
        self.last_error: str | None = None
        # Serving the last known-good bundle because the configured one was refused at start:
        # {"configured": the refused directory, "reason": why, "kind": a REASONS entry, "bundle": the one served}.
        self.fallback: dict | None = None
        # A rollout policy, and the configured bundle is not the proven one: the start serves the proven one, and
        # the configured bundle's rollout starts (again) once the lanes serve (control/rollout.py).
        self.pending_rollout = False

    @property
    def version(self) -> str | None:
        return self.runtime.version if self.runtime else None


class ModelRegistry:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rollback = RollbackState(cfg.model.state_dir)
        self.known_good = KnownGood(cfg.model.state_dir)
        self.serving = False  # set once the lanes serve: only then is a bundle known to be good
        self.unrecorded_good: dict[str, dict] = {}  # known-good entries not on disk yet, by model
        self.last_known_good_error: str | None = None
        self.served = {name: RegisteredModel(name, e) for name, e in cfg.model_entries().items()}
        self.unrecorded: dict[str, tuple[str, str]] = {}  # (family, version) accepted, not on disk yet, by model
        self.state_write_failures = 0
        self.last_state_error: str | None = None
        self._next_state_retry = 0.0

    def load(self, name: str, path: str | None = None, provider=None) -> ModelRuntime:
        """Verify → anti-rollback → parse the bundle of model `name` (or the one at `path`), to be served on
        `provider` (a ProviderSpec; default: the one it serves on). Raises BundleError."""
        model = check_bundle(path or self.served[name].entry.bundle, self.cfg.model.trust_dir,
                             self.cfg.model.size_limits(), self.rollback, log.error, self.cfg.runtime.max_sessions,
                             self.served[name].entry.batch)
        model.provider = provider or self.served[name].provider
        return model

    def choose(self, name: str) -> ModelRuntime:
        """The start's checks of model `name`: its configured bundle; if that is refused and the model served
        before, its last known-good bundle, verified again (signature, limits, anti-rollback floor, the model)
        and holding the model.onnx that served (RegisteredModel.fallback then says so). Raises BundleError: the
        refusal, and why there is nothing to fall back on when a known-good bundle is recorded."""
        m = self.served[name]
        m.fallback, m.pending_rollout = None, False
        try:
            configured = self.load(name)
        except BundleError as e:
            refused = e
        else:
            return self._proven(name, configured) if m.entry.rollout.policy != "immediate" else configured
        try:
            good = self.known_good.get(name)
        except BundleError as e:
            raise BundleError(f"{refused}; no fallback: {e}") from None
        try:
            configured = os.path.realpath(m.entry.bundle)
        except OSError:
            configured = m.entry.bundle
        if good is None or good["bundle"] == configured:
            raise refused  # never served, or the refused bundle is the known-good one itself
        said = f"{good['bundle']} ({good['name']} {good['version']})"
        try:
            model = self.load(name, good["bundle"])
        except BundleError as e:
            raise BundleError(f"{refused}; the last known-good bundle {said} is refused too: {e}") from None
        if model.bundle.sha256 != good["sha256"]:
            raise BundleError(f"{refused}; the last known-good bundle {said} is not what served: its model.onnx "
                              f"changed (sha256 {model.bundle.sha256[:16]}…, recorded {good['sha256'][:16]}…)")
        if m.entry.rollout.policy != "immediate":  # on the provider it was proven on (a reload rolls a change out)
            model.provider = providers.from_record(good) or model.provider
        m.fallback = {"configured": configured, "reason": str(refused), "kind": _reason(refused),
                      "bundle": good["bundle"]}
        log.error("model %s: the configured bundle %s refused: %s; STARTING ON THE LAST KNOWN-GOOD BUNDLE %s "
                  "instead: %s %s on %s (sha256 %s…, verified again). Fix the configured bundle (or point it at a "
                  "good one), then systemctl reload edgeinferd", name,
                  m.entry.bundle if configured == m.entry.bundle else f"{m.entry.bundle} (→ {configured})", refused,
                  good["bundle"], model.name, model.version, model.provider.said, model.bundle.sha256[:16])
        return model

    def _proven(self, name: str, configured: ModelRuntime) -> ModelRuntime:
        """Under a rollout policy, the start serves the proven version. The configured bundle is proven when it
        is the last known-good one, or its family's anti-rollback floor is its version (it was promoted; the
        known-good record may lag behind the floor), unless the last daemon left it under way as a candidate
        (rollouts.json); a model with no known-good record never served here, and its configured bundle serves.
        Otherwise the last known-good bundle serves, verified again, and the configured one's rollout is pending.
        Never the unproven candidate: if the proven bundle is refused now, the start fails with both reasons."""
        m = self.served[name]
        pending = interrupted(self.cfg.model.state_dir, name)
        candidate = pending is not None and pending.get("digest") == configured.bundle.digest and \
            providers.from_record(pending) == configured.provider  # (a record without one: the CPU)
        try:
            good = self.known_good.get(name)
            unreadable = None
        except BundleError as e:
            good, unreadable = None, e
        if not candidate:
            if good is None and unreadable is None:
                return configured
            if good is not None and (good["sha256"], good["version"]) == (configured.bundle.sha256,
                                                                          configured.version):
                return self._proven_provider(name, configured, good)
            if self.rollback.load().get(configured.meta.floor_family, {}).get("highest") == configured.version:
                return configured
        if good is None:
            raise BundleError(f"model {name}: the configured bundle {configured.name} {configured.version} has not "
                              f"passed its rollout (policy {m.entry.rollout.policy}), and there is no proven version "
                              f"to serve instead: {unreadable or 'no known-good record'}")
        said = f"{good['bundle']} ({good['name']} {good['version']})"
        try:
            model = self.load(name, good["bundle"])
        except BundleError as e:
            raise BundleError(f"model {name}: the configured bundle {configured.name} {configured.version} has not "
                              f"passed its rollout (policy {m.entry.rollout.policy}), and the proven version "
                              f"{said} is refused: {e}") from None
        if model.bundle.sha256 != good["sha256"]:
            raise BundleError(f"model {name}: the configured bundle {configured.name} {configured.version} has not "
                              f"passed its rollout, and the proven version {said} is not what served: its "
                              "model.onnx changed")
        model.provider = providers.from_record(good) or model.provider
        m.pending_rollout = True
        log.warning("model %s: the configured bundle %s (%s %s) has not passed its rollout (policy %s): serving the "
                    "proven version %s %s from %s; the rollout starts again once the lanes serve", name,
                    m.entry.bundle, configured.name, configured.version, m.entry.rollout.policy, model.name,
                    model.version, good["bundle"])
        return model

    def _proven_provider(self, name: str, configured: ModelRuntime, good: dict) -> ModelRuntime:
        """The proven bundle, on the provider it was proven on (the known-good record's) if the file names another:
        that one's rollout is then pending, as a bundle's is. A record from before providers names none: it served
        on the CPU. A damaged provider field: the configured provider serves."""
        proven = providers.from_record(good)
        if proven is None or proven == configured.provider:
            return configured
        log.warning("model %s: its configured provider %s has not passed its rollout (policy %s): serving %s %s on "
                    "%s, the provider it was proven on; the provider's rollout starts again once the lanes serve",
                    name, configured.provider.said, self.served[name].entry.rollout.policy, configured.name,
                    configured.version, proven.said)
        configured.provider = proven
        self.served[name].pending_rollout = True
        return configured

    def start(self, name: str) -> ModelRuntime:
        """choose() and accept() at start: a known-good fallback stays said until a reload serves the
        configured bundle, which is not tried again until it changes (or SIGHUP)."""
        model = self.choose(name)
        fallback = self.served[name].fallback
        self.accept(name, model)
        if fallback:
            self.served[name].fallback, self.served[name].target = fallback, fallback["configured"]
        return model

    def accept(self, name: str, model: ModelRuntime) -> None:
        m = self.served[name]
        m.runtime, m.target, m.last_error, m.fallback = model, model.target, None, None
        m.provider = model.provider
        self.unrecorded[name] = (model.meta.floor_family, model.version)
        self.unrecorded_good[name] = {"bundle": model.target, "sha256": model.bundle.sha256, "name": model.name,
                                      "version": model.version, **providers.to_record(model.provider)}
        self.record_accepted()

    def unchanged(self, name: str, model: ModelRuntime) -> None:
        """A reload found the configured bundle holding the model being served: nothing to swap. If that is
        the last known-good one the start fell back on, the configured bundle is good again."""
        m = self.served[name]
        m.target = model.target
        if m.fallback:
            log.info("model %s: the configured bundle %s is the one served (%s %s): no longer on the last "
                     "known-good fallback", name, m.entry.bundle, model.name, model.version)
            m.fallback = None

    def refuse(self, name: str, e: Exception) -> None:
        m = self.served[name]
        reason = _reason(e)
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
        """Raises each anti-rollback floor to the served version and, once the lanes serve, records the
        known-good bundles. A full or read-only state directory must not stop a verified model from
        serving: logged, counted, retried every STATE_RETRY_S."""
        good = self.serving and self.unrecorded_good
        if not (self.unrecorded or good) or (not force and time.monotonic() < self._next_state_retry):
            return  # a write failed less than STATE_RETRY_S ago: retried then (a success waits for nothing)
        for name, (family, version) in list(self.unrecorded.items()):
            try:
                self.rollback.accept(family, version)
            except StateWriteError as e:
                self._next_state_retry = time.monotonic() + STATE_RETRY_S
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
        if good:
            self._record_known_good()

    def _record_known_good(self) -> None:
        try:
            self.known_good.record(self.unrecorded_good)
        except (BundleError, OSError) as e:
            said = str(e) if isinstance(e, BundleError) else (
                f"{self.known_good.path}: cannot write the record of the last known-good bundles "
                f"({e.strerror or e}); the previous record is unchanged")
            self._next_state_retry = time.monotonic() + STATE_RETRY_S
            self.state_write_failures += 1
            if self.last_known_good_error != said:
                log.error("%s; serving on (a start that refuses a configured bundle falls back on the previous "
                          "record until the write succeeds)", said)
            self.last_known_good_error = said
            return
        if self.last_known_good_error:
            log.info("known-good record written: %s", ", ".join(
                f"{n} {e['name']} {e['version']}" for n, e in sorted(self.unrecorded_good.items())))
        self.unrecorded_good.clear()
        self.last_known_good_error = None

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


def _reason(e: Exception) -> str:
    """The REASONS entry of a refusal."""
    return "signature" if isinstance(e, SignatureError) else "rollback" if isinstance(e, RollbackRefused) else "load"
