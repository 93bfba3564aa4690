"""`make demo`: edgeinferd on the bundled orientation model with two synthetic
document cameras, one line a second per stream: fps, end-to-end p50/p99,
drops by reason, the last prediction against the known rotation, accuracy.

Everything runs as real processes on real shared memory: the daemon
(`edgeinferd`, foreground), two producers (`edgeinferctl feed --synthetic`)
and this process following both result rings. Ctrl-C (or DEMO_SECONDS) stops
it all cleanly.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

from edgeinfer.abi import ring
from edgeinfer.support.signals import Signals
from edgeinfer.models.verify import throwaway_signed_copy
from edgeinfer.abi.vocabulary import DROPS

LABELS = ["0", "90", "180", "270"]


def _config(bundle: str, trust: str, state: str, streams: list[str], work: str) -> str:
    uid = os.getuid()  # the demo's cameras and reader are this user: the only producer and reader it allows
    lines = [f"model:\n  bundle: {os.path.abspath(bundle)}\n  trust_dir: {trust}\n  state_dir: {state}\nstreams:"]
    for s in streams:
        lines.append(f"  - name: {s}\n    producer: {{user: {uid}}}\n    readers: {{users: [{uid}]}}\n"
                     f"    max_age_ms: 500\n    width: 480\n    height: 480")
    lines.append(f"runtime:\n  scheduling: fifo\ningress:\n  socket: {work}/ingress.sock\n"
                 f"  results_socket: {work}/results.sock\nmetrics:\n  listen: 127.0.0.1:0")
    return "\n".join(lines) + "\n"


def run_demo(bundle: str, seconds: float) -> int:
    if not os.path.isdir(bundle):
        print(f"demo: no model bundle at {bundle} (make demo fetches it: scripts/fetch-models)", file=sys.stderr)
        return 1
    tag = uuid.uuid4().hex[:6]
    streams = [f"demo{tag}-cam0", f"demo{tag}-cam1"]
    work = tempfile.mkdtemp(prefix="edgeinfer-demo-")
    cfg_path = os.path.join(work, "edgeinferd.yaml")
    stats_path = os.path.join(work, "stats.json")
    # The daemon refuses unsigned models: the demo signs a copy with a key of its own and trusts only that.
    signed, trust = throwaway_signed_copy(bundle, work, "demo")
    with open(cfg_path, "w") as f:
        f.write(_config(signed, trust, os.path.join(work, "state"), streams, work))
    py = sys.executable
    procs: list[subprocess.Popen] = []
    stopping = Signals(signal.SIGINT, signal.SIGTERM).stop_flag()
    try:
        daemon = subprocess.Popen([py, "-c", "import sys; from edgeinfer.cli import edgeinferd_main as m; "
                                   "sys.exit(m())", "--config", cfg_path, "--stats-file", stats_path],
                                  stdout=subprocess.DEVNULL, start_new_session=True)
        procs.append(daemon)
        for i, s in enumerate(streams):
            procs.append(subprocess.Popen([py, "-m", "edgeinfer.cli", "feed", "--synthetic", "--stream", s,
                                           "--width", "480", "--height", "480", "--fps", str(15 + 10 * i),
                                           "--seed", str(i + 1), "--socket", f"{work}/ingress.sock",
                                           "--wait", "60"], start_new_session=True))
        readers = {s: ring.ResultReader.watch(s, socket=f"{work}/results.sock") for s in streams}
        seen = {s: {"n": 0, "correct": 0, "lat": [], "last": None} for s in streams}
        t0 = time.monotonic()
        next_print = t0 + 1.0
        print(f"edgeinfer demo: model bundle {bundle}, cameras {', '.join(streams)} (Ctrl-C stops)", flush=True)
        while not stopping() and (not seconds or time.monotonic() - t0 < seconds):
            if daemon.poll() is not None:
                print(f"demo: edgeinferd exited with {daemon.returncode}", file=sys.stderr)
                return 1
            for s, r in readers.items():
                while (rec := r.read(0.0)) is not None:
                    top = int(np.frombuffer(rec.payload, np.float32)[0]) if rec.item_count else -1
                    truth = rec.frame_id % 4
                    d = seen[s]
                    d["n"] += 1
                    d["correct"] += top == truth
                    d["lat"].append((rec.done_ns - rec.capture_ns) / 1e6)
                    d["last"] = (top, truth)
            if time.monotonic() >= next_print:
                next_print += 1.0
                stats = _read_stats(stats_path)
                for s in streams:
                    _print_line(s, seen[s], stats.get("streams", {}).get(s, {}))
                    seen[s]["lat"] = []
            time.sleep(0.02)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
        print("demo stopped", flush=True)


def _read_stats(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _print_line(name: str, d: dict, st: dict) -> None:
    lat = d["lat"]
    p50, p99 = (np.percentile(lat, 50), np.percentile(lat, 99)) if lat else (0.0, 0.0)
    last = d["last"]
    pred = f"{LABELS[last[0]]:>3}° vs truth {LABELS[last[1]]:>3}°" if last and last[0] >= 0 else "no result yet"
    acc = 100.0 * d["correct"] / d["n"] if d["n"] else 0.0
    drops = " ".join(f"{o} {st.get(o, 0)}" for o in DROPS)
    print(f"{name}: {len(lat):3d} fps  e2e p50 {p50:6.2f} ms p99 {p99:6.2f} ms  drops {drops}  last {pred}  "
          f"accuracy {acc:5.1f}% of {d['n']}", flush=True)
