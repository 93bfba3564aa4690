"""Reloading models while serving: bundle by bundle, each swapped between two frames or refused alone.

A reload (SIGHUP, `systemctl reload`, or the bundle watch when a model's path
moves) verifies each bundle again (registry.py: signature, anti-rollback,
limits), loads it in every lane that holds the model next to the version being
served, for the geometries in use and those declared, and swaps it in. Any
failure leaves that model's old version serving; no other model is touched.
The configuration itself applies on restart only, but for each model's
`provider`: a SIGHUP reload takes a changed one as a new version of the model
(the same bundle on another provider, proven under its rollout policy like
one). A file that changed otherwise since the start is said, with what changed.
"""
from __future__ import annotations

import logging
from typing import Callable

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import Geometry
from edgeinfer.control.rollout import Rollouts
from edgeinfer.models.bundle import BundleError
from edgeinfer.support.memtrim import DeferredTrim

log = logging.getLogger("edgeinferd")


def declared_geometries(cfg, model: str) -> list:
    """The frame geometries the configuration declares for `model`'s streams (their sessions are built at start)."""
    return sorted({Geometry(s.pixel_format, s.height, s.width) for s in cfg.all_streams()
                   if s.width is not None and cfg.model_of(s) == model})


class Reloader:
    def __init__(self, cfg, config_path: str | None, *, models, lanes, streams: list, notifier, trim: DeferredTrim,
                 status_line: Callable[[], str], rollouts: Rollouts):
        """models: the registry; lanes: the Supervisor; streams: every Stream (their result rings' capacity);
        notifier: sd_notify (RELOADING=1 … READY=1); trim: scheduled after a swap; status_line: STATUS= after;
        rollouts: where a model with a rollout policy takes its new version (rollout.py)."""
        self.cfg, self.config_path = cfg, config_path
        self.models, self.lanes, self.streams, self.notifier, self.trim = models, lanes, streams, notifier, trim
        self.status_line = status_line
        self.rollouts = rollouts

    def reload(self, only_moved: bool = False) -> dict[str, bool]:
        """RELOADING=1 … READY=1 around reloading every model whose bundle changed (SIGHUP: re-read each;
        only_moved: those whose path now resolves elsewhere). {model: accepted} of those tried."""
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={ring.monotonic_ns() // 1000}",
                           "STATUS=reloading model bundles")
        now = None if only_moved else self._read_config()
        moved = self._provider_changes(now) if now is not None else {}
        if now is not None:
            self._say_config_changes(now)
        try:
            return {name: self._reload(name, moved.get(name)) for name in self.models.served
                    if not only_moved or self.models.changed(name)}
        finally:
            self.notifier.send("READY=1", "STATUS=" + self.status_line())

    def _read_config(self):
        """The configuration file as it is now; None (said) if there is none or it does not load."""
        if not self.config_path:
            return None
        from edgeinfer.config.schema import ConfigError, load_config
        try:
            return load_config(self.config_path)
        except (ConfigError, OSError) as e:
            log.error("reload: %s: a restart would fail, serving on with the configuration of the start: %s",
                      self.config_path, e)
            return None

    def _provider_changes(self, now) -> dict:
        """{model: its provider as the file names it now (a ProviderSpec)} where that is not the one it serves on."""
        entries = now.model_entries()
        return {name: spec for name, m in self.models.served.items() if name in entries
                and (spec := entries[name].provider.spec()) != m.provider}

    def _say_config_changes(self, now) -> None:
        """A reload reloads model bundles (and providers) only: the rest of the configuration (its streams above
        all) applies on restart. A file that changed since the start is said, with what changed and what to do, so
        that a stream added for a new camera is not silently left unserved."""
        old_streams, new_streams = ({s.name: s for s in c.streams} for c in (self.cfg, now))
        added = sorted(new_streams.keys() - old_streams.keys())
        removed = sorted(old_streams.keys() - new_streams.keys())
        changed = sorted(n for n in old_streams.keys() & new_streams.keys() if old_streams[n] != new_streams[n])
        models_now = {n: e.model_copy(update={"provider": self.cfg.model_entries()[n].provider})
                      for n, e in now.model_entries().items() if n in self.cfg.model_entries()}
        sections = [k for k in type(now).model_fields if k not in ("streams", "models")
                    and getattr(now, k) != getattr(self.cfg, k)]
        if models_now != {n: e for n, e in self.cfg.model_entries().items() if n in models_now} or \
                set(now.model_entries()) != set(self.cfg.model_entries()):
            sections.append("models (other than their provider)")
        if not (added or removed or changed or sections):
            return
        what = "; ".join(f"{label}: {', '.join(names)}" for label, names in (
            ("streams added", added), ("streams removed", removed), ("streams changed", changed),
            ("sections changed", sections)) if names)
        log.warning("reload: %s changed since the start (%s): a reload reloads model bundles and providers only; streams and the "
                    "other settings change only on restart: systemctl restart edgeinferd (cameras keep their rings "
                    "and connections across it)", self.config_path, what)

    def resume(self) -> None:
        """After the start: the rollout of every model whose start served its proven version instead of the
        configured candidate (registry.py) starts again."""
        for name, served in self.models.served.items():
            if served.pending_rollout:
                served.pending_rollout = False
                configured = served.entry.provider.spec()
                self._reload(name, configured if configured != served.provider else None)

    def _reload(self, name: str, provider=None) -> bool:
        """Verify → load in every lane holding it, next to the serving version → swap between two frames, or (a
        rollout policy) start its rollout. provider: the ProviderSpec the file names now, if it is not the one
        served (the same bundle on it is then the new version). On any failure this model's old version keeps
        serving; no other model is touched."""
        served = self.models.served[name]
        old = served.runtime
        rollouts = self.rollouts
        going = rollouts.under_way(name)
        rollout = served.entry.rollout.policy != "immediate"
        try:
            new = self.models.load(name, provider=provider)
            if _same(new, old):
                self.models.unchanged(name, new)
                if going is not None:
                    rollouts.abort(name, "the configured bundle is the serving version again")
                return True  # unchanged: nothing to do
            if going is not None and _same(new, going.model):
                served.target = new.target
                return True  # its rollout is under way
            if going is not None:
                rollouts.abort(name, f"superseded by {new.name} {new.version} ({new.target})")
            geometries = self._geometries(name)
            if rollout:
                rollouts.check(name, new, old, geometries)
            if new.provider != old.provider:
                log.info("model %s: provider %s → %s (%s %s): %s", name, old.provider.said, new.provider.said,
                         new.name, new.version, f"a candidate under rollout policy {served.entry.rollout.policy}"
                         if rollout else "swapped in once its sessions are built (rollout policy immediate)")
                self.lanes.load_provider(name, new.provider)
            self._stage(name, new, geometries, on_its_provider=new.provider != old.provider)
        except (BundleError, OSError) as e:
            self.models.refuse(name, e)
            return False
        if rollout:  # the candidate waits for its gates (rollout.py); the floor has not moved
            served.target = new.target
            rollouts.begin(name, new, old, geometries)
            return True
        self.lanes.commit(name, new)
        self.models.accept(name, new)
        served.reloads += 1
        self.trim.schedule()
        log.info("model %s: reloaded: now serving %s %s on %s (was %s %s on %s)", name, new.name, new.version,
                 new.provider.said, old.name, old.version, old.provider.said)
        return True

    def _geometries(self, name: str) -> list:
        """The frame geometries a new version is staged for: those in use and those declared (the most recent
        max_sessions of them)."""
        return sorted(set(self.lanes.geometries_attached(name))
                      | set(declared_geometries(self.cfg, name)))[-self.cfg.runtime.max_sessions:]

    def _stage(self, name: str, new, geometries: list, on_its_provider: bool = False) -> None:
        """`new` built and warmed in every lane holding `name`, beside what it serves; BundleError otherwise."""
        need = new.decoder.payload_capacity
        small = {s.name: s.writer.payload_capacity for s in self.streams
                 if s.model == name and s.writer.payload_capacity < need}
        if small:  # result rings are made once, at start: a record that does not fit is never cut short
            raise BundleError(f"{new.bundle.path}: its results take up to {need} bytes per record, more than "
                              f"the result rings of {', '.join(small)} hold ({min(small.values())}); restart "
                              "edgeinferd to serve it")
        errors = self.lanes.stage(name, new, geometries, on_its_provider=on_its_provider)
        if errors:
            raise BundleError("; ".join(f"{lane}: {e}" for lane, e in errors.items()))


def _same(a, b) -> bool:
    """The same model.onnx and model.yaml, on the same provider."""
    return a.bundle.sha256 == b.bundle.sha256 and a.bundle.meta == b.bundle.meta and a.provider == b.provider
