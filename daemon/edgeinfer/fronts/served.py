"""The models a gateway serves, whatever the protocol: each request to its rings and back.

`ServedModels` holds, per model, a `SizePool` per accepted frame size (pool.py),
the version last seen serving it, its outputs as last seen, and whether it is
ready (a warm-up frame came back through the daemon). A front checks its
protocol's framing, then calls `infer()`, which finds the rings of the frame's
size (INVALID_ARGUMENT naming the accepted sizes otherwise), takes a free one
or waits its turn, runs the frame through the daemon and returns the record.
The keeper (`keep()`, a thread of the gateway) reconnects rings after a daemon
restart and warms each model once it is reachable.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from edgeinfer.abi import ring
from edgeinfer.abi.payloads import PayloadError
from edgeinfer.config.labels import LabelSource
from edgeinfer.fronts.outputs import OutputTensor, outputs_of
from edgeinfer.fronts.plan import ModelPlan
from edgeinfer.fronts.pool import HOLD_NS_START, PROBE_RETRY_MAX_S, FrontError, SizePool, Slot, Timing

log = logging.getLogger("edgeinfer-gateway")

WARMUP_DEADLINE_S = 30.0  # the first frame of a model: the lanes may build its session for the size first


class ServedModel:
    def __init__(self, plan: ModelPlan, pools: dict[tuple[int, int], SizePool]):
        self.plan = plan
        self.pools = pools
        self.version: str | None = None       # the version that answered last
        self.outputs: list[OutputTensor] | None = None  # as last answered (a tensors model's metadata)
        self.warm = False                     # a warm-up frame came back through the daemon
        self.warm_error: str | None = None

    @property
    def ready(self) -> bool:
        """Warm, and every size's rings are connected to edgeinferd now."""
        return self.warm and all(p.connected for p in self.pools.values())

    @property
    def sizes_said(self) -> str:
        return ", ".join(f"{w}x{h}" for w, h in self.plan.sizes)


class ServedModels:
    def __init__(self, plans: dict[str, ModelPlan], *, ingress_socket: str, results_socket: str,
                 labels: LabelSource):
        self.labels = labels
        self.served: dict[str, ServedModel] = {}
        self._slots: list[Slot] = []  # every ring made, for close()
        try:
            for name, plan in plans.items():
                pools = {}
                for size, streams in plan.streams.items():
                    slots = []
                    for stream in streams:
                        slots.append(Slot(stream, size[0], size[1], plan.pixel_format, plan.max_age_ms,
                                          ingress_socket=ingress_socket, results_socket=results_socket))
                        self._slots.append(slots[-1])
                    pools[size] = SizePool(slots, plan.max_waiting)
                self.served[name] = ServedModel(plan, pools)
        except BaseException:
            self.close()
            raise
        self._pools: list[SizePool] = [p for m in self.served.values() for p in m.pools.values()]
        if self._slots:  # the probe: reconnects often while edgeinferd is away; the others follow it (keep())
            self._slots[0].reader.retry_max = PROBE_RETRY_MAX_S
        self._attached = self._attach_count()

    def _attach_count(self) -> int:
        return sum(s.reader.attach_count for s in self._slots)

    def full(self) -> bool:
        """Every size of every model would shed a request now (read without locks): a request to infer is refused at
        its HEADERS, before its message is read (whichever model it names, it would be shed)."""
        return all(p.full for m in self.served.values() for p in m.pools.values())

    def retry_ms(self) -> int:
        """The retry hint of a request refused because every model is full: the soonest any size has room."""
        return min((p.retry_ms() for m in self.served.values() for p in m.pools.values()), default=1)

    def hopeless(self, budget_ns: int) -> bool:
        """A request with this much time left could not be answered in time by any size of any model now (each would
        make it wait longer than that; read without locks): it is refused at its HEADERS."""
        for p in self._pools:
            if p.wait_ns() <= budget_ns:
                return False
        return bool(self._pools)

    def largest_frame_bytes(self) -> int:
        """The largest frame any ring takes (the gRPC front's message limit is derived from it)."""
        return max(s.frame_bytes for s in self._slots)

    def get(self, name: str) -> ServedModel:
        m = self.served.get(name)
        if m is None:
            raise FrontError("NOT_FOUND", f"no model {name!r} is served here (models: {', '.join(sorted(self.served))})",
                             "unknown_model")
        return m

    def check_version(self, m: ServedModel, version: str) -> None:
        if version and m.version is not None and version != m.version:
            raise FrontError("NOT_FOUND", f"model {m.plan.name} serves version {m.version}, not {version!r} (leave "
                             "the version out to be served by the one serving)", "unknown_version")

    def infer(self, m: ServedModel, frame: np.ndarray, width: int, height: int, deadline_ns: int,
              timing: Timing) -> ring.ResultRecord:
        """One frame (flat uint8 of the size's frame bytes) through the daemon; raises FrontError."""
        pool = m.pools.get((width, height))
        if pool is None:
            raise FrontError("INVALID_ARGUMENT", f"model {m.plan.name} takes frames of {m.sizes_said} "
                             f"({m.plan.pixel_format}), not {width}x{height}", "size")
        slot = pool.acquire(deadline_ns)
        timing.slot = time.monotonic_ns()
        try:
            rec = slot.run(frame, deadline_ns, timing)
        finally:
            pool.release(slot, ran=timing.published != 0)
        if rec.status != 0:
            raise FrontError("INTERNAL", f"model {m.plan.name}: the daemon could not serve this frame (result status "
                             f"{rec.status})", "result_status")
        m.version = rec.model_version
        return rec

    def outputs(self, m: ServedModel, rec: ring.ResultRecord) -> list[OutputTensor]:
        labels = self.labels.labels(rec.model_name, rec.model_version) or []
        try:
            outs = outputs_of(rec.kind, rec.payload, rec.item_count, labels)
        except PayloadError as e:
            raise FrontError("INTERNAL", f"model {m.plan.name}: its result does not parse: {e}", "payload") from None
        m.outputs = outs
        return outs

    # ---------------------------------------------------------------- the keeper

    def keep(self) -> None:
        """Reconnects free rings; warms each model not ready yet (one zero frame of its first size). A result ring
        that reconnected says edgeinferd serves again: every other one tries at once, not after its backoff."""
        for m in self.served.values():
            for pool in m.pools.values():
                pool.keep()
        attached = self._attach_count()
        if attached != self._attached:
            self._attached = attached
            behind = [s for s in self._slots if not s.reader.connected]
            for s in behind:
                s.reader.retry_now()
            if behind:
                for m in self.served.values():
                    for pool in m.pools.values():
                        pool.keep()
                self._attached = self._attach_count()
        for m in self.served.values():
            if not m.warm and all(p.connected for p in m.pools.values()):
                self._warm(m)

    def _warm(self, m: ServedModel) -> None:
        for (w, h), pool in m.pools.items():
            frame = np.zeros(pool.slots[0].frame_bytes, np.uint8)
            try:
                rec = self.infer(m, frame, w, h, time.monotonic_ns() + int(WARMUP_DEADLINE_S * 1e9), Timing())
                self.outputs(m, rec)
                pool.hold_ns = HOLD_NS_START  # a first frame may build the lanes' session: not the pace
            except FrontError as e:
                if str(e) != m.warm_error:
                    log.warning("model %s: warm-up frame %dx%d not answered: %s", m.plan.name, w, h, e)
                m.warm_error = str(e)
                return
        m.warm, m.warm_error = True, None
        log.info("model %s: ready (version %s; sizes %s; pool %s)", m.plan.name, m.version, m.sizes_said, m.plan.pool)

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._slots = []
