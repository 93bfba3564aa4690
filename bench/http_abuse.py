"""What abusive HTTP clients cost a camera's end-to-end latency (issue #13, item 4).

The real edgeinferd (as bench/e2e.py runs it: demo model, loop SCHED_FIFO on CPU 1, camera on CPU 0) at
40 fps, measured side by side in one run: quiet, then while tests/adversary/http_flood.py holds 1,000
half-open connections, drips a never-ending request and runs 32 threads scraping /metrics flat out.
Prints p50/p99/p99.9 of each and the ratios, the scrapes served and the /metrics renders they shared.

    .venv/bin/python bench/http_abuse.py [--frames N]     (default 1,000 frames per row; ~1 min)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (its Daemon, drive() and quantiles: the same set-up as the e2e rows)

FLOOD = os.path.join(e2e.ROOT, "tests", "adversary", "http_flood.py")


def renders(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("edgeinfer_http_metrics_renders_total "):
                return float(line.split()[1])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1000)
    args = ap.parse_args()
    n, period = args.frames, 1 / 40
    frames = [f for f, _ in e2e.make_frames(224, 224, pages=3)]
    d = e2e.Daemon(e2e.BUNDLE)
    try:
        e2e.drive(d, frames, 80, period)  # warm-up, not counted
        quiet = e2e.q(e2e.drive(d, frames, n, period)[0])
        host, port = d.metrics_url.split("//", 1)[1].rsplit(":", 1)
        r0 = renders(d.metrics_url)
        flood = subprocess.Popen([sys.executable, FLOOD, host, port, str(n * period + 10)], stdout=subprocess.PIPE,
                                 text=True)
        held = flood.stdout.readline().strip()
        abused = e2e.q(e2e.drive(d, frames, n, period)[0])
        scrapes = flood.stdout.readline().strip()
        flood.wait(60)
        r1 = renders(d.metrics_url)
    finally:
        d.close()
    print(f"\ncamera e2e at 40 fps, {n} frames per row (µs); flood: {held}, {scrapes}, /metrics rendered "
          f"{r1 - r0:.0f} times")
    print(f"{'row':<40}{'p50':>9}{'p99':>9}{'p99.9':>9}")
    for name, s in (("quiet", quiet), ("1,000 half-open + 32 scrapers", abused)):
        print(f"{name:<40}{s['p50']:>9.0f}{s['p99']:>9.0f}{s['p99.9']:>9.0f}")
    ratio = {k: abused[k] / quiet[k] for k in ("p50", "p99", "p99.9")}
    print(f"abused ÷ quiet: p50 {ratio['p50']:.2f}×, p99 {ratio['p99']:.2f}× (target ≤ 1.10×: "
          f"{'met' if ratio['p99'] <= 1.10 else 'NOT met'})")
    print(json.dumps({"quiet": quiet, "abused": abused, "ratio": ratio, "flood": [held, scrapes],
                      "renders": r1 - r0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
