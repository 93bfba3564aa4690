"""`edgeinferctl model bench`: the latency of a bundle's fused session on this
host, as a lane runs it (ModelRuntime, ThreadPlan, FusedSession: the same
objects, the same session options and thread pinning), one frame at a time.

Bundles are loaded without their signature checked: the bench measures
speed and serves nothing (`model verify` checks a bundle the daemon's way).
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from edgeinfer.models.bundle import load_unverified_bundle
from edgeinfer.models.providers import CPU_SPEC, ProviderError, ProviderSpec, host_listing
from edgeinfer.models.runtime import ModelRuntime, ThreadPlan
from edgeinfer.abi.vocabulary import frame_shape


@dataclasses.dataclass(frozen=True)
class Latency:
    bundle: str
    name: str
    version: str
    int8: bool          # model.yaml has a `quantization` record
    frames: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


def thread_plan(threads: int, cpus: list[int] | None) -> ThreadPlan:
    """A lane's plan: `threads` intra-op threads, the extra ones pinned to `cpus` after the first (a lane's
    loop runs on its first CPU; ORT never pins the calling thread)."""
    if cpus:
        avail = os.sched_getaffinity(0)
        bad = sorted(set(cpus) - avail)
        if bad:
            raise ValueError(f"--cpus: CPUs {bad} are not available to this process (have {sorted(avail)})")
        if len(cpus) < threads:
            raise ValueError(f"--cpus: {len(cpus)} CPUs for {threads} threads (a lane has one CPU per thread)")
    return ThreadPlan(threads=threads, extra_thread_cpus=tuple(cpus[1:threads]) if cpus else ())


def frame_for(pixel_format: str, width: int, height: int, seed: int = 1) -> np.ndarray:
    """A camera-like frame: random pixels (a constant frame would let some kernels take shortcuts)."""
    return np.random.default_rng(seed).integers(0, 256, (1, *frame_shape(pixel_format, height, width)), np.uint8)


def bench_bundle(path: str, plan: ThreadPlan, geometry: tuple[str, int, int], frames: int,
                 warmup: int = 5, provider: ProviderSpec = CPU_SPEC) -> Latency:
    """p50/p95/p99 of `frames` runs of the fused session for geometry (pixel format, height, width) on
    `provider`; ProviderError where it cannot run there (a bench never measures the CPU in its place)."""
    model = ModelRuntime(load_unverified_bundle(path), threads=plan, warmup_runs=warmup, provider=provider)
    sess = model.session_for(*geometry)
    if model.sessions.fallback:
        raise ProviderError(model.sessions.fallback)
    pixel_format, height, width = geometry
    frame = frame_for(pixel_format, width, height)
    took = np.empty(frames)
    for i in range(frames):
        t = time.perf_counter()
        sess.run(frame)
        took[i] = time.perf_counter() - t
    ms = took * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return Latency(path, model.name, model.version, model.meta.quantization is not None, frames,
                   float(p50), float(p95), float(p99), float(ms.mean()))


def provider_table() -> str:
    """What `model bench --providers` prints: each provider and device, available or why not."""
    rows = host_listing()
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{said}" for label, said in rows)


def bench(paths: list[str], threads: int = 1, cpus: list[int] | None = None, frames: int = 200,
          geometry: str | None = None, pixel_format: str = "bgr24", say=print,
          provider: ProviderSpec = CPU_SPEC) -> list[Latency]:
    """Each bundle in turn (never two at once: they would share the CPUs), the same frames and thread plan."""
    from edgeinfer.support.cpuflags import cpu_int8
    plan = thread_plan(threads, cpus)
    say(cpu_int8().line())
    rows = []
    for path in paths:
        meta = load_unverified_bundle(path).meta
        if geometry:
            try:
                w, h = (int(x) for x in geometry.lower().split("x"))
            except ValueError:
                raise ValueError(f"--geometry {geometry!r}: WxH, e.g. 640x480") from None
        else:
            w, h = meta.input.width, meta.input.height  # the model's own size: no resize in front
        rows.append(bench_bundle(path, plan, (pixel_format, h, w), frames, provider=provider))
    pinned = f", extra threads on CPUs {list(plan.extra_thread_cpus)}" if plan.extra_thread_cpus else ""
    say(f"fused session ({pixel_format} {w}x{h} frame → model) on {provider.label}, {threads} intra-op thread(s){pinned}, "
        f"{frames} frames, one at a time")
    say(table(rows))
    return rows


def table(rows: list[Latency]) -> str:
    """One column per bundle, FP32 and INT8 side by side, and INT8 ÷ FP32 where both are there."""
    heads = [f"{r.name} {r.version} ({'INT8' if r.int8 else 'FP32'})" for r in rows]
    width = max(14, *(len(h) + 2 for h in heads))
    lines = [f"{'':<8}" + "".join(f"{h:>{width}}" for h in heads)]
    for key in ("p50_ms", "p95_ms", "p99_ms", "mean_ms"):
        lines.append(f"{key[:-3] + ' ms':<8}" + "".join(f"{getattr(r, key):>{width}.2f}" for r in rows))
    fp32 = next((r for r in rows if not r.int8), None)
    int8 = next((r for r in rows if r.int8), None)
    if fp32 and int8:
        lines.append(f"INT8 ÷ FP32: p50 {int8.p50_ms / fp32.p50_ms:.2f}x, p99 {int8.p99_ms / fp32.p99_ms:.2f}x "
                     "(below 1: INT8 is faster)")
    return "\n".join(lines)
