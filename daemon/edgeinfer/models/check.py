"""The checks a model bundle passes before anything serves it, in one place.

edgeinferd (start-up, reload, --verify-only) and `edgeinferctl model verify`
run this same function, so the tool refuses exactly what the daemon would,
with the same message: the trust store's entries, the signature, the size
limits, the anti-rollback floor of the model's family, and the model itself
(the graph's input against model.yaml's geometry and layout, and the decoder
against the graph's outputs).
"""
from __future__ import annotations

import os
from typing import Callable

from edgeinfer.models.bundle import SizeLimits
from edgeinfer.models.runtime import ModelRuntime
from edgeinfer.models.rollback import RollbackState
from edgeinfer.models.verify import TrustStore, load_verified_bundle


def check_bundle(path: str, trust_dir: str, limits: SizeLimits = SizeLimits(),
                 rollback: RollbackState | None = None, warn: Callable[[str], None] = lambda _: None,
                 max_sessions: int = 8, batch: int = 1) -> ModelRuntime:
    """Verify → anti-rollback (when `rollback` is given) → the model's own checks. Returns the model, ready
    to be fused and served; raises BundleError (with the file and the reason). `warn` hears each
    trust-store entry that is not trusted (a refusal then names them too)."""
    trust = TrustStore(trust_dir)
    for refused in trust.refused:  # loudly, at every load: an operator's key may be among them
        warn(f"trust store entry refused, not trusted: {refused}")
    bundle, signer = load_verified_bundle(path, trust, limits)
    meta = bundle.meta
    if rollback is not None:
        rollback.check(meta.floor_family, meta.version, os.path.join(path, "model.yaml"), meta.name)
    model = ModelRuntime(bundle, max_sessions=max_sessions, batch=batch)
    model.signer, model.target = signer, os.path.realpath(path)
    return model
