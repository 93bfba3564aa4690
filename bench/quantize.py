#!/usr/bin/env python3
"""FP32 against INT8 on this CPU, for both models (the orientation classifier
and the detector), in one run: `model quantize`'s code path (calibration on
synthetic-camera frames through the daemon's fused graph, the accuracy gate on
held-out pages) and `model bench`'s (the fused session as a lane runs it,
one frame at a time, 640x480 bgr24 camera frames resized in-graph).

Printed: the CPU and its INT8 flags, then per model p50/p99 FP32 and INT8, the
ratio, top-1 agreement (classifier) or boxes matched at IoU >= 0.5 (detector)
on the held-out frames; a JSON summary last.

Usage: bench/quantize.py [--quick] [--threads N]   (needs `make models`)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from edgeinfer.support.cpuflags import cpu_int8  # noqa: E402
from edgeinfer.models.tools.bench import bench_bundle, thread_plan  # noqa: E402
from edgeinfer.cameras.synthetic import make_frames  # noqa: E402
from edgeinfer.models.tools.quantize import DEFAULT_MAX_SCORE_DELTA, DEFAULT_MIN_AGREEMENT, quantize_bundle  # noqa: E402
from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION  # noqa: E402

MODELS = ("orientation", "detector")
W, H = 640, 480  # the synthetic camera's frames: the fused graph resizes them to each model's input


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "unknown")


def main() -> int:
    ap = argparse.ArgumentParser(description="FP32 vs INT8 for both models on this CPU")
    ap.add_argument("--quick", action="store_true", help="fewer frames (a smoke run, not figures)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1, a lane's default)")
    args = ap.parse_args()
    pages = 2 if args.quick else 8                 # 4 frames a page: 32 calibration, 32 held out
    runs = {"orientation": 50 if args.quick else 1000, "detector": 10 if args.quick else 200}
    cpu = cpu_int8()
    frames_cal = [(f, "bgr24") for f, _ in make_frames(W, H, pages=pages, seed=1)]
    frames_held = [(f, "bgr24") for f, _ in make_frames(W, H, pages=pages, seed=2)]
    plan = thread_plan(args.threads, None)
    work = tempfile.mkdtemp(prefix="edgeinfer-quantize-bench-")
    rows = {}
    try:
        for name in MODELS:
            src = os.path.join(ROOT, "models", "bundles", name)
            out = os.path.join(work, name)
            lines = []
            # Gate wide open: the bench records the figures; whether the default gate passes them is a column.
            meta = quantize_bundle(src, frames_cal + frames_held, len(frames_cal), out, say=lines.append,
                                   min_agreement=0.0, max_score_delta=float("inf"))
            q = meta.quantization
            kind = KIND_CLASSIFICATION if q.metric == "top1" else KIND_DETECTION
            gate = q.agreement >= DEFAULT_MIN_AGREEMENT[kind] and q.max_score_delta <= DEFAULT_MAX_SCORE_DELTA[kind]
            fp32 = bench_bundle(src, plan, ("bgr24", H, W), runs[name])
            int8 = bench_bundle(out, plan, ("bgr24", H, W), runs[name])
            rows[name] = {"fp32": fp32.__dict__, "int8": int8.__dict__, "metric": q.metric,
                          "agreement": q.agreement, "max_score_delta": q.max_score_delta,
                          "calibration_frames": q.calibration_frames, "held_out_frames": q.held_out_frames,
                          "default_gate": "pass" if gate else "refuse",
                          "p50_ratio": int8.p50_ms / fp32.p50_ms, "p99_ratio": int8.p99_ms / fp32.p99_ms}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nCPU (lscpu): {lscpu_model()}; {os.cpu_count()} CPUs visible")
    print(cpu.line())
    print(f"fused session, {W}x{H} bgr24 camera frames, {args.threads} intra-op thread(s), one frame at a time; "
          f"calibration {len(frames_cal)} frames, gate on {len(frames_held)} held-out frames (other pages)\n")
    print(f"{'model':<13}{'runs':>6}{'FP32 p50':>10}{'INT8 p50':>10}{'FP32 p99':>10}{'INT8 p99':>10}"
          f"{'p50 x':>7}{'p99 x':>7}  agreement (held out)   max score delta  default gate")
    for name, r in rows.items():
        what = "top-1" if r["metric"] == "top1" else "boxes IoU>=0.5"
        print(f"{name:<13}{r['fp32']['frames']:>6}{r['fp32']['p50_ms']:>10.2f}{r['int8']['p50_ms']:>10.2f}"
              f"{r['fp32']['p99_ms']:>10.2f}{r['int8']['p99_ms']:>10.2f}{r['p50_ratio']:>7.2f}{r['p99_ratio']:>7.2f}"
              f"  {what + ' ' + format(r['agreement'], '.4f'):<23}{r['max_score_delta']:>15.4f}  {r['default_gate']}")
    print("(ms; x = INT8 ÷ FP32, below 1: INT8 faster)")
    print(json.dumps({"cpu": {"model": lscpu_model(), "int8_flags": list(cpu.flags), "fast_int8": cpu.fast_int8},
                      "threads": args.threads, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
