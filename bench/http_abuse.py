"""What abusive HTTP clients cost a camera's end-to-end latency (issue #13, item 4).

The real edgeinferd (as bench/e2e.py runs it: demo model, loop SCHED_FIFO on CPU 1, camera on CPU 0) at
40 fps, measured side by side in one run: quiet, then while tests/adversary/http_flood.py holds 1,000
half-open connections, drips a never-ending request and runs 32 threads scraping /metrics flat out.
Prints p50/p99/p99.9 of each and the ratios, the scrapes served and the /metrics renders they shared, and
how long /healthz took to answer in each row (a separate process asks every 50 ms).

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
# /healthz every 50 ms until stdin closes, from its own process (the camera's process keeps its own GIL);
# then the latencies in ms, one JSON list (a failed or timed-out probe counts as 2,000 ms).
PROBE = """
import json, sys, threading, time, urllib.request
url, lat, done = sys.argv[1], [], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.wait(0.05):
    t = time.monotonic()
    try:
        urllib.request.urlopen(url, timeout=2).read()
        lat.append((time.monotonic() - t) * 1e3)
    except OSError:
        lat.append(2000.0)
print(json.dumps(lat), flush=True)
"""


def probed(url: str, fn):
    """fn() while another process times /healthz; (fn's value, /healthz quantiles in ms)."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE, url + "/healthz"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        value = fn()
    finally:
        lat, _ = probe.communicate("", timeout=30)
    ms = sorted(json.loads(lat))
    at = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))] if ms else float("nan")  # noqa: E731
    return value, {"n": len(ms), "p50": at(0.5), "p99": at(0.99), "max": ms[-1] if ms else float("nan")}


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
        quiet, hz_quiet = probed(d.metrics_url, lambda: e2e.q(e2e.drive(d, frames, n, period)[0]))
        host, port = d.metrics_url.split("//", 1)[1].rsplit(":", 1)
        r0 = renders(d.metrics_url)
        flood = subprocess.Popen([sys.executable, FLOOD, host, port, str(n * period + 10)], stdout=subprocess.PIPE,
                                 text=True)
        held = flood.stdout.readline().strip()
        abused, hz_abused = probed(d.metrics_url, lambda: e2e.q(e2e.drive(d, frames, n, period)[0]))
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
    for name, h in (("quiet", hz_quiet), ("abused", hz_abused)):
        print(f"/healthz while {name}: {h['n']} probes, p50 {h['p50']:.1f} ms, p99 {h['p99']:.1f} ms, "
              f"max {h['max']:.1f} ms")
    print(json.dumps({"quiet": quiet, "abused": abused, "ratio": ratio, "flood": [held, scrapes],
                      "renders": r1 - r0, "healthz_ms": {"quiet": hz_quiet, "abused": hz_abused}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
