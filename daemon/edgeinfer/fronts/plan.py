"""What the gateway serves: its configuration joined with the daemon's (pools, models, sockets).

For every model it serves: the pool whose streams it produces and reads, the
frame sizes it accepts (and which of the pool's streams serve which size), the
pixel format clients send, how many requests may wait for a ring, and the
pool's max_age (the longest deadline a request can have: a frame still waiting
at its deadline is stale to the daemon, so it is never run). Everything that
does not fit is an error at start, naming the key to change.
"""
from __future__ import annotations

import dataclasses
import os
import pwd

from edgeinfer.config.identity import user_id
from edgeinfer.config.labels import read_meta
from edgeinfer.config.schema import Config
from edgeinfer.fronts.gatewayconfig import GatewayConfig
from edgeinfer.models.bundle import BundleError


class PlanError(ValueError):
    """The two configurations do not fit together; the message says which key to change."""


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    name: str                    # the model's name under edgeinferd.yaml `models:`
    pool: str
    kind: str                    # the decoder's type (classification, detection, raw, ...)
    input_size: tuple[int, int]  # the model's own input (width, height)
    sizes: tuple[tuple[int, int], ...]           # accepted (width, height), in order
    streams: dict[tuple[int, int], tuple[str, ...]]  # size → the pool's streams serving it
    pixel_format: str
    max_waiting: int             # requests waiting for a ring of one size, beyond those in flight
    max_age_ms: float            # the pool's streams' max_age_ms
    bundle: str                  # the configured bundle (labels, defaults)


def make_plan(gw: GatewayConfig, daemon_cfg: Config, uid: int | None = None) -> dict[str, ModelPlan]:
    uid = os.geteuid() if uid is None else uid
    ours = {name: pool for name, pool in (daemon_cfg.pools or {}).items() if user_id(pool.user) == uid}
    entries = daemon_cfg.model_entries()
    who = _user_name(uid)
    if not ours:
        raise PlanError(f"{gw.daemon_config} has no pool for user {who}: add one, e.g. pools: {{gateway: "
                        f"{{model: MODEL, user: {who}, streams: 4}}}}, and restart edgeinferd")
    by_model: dict[str, list[str]] = {}
    for name, pool in ours.items():
        by_model.setdefault(pool.model or next(iter(entries)), []).append(name)
    # Every model with a pool of ours is served; `models:` sets how (and names a model whose pool is missing).
    wanted = {**{m: None for m in by_model}, **gw.models}
    plans = {}
    for model, front in wanted.items():
        if model not in entries:
            raise PlanError(f"models.{model}: no such model in {gw.daemon_config} (models: {', '.join(sorted(entries))})")
        pools = by_model.get(model, [])
        pool = front.pool if front is not None and front.pool else None
        if pool is None:
            if len(pools) != 1:
                raise PlanError(f"models.{model}: " + (f"no pool of user {who} serves it in {gw.daemon_config}" if not
                                pools else f"pools {', '.join(pools)} serve it: name one (pool: NAME)"))
            pool = pools[0]
        elif pool not in ours:
            raise PlanError(f"models.{model}.pool: {pool} is not a pool of user {who} in {gw.daemon_config}")
        elif pool not in pools:
            raise PlanError(f"models.{model}.pool: pool {pool} serves model {ours[pool].model}, not {model}")
        bundle = entries[model].bundle
        try:
            meta = read_meta(bundle)
        except (BundleError, OSError) as e:
            raise PlanError(f"model {model}: cannot read its bundle's model.yaml: {e}") from None
        input_size = (meta.input.width, meta.input.height)
        sizes = tuple(front.size_list()) if front is not None and front.sizes else (input_size,)
        names = ours[pool].stream_names(pool)
        if len(names) < len(sizes):
            raise PlanError(f"models.{model}.sizes: {len(sizes)} sizes need at least as many streams; pool {pool} "
                            f"has {len(names)} (pools.{pool}.streams in {gw.daemon_config})")
        if len(sizes) > daemon_cfg.runtime.max_sessions:
            raise PlanError(f"models.{model}.sizes: {len(sizes)} sizes, more than the daemon's runtime.max_sessions "
                            f"({daemon_cfg.runtime.max_sessions}) sessions per model")
        streams = {size: tuple(names[i::len(sizes)]) for i, size in enumerate(sizes)}
        if gw.grpc.max_deadline_ms > ours[pool].max_age_ms:
            raise PlanError(f"grpc.max_deadline_ms ({gw.grpc.max_deadline_ms}) is above pool {pool}'s max_age_ms "
                            f"({ours[pool].max_age_ms:g}): raise pools.{pool}.max_age_ms in {gw.daemon_config}")
        waiting = front.max_waiting if front is not None and front.max_waiting is not None else len(names)
        plans[model] = ModelPlan(model, pool, meta.decoder.type, input_size, sizes, streams,
                                 front.pixel_format if front is not None else "rgb24", waiting,
                                 ours[pool].max_age_ms, bundle)
    return plans


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
