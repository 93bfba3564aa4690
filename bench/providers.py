#!/usr/bin/env python3
"""Execution providers side by side (models.NAME.provider), in one run, per model and provider this host has:

  bare          the fused session (preprocessing and model: what a lane runs) built as a lane builds it
                (ModelRuntime on that provider), run back to back pinned to the loop's CPU, one frame at a time
  edgeinferd    the real daemon serving that model on that provider (its lane's loop on the same CPU), a
                producer pinned to the other CPU offering a frame every 1.5 × the bare mean (the lane idles
                between frames; so do the paced bare runs, its like-for-like floor):
                its end-to-end latency (capture → result published)
  overhead      edgeinferd's end-to-end p50 less the bare p50 at the same pace: what the lane adds on that provider
  ready         the daemon's start → "edgeinferd: ready" (config, signature, fusion, every lane's sessions
                built and warmed): with OpenVINO, the model is compiled at each start (no cache yet)
  vs cpu        each provider's bare p50/p99 and saturated throughput (1 / bare mean) ÷ the CPU provider's

Usage: bench/providers.py [--quick] [--frames N] [--models a,b] [--providers cpu,openvino:CPU]
(needs `make models`; a provider the host lacks is skipped, said). Prints a table and a JSON summary last.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import await_ready, finish, stop  # noqa: E402
from edgeinfer.abi import ring  # noqa: E402
from edgeinfer.config.sections import Provider  # noqa: E402
from edgeinfer.models import providers  # noqa: E402
from edgeinfer.models.bundle import load_unverified_bundle  # noqa: E402
from edgeinfer.models.runtime import ModelRuntime  # noqa: E402
from edgeinfer.models.tools.bench import frame_for  # noqa: E402
from edgeinfer.models.verify import throwaway_signed_copy  # noqa: E402

PRODUCER_CPU, LOOP_CPU = 0, 1
MODELS = ("cls-tiny", "orientation", "detector")
PACE = 1.5  # the daemon rows (and the paced bare runs) get a frame every PACE × the bare mean: the lane idles between


def pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


def unpin() -> None:
    os.sched_setaffinity(0, set(range(os.cpu_count())))


def q(us) -> dict:
    us = np.asarray(us, np.float64)
    return {"n": int(len(us)), "p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "mean": float(us.mean())}


def bare(path: str, spec, frames: int) -> tuple[dict, dict, tuple]:
    """The fused session on `spec` on the loop's CPU: µs per run back to back, then µs per run at one run every
    PACE × the back-to-back mean (the daemon rows' rate: like with like), and the geometry."""
    meta = load_unverified_bundle(path).meta
    geometry = ("bgr24", meta.input.height, meta.input.width)
    pin(LOOP_CPU)
    try:
        model = ModelRuntime(load_unverified_bundle(path), provider=spec, warmup_runs=5)
        sess = model.session_for(*geometry)
        if model.sessions.fallback:
            raise providers.ProviderError(model.sessions.fallback)
        frame = frame_for("bgr24", meta.input.width, meta.input.height)
        took, paced = [], []
        for _ in range(frames):
            t = time.perf_counter_ns()
            sess.run(frame)
            took.append((time.perf_counter_ns() - t) / 1e3)
        period_s = PACE * float(np.mean(took)) / 1e6
        next_t = time.monotonic()
        for _ in range(frames):
            t = time.perf_counter_ns()
            sess.run(frame)
            paced.append((time.perf_counter_ns() - t) / 1e3)
            next_t += period_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        unpin()
    return q(took), q(paced), geometry


class Daemon:
    """The real edgeinferd serving one model on one provider, its one lane on LOOP_CPU."""

    def __init__(self, path: str, label: str, geometry: tuple):
        _, self.h, self.w = geometry
        self.stream = f"bench-{uuid.uuid4().hex[:8]}"
        self.dir = tempfile.mkdtemp(prefix="edgeinfer-bench-", dir="/tmp")
        cfg = os.path.join(self.dir, "edgeinferd.yaml")
        self.ingress, self.results_socket = os.path.join(self.dir, "in.sock"), os.path.join(self.dir, "res.sock")
        signed, trust = throwaway_signed_copy(path, self.dir, "bench")
        uid = os.getuid()
        with open(cfg, "w") as f:
            f.write(f"model:\n  trust_dir: {trust}\n  state_dir: {self.dir}/state\n  warmup_runs: 3\n"
                    f"models:\n  m: {{bundle: {signed}, provider: \"{label}\"}}\n"
                    f"lanes: [{{cpus: [{sorted(os.sched_getaffinity(0))[LOOP_CPU % os.cpu_count()]}]}}]\n"
                    f"streams:\n  - name: {self.stream}\n    model: m\n    producer: {{user: {uid}}}\n"
                    f"    readers: {{users: [{uid}]}}\n    width: {self.w}\n    height: {self.h}\n"
                    f"    max_age_ms: 5000\nruntime:\n  scheduling: fifo\n"
                    f"ingress:\n  socket: {self.ingress}\n  results_socket: {self.results_socket}\n"
                    f"metrics:\n  listen: 127.0.0.1:0\n")
        t = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferd_main "
                                      "as m; sys.exit(m())", "--config", cfg, "--log-level", "warning"],
                                     stdout=subprocess.PIPE, text=True)
        self.results = None
        try:
            self.metrics_url = await_ready(self.proc)
        except RuntimeError:
            self.close()
            raise
        self.ready_s = time.monotonic() - t
        self.results = ring.ResultReader.connect(self.stream, socket=self.results_socket)

    def serving(self) -> str:
        """The provider its lane serves on, from /metrics (edgeinfer_model_provider)."""
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "edgeinfer_model_provider" and s.value > 0:
                    return s.labels["serving"]
        return "?"

    def drive(self, frames: int, period_s: float) -> dict:
        """A frame every period_s from PRODUCER_CPU: the end-to-end µs (capture → published) of each result."""
        pin(PRODUCER_CPU)
        e2e = []
        frame = frame_for("bgr24", self.w, self.h)
        try:
            with ring.FrameWriter.connect(self.stream, self.w, self.h, "bgr24", socket=self.ingress) as cam:
                next_t = time.monotonic()
                for i in range(frames + 1):
                    np.copyto(cam.begin(), frame[0])
                    cam.publish(frame_id=i)
                    rec = self.results.read(10.0)
                    if rec is None:
                        raise RuntimeError(f"no result for frame {i}")
                    if i:  # the first waits for its ring's hand-over (connection set-up), not a frame's latency
                        e2e.append((rec.done_ns - rec.capture_ns) / 1e3)
                    next_t += period_s
                    time.sleep(max(0.0, next_t - time.monotonic()))
        finally:
            unpin()
        return q(e2e)

    def close(self) -> None:
        if self.results is not None:
            self.results.close()
        stop(self.proc, 15.0)
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small runs (the smoke test's)")
    ap.add_argument("--frames", type=int, default=None, help="frames per row (default 300, --quick 30)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--providers", default="cpu,openvino:CPU")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    t_start = time.monotonic()
    n = args.frames or (30 if args.quick else 300)
    from edgeinfer.support.cpuflags import cpu_int8
    summary: dict = {"machine": cpu_int8().line(), "frames": n, "rows": {}, "skipped": {}}
    print(summary["machine"])
    specs = []
    for label in args.providers.split(","):
        spec = Provider.model_validate(label).spec()
        why = providers.check(spec)
        if why:
            summary["skipped"][label] = why
            print(f"{label}: skipped: {why}")
        else:
            specs.append(spec)
    print(f"{'model':<12}{'provider':<14}{'bare p50/p99 µs':>18}{'paced p50 µs':>14}{'daemon e2e p50/p99 µs':>24}"
          f"{'overhead p50 µs':>17}{'ready s':>9}{'serving':>14}")
    for name in args.models.split(","):
        path = os.path.join(ROOT, "models", "bundles", name)
        for spec in specs:
            b, paced, geometry = bare(path, spec, n)
            d = Daemon(path, spec.label, geometry)
            try:
                serving = d.serving()
                e2e = d.drive(n, PACE * b["mean"] / 1e6)
            finally:
                d.close()
            row = {"bare": b, "bare_paced": paced, "e2e": e2e, "overhead_p50_us": e2e["p50"] - paced["p50"],
                   "ready_s": d.ready_s, "serving": serving}
            summary["rows"][f"{name}/{spec.label}"] = row
            print(f"{name:<12}{spec.label:<14}{b['p50']:>10.0f}/{b['p99']:<7.0f}{paced['p50']:>14.0f}"
                  f"{e2e['p50']:>14.0f}/{e2e['p99']:<9.0f}"
                  f"{row['overhead_p50_us']:>+17.0f}{d.ready_s:>9.2f}{serving:>14}", flush=True)
    print("\neach provider ÷ the CPU provider (bare, same model):")
    for key, row in summary["rows"].items():
        name, label = key.split("/", 1)
        cpu = summary["rows"].get(f"{name}/cpu")
        if label == "cpu" or cpu is None:
            continue
        row["vs_cpu"] = {"p50": row["bare"]["p50"] / cpu["bare"]["p50"], "p99": row["bare"]["p99"] / cpu["bare"]["p99"],
                         "throughput": cpu["bare"]["mean"] / row["bare"]["mean"], "ready": row["ready_s"] / cpu["ready_s"]}
        v = row["vs_cpu"]
        print(f"  {name:<12}{label:<14} p50 ×{v['p50']:.2f}  p99 ×{v['p99']:.2f}  throughput ×{v['throughput']:.2f}  "
              f"ready ×{v['ready']:.2f}")
    return finish(summary, t_start, args.json)


if __name__ == "__main__":
    sys.exit(main())
