#!/usr/bin/env python3
"""What a shadow rollout costs the serving frames, how long it takes to decide, and what it holds in memory.

One real edgeinferd serving --streams streams of the orientation model (224x224) with `rollout: shadow`, and a
camera process publishing on every stream and reading every result itself (bench/_cameras.py: the lanes' latency,
capture → result committed). The candidate is the same model signed as 0.0.12, so it agrees and is as fast: what
is measured is the shadow itself. The window is made too long to end, so the rollout runs for as long as asked.

1. Capacity: the daemon's own inference p50 at a light load gives the lanes' capacity (lanes × duty ceiling ÷ the
   run time).
2. For each load (--loads, a share of that capacity), --rounds rounds of two --seconds windows side by side, in
   alternating order: `none` (serving 0.0.11 alone) and `shadow` (0.0.12 under way beside it, sampling --sample of
   the frames; started by flipping the bundle symlink and SIGHUP, ended by flipping it back, which stops a rollout
   without refusing its bundle). Per window: the lanes' p50/p99, frames answered, the frames the candidate
   compared and skipped, and the lanes' memory (RSS and PSS, their processes summed). The target: shadow p99 ÷
   none p99 ≤ 1.1.
3. Decision time (unless --no-decision): a daemon with the shipped window (200 frames, 60 s) and --sample at the
   first load: the seconds from the flip to the promotion, with the figures that decided.

Usage: bench/rollout.py [--streams 4] [--loads 0.5,0.9] [--seconds 10] [--rounds 3] [--sample 0.1] [--json FILE]
       [--quick]   (root, make models)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from _cameras import Cameras  # noqa: E402
from _proc import process_tree  # noqa: E402
from daemon_helpers import read_stats  # noqa: E402

BUNDLE = os.path.join(ROOT, "models", "bundles", "orientation")
SIDE = 224
MODEL = "orient"


def q(values, p: float) -> float | None:
    return float(np.percentile(values, p)) if len(values) else None


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def rollout_of(path: str) -> dict:
    return ((read_stats(path).get("models") or {}).get(MODEL) or {}).get("rollout") or {}


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def lane_memory(pid: int) -> dict:
    """The lanes' RSS and PSS (MiB), their processes summed (/proc/PID/smaps_rollup)."""
    rss = pss = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/comm") as f:
                if not f.read().startswith("edgeinfer-lane"):
                    continue
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return {"rss_mib": rss / 1024, "pss_mib": pss / 1024}


class Daemon:
    def __init__(self, work: str, children, streams: int, sample: float, window: dict):
        from daemon_helpers import start_daemon, write_config
        self.work = Path(work)
        self.current = self.work / "current"
        if self.current.is_symlink():
            self.current.unlink()
        os.symlink(self.work / "v11", self.current)
        self.stats = str(self.work / f"stats-{time.monotonic_ns()}.json")
        state = self.work / f"state-{time.monotonic_ns()}"
        config = write_config(self.work, None, [{"name": f"s{i:02d}", "width": SIDE, "height": SIDE,
                                                 "max_age_ms": 1000} for i in range(streams)],
                              trust_dir=str(self.work / "trust"), state_dir=str(state),
                              models={MODEL: {"bundle": str(self.current), "rollout": {
                                  "policy": "shadow", "sample": sample, "window": window}}})
        self.proc = start_daemon(children, config, stats_file=self.stats,
                                 log_file=str(self.work / "daemon.log"))
        self.ingress, self.results = self.proc.ingress, self.proc.results

    def flip(self, tag: str) -> None:
        link = self.work / "current.new"
        os.symlink(self.work / tag, link)
        os.replace(link, self.current)
        self.proc.send_signal(signal.SIGHUP)

    def shadow(self, on: bool) -> None:
        self.flip("v12" if on else "v11")
        wait(lambda: (rollout_of(self.stats).get("candidate") == "0.0.12") == on, 30,
             "the rollout to " + ("start" if on else "stop"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)


def capacity(d: Daemon, children, streams: int, seconds: float) -> dict:
    """The lanes' capacity from the daemon's own inference p50 at a light load."""
    cams = Cameras(streams, 5.0, d.ingress, d.results, SIDE, SIDE)
    try:
        cams.window(seconds)
    finally:
        cams.close()
    st = read_stats(d.stats)
    infer = median([s.get("infer_ms_p50") for s in st["streams"].values()])
    lanes = len(st["lanes"])
    return {"infer_ms_p50": infer, "lanes": lanes, "frames_per_s": lanes * 0.9 / (infer / 1e3)}


def windows(d: Daemon, streams: int, fps: float, seconds: float, rounds: int) -> list[dict]:
    out = []
    cams = Cameras(streams, fps, d.ingress, d.results, SIDE, SIDE)
    try:
        cams.window(min(seconds, 3.0))  # warm: sessions, caches, the cameras' first frames
        for r in range(rounds):
            row = {}
            for phase in (("none", "shadow") if r % 2 == 0 else ("shadow", "none")):
                d.shadow(phase == "shadow")
                before = rollout_of(d.stats).get("figures") or {}
                got = cams.window(seconds)
                after = rollout_of(d.stats).get("figures") or {}
                lat = got["lat_us"]
                row[phase] = {"p50_us": q(lat, 50), "p99_us": q(lat, 99), "answered": got["read"],
                              "published": got["published"], "versions": got["versions"],
                              "compared": after.get("frames", 0) - before.get("frames", 0),
                              "skipped": after.get("skipped", 0) - before.get("skipped", 0),
                              **lane_memory(d.proc.pid)}
            row["p99_ratio"] = (row["shadow"]["p99_us"] / row["none"]["p99_us"]
                                if row["shadow"]["p99_us"] and row["none"]["p99_us"] else None)
            out.append(row)
            print(f"  round {r + 1}: p99 none {row['none']['p99_us']:.0f} µs, shadow {row['shadow']['p99_us']:.0f} µs "
                  f"(× {row['p99_ratio']:.2f}); compared {row['shadow']['compared']}, skipped "
                  f"{row['shadow']['skipped']}; lanes' PSS {row['none']['pss_mib']:.0f} → "
                  f"{row['shadow']['pss_mib']:.0f} MiB", flush=True)
    finally:
        cams.close()
        d.shadow(False)
    return out


def decision_time(work: str, children, streams: int, fps: float, sample: float, window: dict) -> dict:
    d = Daemon(work, children, streams, sample, window)
    cams = Cameras(streams, fps, d.ingress, d.results, SIDE, SIDE)
    try:
        cams.proc.stdin.write("go\n")
        cams.proc.stdin.flush()
        time.sleep(2.0)
        started = time.monotonic()
        d.flip("v12")
        last = wait(lambda: rollout_of(d.stats).get("last"), window["min_seconds"] + 600, "the decision")
        took = time.monotonic() - started
        cams.proc.stdin.write("stop\n")
        cams.proc.stdin.flush()
        json.loads(cams.proc.stdout.readline())
        return {"seconds": took, "decision": last["decision"], "figures": last["figures"], "window": window,
                "sample": sample, "fps_total": fps * streams}
    finally:
        cams.close()
        d.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--loads", default="0.5,0.9", help="shares of the lanes' capacity, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample", type=float, default=0.1, help="the shadow's sample (models.NAME.rollout.sample)")
    ap.add_argument("--no-decision", action="store_true", help="skip the decision-time run (about 70 s)")
    ap.add_argument("--quick", action="store_true", help="the smallest run (smoke test: 1 round of 1 s windows, "
                    "a 20-frame, 2 s decision window)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.loads = 1.0, 1, "0.5"
    decide_window = {"min_frames": 20, "min_seconds": 2} if args.quick else {"min_frames": 200, "min_seconds": 60}
    loads = [float(x) for x in args.loads.split(",")]

    from conftest import Children
    from edgeinfer.models.verify import generate_keys, sign_bundle
    work = tempfile.mkdtemp(prefix="bench-rollout-")
    children = Children()
    summary = {"machine": os.uname().nodename, "streams": args.streams, "sample": args.sample, "loads": {}}
    try:
        trust = os.path.join(work, "trust")
        os.makedirs(trust)
        key, pub = generate_keys(os.path.join(work, "keys"), "bench-rollout")
        shutil.copy(pub, os.path.join(trust, "bench-rollout.pub"))
        for tag, version in (("v11", "0.0.11"), ("v12", "0.0.12")):  # the same model, signed as two versions
            shutil.copytree(BUNDLE, os.path.join(work, tag))
            meta = Path(work, tag, "model.yaml")
            meta.write_text(meta.read_text().replace("version: 0.0.11", f"version: {version}"))
            sign_bundle(os.path.join(work, tag), key)
        never = {"min_frames": 10_000_000, "min_seconds": 86400, "max_seconds": 7 * 86400}
        d = Daemon(work, children, args.streams, args.sample, never)
        try:
            cap = capacity(d, children, args.streams, 2.0 if args.quick else 5.0)
            summary["capacity"] = cap
            print(f"capacity: {cap['lanes']} lanes, inference p50 {cap['infer_ms_p50']:.2f} ms → "
                  f"{cap['frames_per_s']:.0f} frames/s", flush=True)
            for load in loads:
                fps = load * cap["frames_per_s"] / args.streams
                print(f"load {load:.0%}: {args.streams} streams × {fps:.1f} fps, shadow sample {args.sample:g}",
                      flush=True)
                rows = windows(d, args.streams, fps, args.seconds, args.rounds)
                ratios = [r["p99_ratio"] for r in rows]
                summary["loads"][f"{load:g}"] = {
                    "fps_per_stream": fps, "rounds": rows, "p99_ratio_median": median(ratios),
                    "p99_ratio_range": [min(x for x in ratios if x is not None), max(x for x in ratios if x is not None)]
                    if any(x is not None for x in ratios) else None,
                    "pss_none_mib": median([r["none"]["pss_mib"] for r in rows]),
                    "pss_shadow_mib": median([r["shadow"]["pss_mib"] for r in rows])}
                s = summary["loads"][f"{load:g}"]
                print(f"  median p99 shadow ÷ none {s['p99_ratio_median']:.2f} (range {s['p99_ratio_range'][0]:.2f}–"
                      f"{s['p99_ratio_range'][1]:.2f}); lanes' PSS {s['pss_none_mib']:.0f} → "
                      f"{s['pss_shadow_mib']:.0f} MiB", flush=True)
        finally:
            d.stop()
        if not args.no_decision:
            fps = loads[0] * summary["capacity"]["frames_per_s"] / args.streams
            dt = decision_time(work, children, args.streams, fps, args.sample, decide_window)
            summary["decision"] = dt
            f = dt["figures"]
            print(f"decision: {dt['decision']} {dt['seconds']:.1f} s after the flip (window {decide_window}, sample "
                  f"{args.sample:g}, {dt['fps_total']:.0f} frames/s): {f['frames']} compared, {f['skipped']} skipped; "
                  f"gated: paired run-time ratio candidate ÷ serving {_num(f.get('time_ratio'))} (upper bound "
                  f"{_num(f.get('time_ratio_high'))}, {f.get('pairs', 0)} pairs), agreement {_num(f.get('agreement'))} "
                  f"(lower bound {_num(f.get('agreement_low'))}); p99 run ratio {_num(_p99_ratio(f))} (informs)",
                  flush=True)
    finally:
        children.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items()}, separators=(",", ":")))
    return 0


def _p99_ratio(f: dict):
    c, s = f.get("p99_candidate_us"), f.get("p99_serving_us")
    return c / s if c is not None and s else None


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
