#!/usr/bin/env python3
"""The bgr24 path (ffmpeg's swscale converts each decoded frame to BGR in the producer, the daemon resizes
BGR) against the decoder's own YUV (i420, nv12: no conversion in the producer; the model's graph resizes
the YUV and converts at the model's size), from a 1080p H.264 file, in one run.

Each format: a fresh edgeinferd (the orientation model, its stream declared 1920x1080 in that format, the
lane on the last CPU) and `edgeinferctl feed --ffmpeg FILE --pixel-format FMT`, the file at its own rate
(25 fps), as a camera. After a warm-up, for a fixed window: the CPU time of the producer's process tree
(edgeinferctl and its ffmpeg) and of the daemon's (control plane, zygote, lane), from /proc, divided by the
results the window served. Printed per format, and each against bgr24; a JSON summary last.

Usage: bench/yuv.py [--quick] [--window S]   (needs `make models`; ffmpeg with libx264)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from edgeinfer import ring  # noqa: E402
from edgeinfer.models.verify import throwaway_signed_copy  # noqa: E402

W, H, FPS = 1920, 1080, 25
FORMATS = ("bgr24", "i420", "nv12")
TICK = os.sysconf("SC_CLK_TCK")


def source_file(seconds: int) -> str:
    """A 1080p H.264 file (testsrc2: moving colour, edges, text), made once and kept under build/."""
    path = os.path.join(ROOT, "build", "bench", f"testsrc2-1080p-{seconds}s.mp4")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=size={W}x{H}:rate={FPS}:duration={seconds}", "-c:v", "libx264", "-preset",
                        "veryfast", "-pix_fmt", "yuv420p", path + ".part.mp4"], check=True, timeout=600)
        os.replace(path + ".part.mp4", path)
    return path


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and every live descendant (their reaped children included, via cutime)."""
    parent, stat = {}, {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(p)] = int(fields[1])
        stat[int(p)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total = 0
    for p, ticks in stat.items():
        q = p
        while q > 1 and q != root:
            q = parent.get(q, 0)
        if q == root:
            total += ticks
    return total / TICK


def run_format(fmt: str, video: str, bundle: str, work: str, warmup_s: float, window_s: float) -> dict:
    stream = f"yuv-{fmt}-{uuid.uuid4().hex[:6]}"
    d = tempfile.mkdtemp(prefix=f"{fmt}-", dir=work)
    signed, trust = throwaway_signed_copy(bundle, d, "bench")
    ingress, results_sock = os.path.join(d, "in.sock"), os.path.join(d, "res.sock")
    lane_cpu = max(os.sched_getaffinity(0))
    uid = os.getuid()
    cfg = os.path.join(d, "edgeinferd.yaml")
    with open(cfg, "w") as f:
        f.write(f"model:\n  bundle: {signed}\n  trust_dir: {trust}\n  state_dir: {d}/state\n"
                f"streams:\n  - name: {stream}\n    producer: {{user: {uid}}}\n    readers: {{users: [{uid}]}}\n"
                f"    width: {W}\n    height: {H}\n    pixel_format: {fmt}\n    max_age_ms: 1000\n"
                f"lanes: [{{cpus: [{lane_cpu}]}}]\nruntime:\n  scheduling: fifo\n"
                f"ingress:\n  socket: {ingress}\n  results_socket: {results_sock}\nmetrics:\n  enabled: false\n")
    daemon = subprocess.Popen([sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferd_main as m; "
                               "sys.exit(m())", "--config", cfg, "--log-level", "warning"],
                              stdout=subprocess.PIPE, text=True)
    feed = reader = None
    try:
        line = daemon.stdout.readline().strip()
        if line != "edgeinferd: ready":
            raise RuntimeError(f"edgeinferd did not start: {line!r}")
        reader = ring.ResultReader.connect(stream, socket=results_sock)
        # bgr24 at the source's size: swscale converts only; yuv: the decoder's frames as they are.
        feed = subprocess.Popen([sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferctl_main as m; "
                                 "sys.exit(m())", "feed", "--ffmpeg", video, "--stream", stream, "--socket", ingress,
                                 "--pixel-format", fmt, "--loop"], stderr=subprocess.PIPE, text=True)

        def count_for(seconds: float) -> tuple[int, int]:
            got = errors = 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                rec = reader.read(0.2)
                if rec is not None:
                    got += rec.status == 0
                    errors += rec.status != 0
            return got, errors
        count_for(warmup_s)
        p0, d0 = tree_cpu_s(feed.pid), tree_cpu_s(daemon.pid)
        served, errors = count_for(window_s)
        p1, d1 = tree_cpu_s(feed.pid), tree_cpu_s(daemon.pid)
    finally:
        if feed is not None:
            feed.send_signal(signal.SIGTERM)
            try:
                feed.wait(10)
            except subprocess.TimeoutExpired:
                feed.kill()
        if reader is not None:
            reader.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(d, ignore_errors=True)
    if served == 0:
        raise RuntimeError(f"{fmt}: no result in the window (errors {errors})")
    return {"format": fmt, "served": served, "errors": errors, "window_s": window_s,
            "producer_ms": (p1 - p0) * 1e3 / served, "daemon_ms": (d1 - d0) * 1e3 / served,
            "total_ms": ((p1 - p0) + (d1 - d0)) * 1e3 / served}


def main() -> int:
    ap = argparse.ArgumentParser(description="bgr24 vs the decoder's YUV: CPU per frame, producer + daemon")
    ap.add_argument("--quick", action="store_true", help="short windows (a smoke run, not figures)")
    ap.add_argument("--window", type=float, default=None, help="seconds measured per format (default 20)")
    args = ap.parse_args()
    window = args.window or (3.0 if args.quick else 20.0)
    warmup = 2.0 if args.quick else 4.0
    video = source_file(4 if args.quick else 12)
    bundle = os.path.join(ROOT, "models", "bundles", "orientation")
    work = tempfile.mkdtemp(prefix="edgeinfer-yuv-bench-")
    try:
        rows = [run_format(fmt, video, bundle, work, warmup, window) for fmt in FORMATS]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]
    print(f"{W}x{H} H.264 at {FPS} fps (looped), orientation model 224x224, {window:g} s per format, CPU per result:")
    print(f"{'format':8} {'results':>8} {'producer':>10} {'daemon':>10} {'total':>10} {'vs bgr24':>9}")
    for r in rows:
        print(f"{r['format']:8} {r['served']:8d} {r['producer_ms']:8.2f}ms {r['daemon_ms']:8.2f}ms "
              f"{r['total_ms']:8.2f}ms {r['total_ms'] / base['total_ms']:8.2f}x")
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
