"""Label names for `edgeinferctl results`: the labels of the bundle that produced a record.

A record names its model and version; the labels come from that bundle's model.yaml,
found through the daemon's configuration (or a bundle given by hand). Only model.yaml is
read, and only for display: a label set is used only for records whose model name and
version match it, so a reload never prints the old version's names on the new one's ids.

The configured path is not always the bundle being served: after a refused reload (or a start on
the last known-good bundle) `current` points at a bundle the daemon refused while it serves the
one before. So a record whose version the configured bundle is not is looked up in the bundles
beside it: the directories next to the configured path and next to its target (the deploy
layout, models/current -> models/NAME-VERSION), at most MAX_SIBLINGS of each.
"""
from __future__ import annotations

import os

from edgeinfer.models.bundle import META_FILE, BundleError, ModelMeta, OpenBundle
from edgeinfer.support.yamlconf import ConfigError, load_yaml_model

MAX_SIBLINGS = 256  # bundles looked at beside a configured one (a directory of versions)


def read_meta(bundle: str) -> ModelMeta:
    """model.yaml of a bundle directory (size-limited like every bundle read; not signature-checked)."""
    with OpenBundle(bundle) as opened:
        text = opened.read(META_FILE)
    try:
        return load_yaml_model(ModelMeta, text.decode("utf-8"), os.path.join(bundle, META_FILE))
    except (UnicodeDecodeError, ConfigError) as e:
        raise BundleError(str(e)) from None


class LabelSource:
    """Labels by (model name, version), looked up again when a record names a version not seen yet."""

    def __init__(self, bundles: list[str] | None = None, config: str | None = None, warn=print):
        self.bundles, self.config, self.warn = bundles or [], config, warn
        self._known: dict[tuple[str, str], list[str]] = {}
        self._missing: set[tuple[str, str]] = set()  # warned once each

    def _candidates(self) -> list[tuple[str, bool]]:
        """(bundle directory, given: a problem reading it is said) of the bundles given, else of the configured
        ones and then the bundles beside them."""
        if self.bundles:
            return [(b, True) for b in self.bundles]
        from edgeinfer.config.schema import load_config
        configured = [e.bundle for e in load_config(self.config).model_entries().values()]
        out, seen = [], set()

        def add(path: str, given: bool) -> None:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                out.append((path, given))
        for b in configured:
            add(b, True)
        for b in configured:
            for parent in dict.fromkeys((os.path.dirname(os.path.abspath(b)), os.path.dirname(os.path.realpath(b)))):
                try:
                    names = sorted(os.listdir(parent))[:MAX_SIBLINGS]
                except OSError:
                    continue
                for n in names:
                    if os.path.isfile(os.path.join(parent, n, META_FILE)):
                        add(os.path.join(parent, n), False)
        return out

    def labels(self, model: str, version: str) -> list[str] | None:
        key = (model, version)
        if key in self._known:
            return self._known[key]
        if key in self._missing:
            return None
        problems = []
        try:
            for bundle, given in self._candidates():
                try:
                    meta = read_meta(bundle)
                except (BundleError, OSError) as e:
                    if given:
                        problems.append(str(e))
                    continue
                self._known.setdefault((meta.name, meta.version), list(meta.labels))  # the configured first
                if key in self._known:
                    break
        except (ConfigError, OSError) as e:
            problems.append(str(e))
        if key in self._known:
            return self._known[key]
        self._missing.add(key)
        where = ", ".join(self.bundles) if self.bundles else self.config
        self.warn(f"no labels for {model} {version} in {where}: class ids only"
                  + (f" ({'; '.join(problems)})" if problems else ""))
        return None
