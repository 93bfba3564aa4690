#!/usr/bin/env python3
"""The drift chore's CPU (control/drift.py), in this process: N result rings written as a lane writes them (records
of the orientation classifier's shape, top-4 classes; or a detector's, 0-20 boxes), R records per ring per
simulated second, and the chore's tick once per second, as the serve loop runs it at drift.interval_s 1. The tick's
thread CPU time is the chore's CPU per second of wall time. Reported: while the reference is being taken, and in
the steady state (windows of drift.window_s sliding, the figures computed every tick), median and max of the ticks.

Usage: bench/drift.py [--streams 8] [--fps 30] [--seconds 120] [--kind classification|detection]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon"))
from edgeinfer.abi import ring  # noqa: E402
from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION  # noqa: E402
from edgeinfer.config.sections import DriftConfig  # noqa: E402
from edgeinfer.control.drift import Drift  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--kind", choices=("classification", "detection"), default="classification")
    args = ap.parse_args()
    detection = args.kind == "detection"
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as state:
        dc = DriftConfig(window_s=60.0)  # defaults, but a 60 s window (the run is short); 1000 reference frames
        cfg = types.SimpleNamespace(drift=dc, model=types.SimpleNamespace(state_dir=state))
        writers = [ring.ResultWriter.create(20 * 24, records=64) for _ in range(args.streams)]
        streams = [types.SimpleNamespace(name=f"cam{i}", model="m", writer=w) for i, w in enumerate(writers)]
        models = types.SimpleNamespace(served={})
        drift = Drift(cfg, streams, models)
        building, steady = [], []
        for second in range(args.seconds):
            for w in writers:
                for _ in range(args.fps):
                    if detection:
                        n = rng.randrange(21)
                        rows = np.zeros((n, 6), np.float32)
                        rows[:, 4] = np.float32(rng.random())
                        rows[:, 5] = rng.randrange(3)
                        w.write(kind=KIND_DETECTION, payload=rows, item_count=n, model_name="det", model_version="1")
                    else:
                        rows = np.zeros((4, 2), np.float32)
                        rows[:, 0] = rng.sample(range(4), 4)
                        rows[:, 1] = [8 * rng.random(), 2, 1, 0]
                        w.write(kind=KIND_CLASSIFICATION, payload=rows, item_count=4, model_name="cls",
                                model_version="1")
            t0 = time.thread_time()
            drift.tick(1000.0 + second)
            took = time.thread_time() - t0
            done = all(r.complete for r in drift.view.references) and drift.view.references
            (steady if done and second * 1.0 >= dc.reference_frames / (args.streams * args.fps) + dc.window_s
             else building).append(took)
        read = sum(r for r, _ in drift.view.records.values())
        missed = sum(m for _, m in drift.view.records.values())
        drift.close()
        for w in writers:
            w.close()
    print(f"{args.streams} streams x {args.fps} fps, {args.kind}, {args.seconds} ticks of 1 s; "
          f"{read} records read, {missed} missed")
    for name, ticks in (("reference and filling windows", building), ("steady state", steady)):
        if ticks:
            ms = np.array(ticks) * 1e3
            print(f"  {name:30s} {len(ticks):4d} ticks: CPU per tick (= per second) median {np.median(ms):.2f} ms, "
                  f"max {ms.max():.2f} ms ({np.median(ms) / 10:.2f} % of a CPU)")


if __name__ == "__main__":
    main()
