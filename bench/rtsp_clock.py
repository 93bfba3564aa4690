#!/usr/bin/env python3
"""What the sender's clock costs an RTSP camera: the producer's CPU per frame with PyAV's decoder child
(`--rtsp-clock sender`, the default: frames stamped by the RTCP sender reports) against the ffmpeg program
(`--rtsp-clock stream`), on the same live 1080p H.264 RTSP stream (GStreamer's server from tests/rtsp, 25 fps,
x264 zerolatency), alternated in one run.

Each measurement is `edgeinferctl feed --ffmpeg URL --frames N` (no daemon: the frames go into the ring), its
CPU from wait4 (the feed and its decoder child, which it reaps). Start-up (imports, connecting, the first key
frame) is taken out by difference: (CPU at N_LONG - CPU at N_SHORT) / (N_LONG - N_SHORT) is the marginal CPU per
frame. The sender arm also prints how old its frames were at arrival by the camera's clock (what anchoring on
the stream leaves out of the e2e latency).

Usage: bench/rtsp_clock.py [--quick] [--size 1920x1080] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "tests", "rtsp", "rtsp_server.py")
CLOCKS = ("sender", "stream")
_AGE = re.compile(r"stamped by the sender's clock .*: this one was (\d+) ms old")


def start_server(size: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["/usr/bin/python3", SERVER, str(port), size], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != f"READY {port}":
        proc.kill()
        raise RuntimeError(f"the RTSP server did not start: {line!r} {proc.stderr.read()[-500:]}")
    return proc, f"rtsp://127.0.0.1:{port}/cam"


def feed_cpu(url: str, clock: str, frames: int, work: str) -> tuple[float, str]:
    """(CPU seconds of the feed and its decoder, its stderr) for `frames` frames of the stream."""
    args = [sys.executable, "-m", "edgeinfer.cli", "feed", "--ffmpeg", url, "--stream", f"bench-{clock}",
            "--transport", "tcp", "--rtsp-clock", clock, "--frames", str(frames),
            "--socket", os.path.join(work, "nobody.sock"), "--wait", "0"]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
    if proc.returncode != 0 or f"published {frames} frames" not in text:
        raise RuntimeError(f"{clock}: the feed failed ({proc.returncode}): {text[-800:]}")
    return usage.ru_utime + usage.ru_stime, text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one round of 25/75 frames at 640x480 (a smoke run)")
    p.add_argument("--size", default="1920x1080")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    size, rounds, short, long_ = (("640x480", 1, 25, 75) if a.quick else (a.size, a.rounds, 50, 300))
    server, url = start_server(size)
    per_frame = {c: [] for c in CLOCKS}
    ages = []
    try:
        with tempfile.TemporaryDirectory(prefix="rtsp-clock-") as work:
            for r in range(rounds):
                for clock in (CLOCKS if r % 2 == 0 else CLOCKS[::-1]):
                    cpu_short, _ = feed_cpu(url, clock, short, work)
                    cpu_long, err = feed_cpu(url, clock, long_, work)
                    per_frame[clock].append((cpu_long - cpu_short) / (long_ - short))
                    if clock == "sender":
                        ages += [int(m.group(1)) for m in _AGE.finditer(err)]
                    print(f"round {r + 1} {clock:6}: {per_frame[clock][-1] * 1e3:6.2f} ms CPU/frame "
                          f"(start-up and {short} frames: {cpu_short:.2f} s)", flush=True)
    finally:
        server.kill()
        server.wait(10)
    med = {c: statistics.median(v) * 1e3 for c, v in per_frame.items()}
    print(f"\n{size} H.264 over RTSP/TCP, {rounds} round(s), {long_ - short} frames each, median producer CPU/frame:")
    for c in CLOCKS:
        print(f"  --rtsp-clock {c:6} {med[c]:6.2f} ms  ({med[c] / med['stream']:.2f} x the ffmpeg program)")
    if ages:
        print(f"  frames' age at arrival by the sender's clock (first stamped frame of each sender run): "
              f"{', '.join(f'{x} ms' for x in ages)}")
    print(json.dumps({"size": size, "rounds": rounds, "frames": long_ - short, "cpu_ms_per_frame": med,
                      "ratio_sender_to_stream": med["sender"] / med["stream"], "sender_age_ms": ages,
                      "machine": f"{os.cpu_count()} CPUs", "time": time.strftime("%Y-%m-%d %H:%M")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
