#!/usr/bin/env python3
"""The gateway's fronts against the local ABI path and against what a user would write instead.

Side by side in one run, on the orientation classifier (models/bundles/orientation, 224x224) and the detector
(models/bundles/detector, 416x416), one real edgeinferd (SCHED_FIFO lanes, one per CPU: its defaults) serving
both models to a local stream, a camera stream and a pool of 4 streams each, and the real edgeinfer-gateway
(`edgeinferctl gateway`) in front of the pools:
  local ABI        a FrameWriter/ResultReader pair on a stream of the same model, one frame in flight: latency
                   from before the frame is written to its result read
  gRPC front       tritonclient.grpc (sync infer, one client object per thread) at C concurrent clients, closed
                   loop: p50/p99 per request and the answered requests per second
  plain servicer   what a user would write instead (bench/_fronts_ref.py grpc): a grpcio servicer running ONNX
                   Runtime on the bundle's model.onnx in a ThreadPoolExecutor of one worker per CPU (one
                   intra-op thread each), numpy preprocessing, driven by the same tritonclient load
  Frigate front    (the detector) Frigate's zmq detector protocol from REQ clients, one socket per thread,
                   against the reference detector's design (bench/_fronts_ref.py zmq): one thread, a REP socket,
                   ONNX Runtime with its default threads
  150 % load       open loop: a scheduler thread fires requests at 1.5x the front's saturation throughput (the
                   best of its closed-loop rows) into a pool of client threads; answered latency (from the call's
                   start; "lag" is how late the load generator started calls), RESOURCE_EXHAUSTED counted as shed,
                   every other failure by its code. Beside it a camera (a process of its own, publishing at
                   --camera-fps on another stream of the same model): its processed/offered ratio during the load,
                   and alone just before (what the lanes give it with no load at all)
Every answer is checked for its shape (the front's rows, the 480 bytes of a Frigate reply). The gateway's
settings the load needs: max_waiting 12 per model (16 clients never shed: 4 in flight, 12 waiting),
max_inflight_per_client 4096 and max_streams_per_connection 1024 (every load thread comes from 127.0.0.1, on one
connection: one "client" to the front), Frigate's
timeout --frigate-timeout-ms (Frigate's own default, 200 ms, is below the detector's run time on a small host).

Usage: bench/fronts.py [--seconds S] [--models orientation,detector] [--clients 1,4,16] [--rows ROW,...]
                       [--camera-fps F] [--load X] [--json FILE]   (needs root and `make models`)
Rows: local, grpc, plain, frigate, zmq, overload. Prints a table per model, the issue's targets, and a JSON
summary as its last line.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from _proc import finish  # noqa: E402
from edgeinfer.abi import ring  # noqa: E402
from edgeinfer.abi.vocabulary import RESULT_OK  # noqa: E402
from edgeinfer.cameras.synthetic import make_frames  # noqa: E402

MODELS = {  # bundle dir → (name in edgeinferd.yaml, side, the front's rows output, values per row)
    "orientation": ("orient", 224, "classes", 2),
    "detector": ("det", 416, "detections", 6),
}
POOL_STREAMS = 4      # the pools' default (edgeinferd.yaml pools.NAME.streams)
MAX_WAITING = 12      # gateway models.NAME.max_waiting: 16 closed-loop clients are never shed
FRIGATE_REPLY = 20 * 6 * 4
ROWS = ("local", "grpc", "plain", "frigate", "zmq", "overload")
OPEN_LOOP_THREADS = 32  # the load's client threads: above what a front holds (4 + 12), so the excess is shed
now_ns = time.monotonic_ns


def q(lat_ns) -> dict:
    us = np.asarray(lat_ns, np.float64) / 1e3
    if len(us) == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None}
    return {"n": len(us), "mean": float(us.mean()), "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99))}


class Failed(Exception):
    """A request answered with an error (or not answered): code is the gRPC status name, or TIMEOUT."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


# ------------------------------------------------------------------ clients (one object per thread)

def grpc_caller(address: str, model: str, rows_name: str, width: int):
    """tritonclient.grpc, as a user writes it: an InferInput per request, sync infer."""
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException
    client = tc.InferenceServerClient(address)

    def call(frame: np.ndarray) -> None:
        inp = tc.InferInput("frame_rgb24", list(frame.shape), "UINT8")
        inp.set_data_from_numpy(frame)
        try:
            r = client.infer(model, [inp])
        except InferenceServerException as e:
            raise Failed(str(e.status()).replace("StatusCode.", "")) from None
        out = r.as_numpy(rows_name)
        if out is None or out.ndim != 2 or out.shape[1] != width:
            raise Failed("BAD_ANSWER")
    return call, client.close


def zmq_caller(ctx, endpoint: str, timeout_ms: int):
    """Frigate's zmq detector client: a REQ socket, send and receive timeouts, a new socket after a failure."""
    import zmq
    box = {}

    def fresh():
        if "s" in box:
            box["s"].close(0)
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.RCVTIMEO, timeout_ms)
        s.setsockopt(zmq.SNDTIMEO, timeout_ms)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        box["s"] = s
    fresh()

    def call(frame: np.ndarray) -> None:
        header = json.dumps({"shape": [1, *frame.shape], "dtype": "uint8", "model_type": "yolo-generic"}).encode()
        try:
            box["s"].send_multipart([header, frame.tobytes()])
            reply = box["s"].recv_multipart()
        except zmq.Again:
            fresh()
            raise Failed("TIMEOUT") from None
        if len(reply) == 1 and len(reply[0]) == FRIGATE_REPLY:
            return
        try:
            raise Failed(str(json.loads(reply[0]).get("code", "ERROR")))
        except ValueError:
            raise Failed("BAD_ANSWER") from None
    return call, lambda: box["s"].close(0)


# ------------------------------------------------------------------ loads

def local_path(ingress: str, results: str, stream: str, frames: list[np.ndarray], seconds: float) -> dict:
    """A camera's ring and a reader of its results, one frame in flight: write → publish → its record read."""
    h, w = frames[0].shape[:2]
    reader = ring.ResultReader.connect(stream, socket=results)
    writer = ring.FrameWriter.connect(stream, w, h, "rgb24", socket=ingress)
    lat, lost = [], 0
    try:
        def one(i: int) -> int | None:
            t = now_ns()
            np.copyto(writer.begin(), frames[i % len(frames)])
            fid = writer.publish(frame_id=i + 1)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                rec = reader.read(1.0)
                if rec is not None and rec.frame_id == fid:
                    return now_ns() - t if rec.status == RESULT_OK else None
            return None
        for i in range(3):  # warm-up
            one(i)
        end, i = time.monotonic() + seconds, 3
        t0 = time.monotonic()
        while time.monotonic() < end:
            x = one(i)
            i += 1
            if x is None:
                lost += 1
            else:
                lat.append(x)
        elapsed = time.monotonic() - t0
    finally:
        writer.close()
        reader.close()
    return {"clients": 1, **q(lat), "rps": len(lat) / elapsed, "errors": {"LOST": lost} if lost else {}}


def closed_loop(make, frames: list[np.ndarray], clients: int, seconds: float) -> dict:
    """`clients` threads, each with its own client object, each sending its next request when it has an answer."""
    lat = [[] for _ in range(clients)]
    errors = [collections.Counter() for _ in range(clients)]
    ready = threading.Barrier(clients + 1)
    window = {}

    def worker(k: int) -> None:
        call, close = make()
        try:
            for j in range(2):  # warm-up: the channel, the first requests
                try:
                    call(frames[(k + j) % len(frames)])
                except Failed:
                    pass
            ready.wait()
            ready.wait()
            end, i = window["end"], k
            while time.monotonic() < end:
                t = now_ns()
                try:
                    call(frames[i % len(frames)])
                    lat[k].append(now_ns() - t)
                except Failed as e:
                    errors[k][e.code] += 1
                i += 1
        finally:
            close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait(timeout=120)
    t0 = time.monotonic()
    window["end"] = t0 + seconds
    ready.wait()
    for t in threads:
        t.join(seconds + 120)
    elapsed = time.monotonic() - t0
    all_lat = [x for per in lat for x in per]
    errs = sum(errors, collections.Counter())
    return {"clients": clients, **q(all_lat), "rps": len(all_lat) / elapsed, "errors": dict(errs)}


def open_loop(make, frames: list[np.ndarray], rate: float, seconds: float) -> dict:
    """Requests fired at `rate` per second for `seconds` into a pool of client threads (each its own client):
    the answered ones' latency from the call's start, the failures by code, and how late calls started."""
    local = threading.local()
    closers, lock = [], threading.Lock()
    lat, lag, codes = [], [], collections.Counter()

    def fire(scheduled_ns: int, i: int) -> None:
        if not hasattr(local, "call"):
            local.call, close = make()
            with lock:
                closers.append(close)
        t = now_ns()
        try:
            local.call(frames[i % len(frames)])
            d = now_ns() - t
            with lock:
                lat.append(d)
                lag.append(t - scheduled_ns)
        except Failed as e:
            with lock:
                codes[e.code] += 1
                lag.append(t - scheduled_ns)

    def warm(barrier: threading.Barrier) -> None:  # every thread's client made and its channel up first
        local.call, close = make()
        with lock:
            closers.append(close)
        barrier.wait(60)
        try:
            local.call(frames[0])
        except Failed:
            pass

    n = max(1, int(rate * seconds))
    pool = ThreadPoolExecutor(OPEN_LOOP_THREADS, thread_name_prefix="load")
    try:
        barrier = threading.Barrier(OPEN_LOOP_THREADS)
        for f in [pool.submit(warm, barrier) for _ in range(OPEN_LOOP_THREADS)]:
            f.result(timeout=120)
        t0 = now_ns() + 50_000_000
        period = 1e9 / rate
        futs = []
        for i in range(n):
            at = t0 + int(i * period)
            delay = (at - now_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
            futs.append(pool.submit(fire, at, i))
        for f in futs:
            f.result(timeout=120)
        elapsed = (now_ns() - t0) / 1e9
    finally:
        pool.shutdown(wait=True)
        for close in closers:
            close()
    answered = q(lat)
    return {"rate": rate, "sent": n, "seconds": elapsed, "answered": answered,
            "answered_rps": len(lat) / elapsed, "shed": codes.pop("RESOURCE_EXHAUSTED", 0),
            "errors": dict(codes), "lag_p99_us": float(np.percentile(np.asarray(lag) / 1e3, 99)) if lag else None,
            "p99_over_p50": (answered["p99"] / answered["p50"]) if answered["n"] else None}


class Camera:
    """A synthetic camera, a process of its own (this script's --camera-child): connects, then publishes at `fps`
    between go() and stop(), any number of times, until close(); stop() returns what it published and how many
    results (status OK) it read."""

    def __init__(self, stream: str, side: int, fps: float, ingress: str, results: str):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--camera-child", stream, str(side),
                                      str(fps), ingress, results], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the camera did not connect: {line!r}")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> dict:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        out["ratio"] = out["processed"] / out["published"] if out["published"] else None
        return out

    def close(self) -> None:
        self.proc.stdin.close()  # the child's loop ends: it closes its ring and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def run_alone(self, seconds: float) -> dict:
        self.go()
        time.sleep(seconds)
        return self.stop()


def camera_child(stream: str, side: int, fps: float, ingress: str, results: str) -> int:
    frames = [f for f, _ in make_frames(side, side, pages=1, seed=7)]
    writer = ring.FrameWriter.connect(stream, side, side, "rgb24", socket=ingress)
    reader = ring.ResultReader.connect(stream, socket=results)
    print("ready", flush=True)
    period = 1.0 / fps
    ok = 0

    def drain(timeout: float) -> int:
        got = 0
        while (rec := reader.read(timeout)) is not None:
            got += rec.status == RESULT_OK
        return got
    for line in sys.stdin:
        if line.strip() != "go":
            break
        published = ok = 0
        next_t = time.monotonic()
        while True:
            delay = next_t - time.monotonic()
            if select.select([sys.stdin], [], [], max(delay, 0.0))[0]:
                sys.stdin.readline()  # stop
                break
            np.copyto(writer.begin(), frames[published % len(frames)])
            writer.publish(frame_id=published + 1)
            published += 1
            ok += drain(0.0)
            next_t += period
            late = time.monotonic() - next_t
            if late > 0:  # skips the slots it missed, never bursts
                next_t += (int(late / period) + 1) * period
        ok += drain(0.5)
        print(json.dumps({"published": published, "processed": ok}), flush=True)
    writer.close()
    reader.close()
    return 0


# ------------------------------------------------------------------ the daemon, the gateway, the references

class Served:
    """edgeinferd with both models (a local stream, a camera stream, a pool each) and the gateway in front."""

    def __init__(self, work: str, models: list[str], frigate_timeout_ms: int, frigate: bool, batch: int = 1,
                 max_waiting: int | None = MAX_WAITING, grpc: dict | None = None):
        from conftest import Children
        from daemon_helpers import start_daemon, write_config
        from edgeinfer.models.sign import self_sign
        from gateway_helpers import start_gateway, write_gateway_config
        self.work, self.children = work, Children()
        trust = os.path.join(work, "trust")
        os.makedirs(trust)
        uid = os.getuid()
        entries, streams, pools, fronts = {}, [], {}, {}
        for b in models:
            name, side, _, _ = MODELS[b]
            signed = os.path.join(work, "signed", b)
            self_sign(os.path.join(ROOT, "models", "bundles", b), signed, trust, f"bench-{b}")
            entries[name] = {"bundle": signed, "batch": batch} if batch > 1 else signed
            streams += [{"name": f"loc-{name}", "model": name, "width": side, "height": side, "max_age_ms": 1000},
                        {"name": f"cam-{name}", "model": name, "width": side, "height": side}]
            pools[f"gw-{name}"] = {"model": name, "user": uid, "streams": POOL_STREAMS}
            fronts[name] = {"max_waiting": max_waiting} if max_waiting is not None else {}
        config = write_config(Path(work), None, models=entries, streams=streams, pools=pools, trust_dir=trust,
                              state_dir=os.path.join(work, "state"))
        self.daemon = start_daemon(self.children, config, log_file=os.path.join(work, "daemon.log"))
        self.frigate_endpoint, front = None, None
        if frigate and "detector" in models:
            self.frigate_endpoint = f"ipc://{work}/frigate.sock"
            front = {"enabled": True, "endpoint": self.frigate_endpoint, "model": "det",
                     "timeout_ms": frigate_timeout_ms}
        gw_config, self.address = write_gateway_config(Path(work), config, models=fronts,
                                                       grpc={"max_inflight_per_client": 4096,
                                                             "max_streams_per_connection": 1024, **(grpc or {})},
                                                       frigate=front)
        self.gateway = start_gateway(self.children, gw_config, self.address,
                                     log_file=os.path.join(work, "gateway.log"))
        self.ingress, self.results = self.daemon.ingress, self.daemon.results

    def close(self) -> None:
        for p in (self.gateway, self.daemon):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    pass
        self.children.cleanup()


class Reference:
    """bench/_fronts_ref.py as a child: started, waited for ("ready"), stopped."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_fronts_ref.py"), *args],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the reference server did not start: {line!r}")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ one model

def measure(bundle: str, served: Served, rows: set[str], clients: list[int], seconds: float, args,
            zctx) -> dict:
    name, side, rows_name, width = MODELS[bundle]
    frames = [np.ascontiguousarray(f[:, :, ::-1]) for f, _ in make_frames(side, side, pages=2)]  # as RGB
    out, skipped = {}, {}

    def say(key: str, r: dict) -> None:
        out[key] = r
        print(f"  {bundle}: {key} done", file=sys.stderr, flush=True)

    if "local" in rows:
        say("local", local_path(served.ingress, served.results, f"loc-{name}", frames, seconds))
    if "grpc" in rows:
        for c in clients:
            say(f"grpc/{c}", closed_loop(lambda: grpc_caller(served.address, name, rows_name, width), frames, c,
                                         seconds))
    if "plain" in rows:
        port = free_port()
        ref = Reference("grpc", "--bundle", os.path.join(ROOT, "models", "bundles", bundle), "--port", str(port),
                        "--workers", str(args.ref_workers))
        try:
            for c in clients:
                say(f"plain/{c}", closed_loop(lambda: grpc_caller(f"127.0.0.1:{port}", name, rows_name, width),
                                              frames, c, seconds))
        finally:
            ref.close()
    timeout = args.frigate_timeout_ms
    if {"frigate", "zmq"} & rows and bundle != "detector":
        skipped["frigate"] = "Frigate's detector serves detection models only"
    elif "frigate" in rows:
        for c in clients:
            say(f"frigate/{c}", closed_loop(lambda: zmq_caller(zctx, served.frigate_endpoint, timeout), frames, c,
                                            seconds))
    if "zmq" in rows and bundle == "detector":
        endpoint = f"ipc://{served.work}/zmq-ref.sock"
        ref = Reference("zmq", "--bundle", os.path.join(ROOT, "models", "bundles", bundle), "--endpoint", endpoint)
        try:
            for c in clients:
                say(f"zmq/{c}", closed_loop(lambda: zmq_caller(zctx, endpoint, timeout), frames, c, seconds))
        finally:
            ref.close()
    if "overload" in rows:
        fronts = [("grpc", lambda: grpc_caller(served.address, name, rows_name, width))]
        if bundle == "detector" and "frigate" in rows:
            fronts.append(("frigate", lambda: zmq_caller(zctx, served.frigate_endpoint, timeout)))
        for front, make in fronts:
            sat = max((r["rps"] for k, r in out.items() if k.startswith(front + "/")), default=0.0)
            if not sat:
                skipped[f"{front}@load"] = f"needs the {front} rows (their saturation throughput)"
                continue
            cam = Camera(f"cam-{name}", side, args.camera_fps, served.ingress, served.results)
            try:
                alone = cam.run_alone(seconds)
                cam.go()
                try:
                    r = open_loop(make, frames, args.load * sat, seconds)
                finally:
                    r_cam = cam.stop()
            finally:
                cam.close()
            say(f"{front}@{args.load * 100:.0f}%", {**r, "saturation_rps": sat, "camera_fps": args.camera_fps,
                                                     "camera": r_cam, "camera_alone": alone})
    return {"rows": out, "skipped": skipped}


def targets(res: dict, load_key: str) -> dict:
    rows = res["rows"]
    t = {}
    best = {k: max((r["rps"] for key, r in rows.items() if key.startswith(k + "/")), default=None)
            for k in ("grpc", "plain", "frigate", "zmq")}
    if "local" in rows and "grpc/1" in rows and rows["grpc/1"]["n"] and rows["local"]["n"]:
        d = rows["grpc/1"]["p50"] - rows["local"]["p50"]
        t["grpc_p50_over_local_us"] = d
        t["grpc_p50_met"] = d <= 250
    if best["grpc"] and best["plain"]:
        t["grpc_saturation_over_plain"] = best["grpc"] / best["plain"]
        t["grpc_saturation_met"] = t["grpc_saturation_over_plain"] >= 0.9
    if best["frigate"] and best["zmq"]:
        t["frigate_saturation_over_zmq"] = best["frigate"] / best["zmq"]
    for front in ("grpc", "frigate"):
        r = rows.get(f"{front}@{load_key}")
        if r and r["p99_over_p50"] is not None:
            t[f"{front}_load_p99_over_p50"] = r["p99_over_p50"]
            t[f"{front}_load_p99_met"] = r["p99_over_p50"] <= 3
        if r and r["camera"]["ratio"] is not None:
            t[f"{front}_load_camera_ratio"] = r["camera"]["ratio"]
            t[f"{front}_load_camera_met"] = r["camera"]["ratio"] >= 0.9
    return t


LABELS = {"local": "local ABI (FrameWriter/ResultReader)", "grpc": "gRPC front (tritonclient)",
          "plain": "plain grpcio servicer + ORT", "frigate": "Frigate front (REQ)",
          "zmq": "ZeroMQ REP + ORT (reference)"}


def fmt(x, spec: str = ".0f", unit: str = "") -> str:
    return "—" if x is None else format(x, spec) + unit


def report(bundle: str, res: dict, t: dict, seconds: float, load_key: str) -> None:
    side = MODELS[bundle][1]
    rows = res["rows"]
    local = rows.get("local", {}).get("p50")
    print(f"\n{bundle} ({side}x{side}), {seconds:g} s per row (latency µs, throughput requests/s)")
    print(f"{'path':<38}{'clients':>8}{'p50':>10}{'p99':>10}{'req/s':>9}{'p50 ÷ local':>13}  errors")
    for key, r in rows.items():
        if "@" in key:
            continue
        kind = key.split("/")[0]
        ratio = f"{r['p50'] / local:.2f}×" if local and r.get("p50") else "—"
        print(f"{LABELS[kind]:<38}{r['clients']:>8}{fmt(r['p50']):>10}{fmt(r['p99']):>10}{r['rps']:>9.1f}"
              f"{ratio:>13}  {r['errors'] or ''}")
    for front in ("grpc", "frigate"):
        r = rows.get(f"{front}@{load_key}")
        if not r:
            continue
        a, cam, alone = r["answered"], r["camera"], r["camera_alone"]
        print(f"{LABELS[front]} at {load_key} of {r['saturation_rps']:.1f} req/s: {r['sent']} sent at "
              f"{r['rate']:.1f}/s, {a['n']} answered ({r['answered_rps']:.1f}/s) p50 {fmt(a['p50'])} µs p99 "
              f"{fmt(a['p99'])} µs (p99 ÷ p50 {fmt(r['p99_over_p50'], '.2f')}), shed {r['shed']}, other "
              f"{r['errors'] or 0}, load generator lag p99 {fmt(r['lag_p99_us'])} µs; camera ({r['camera_fps']:g} "
              f"fps) processed/offered {cam['processed']}/{cam['published']} = {fmt(_pct(cam['ratio']), '.0f')} % "
              f"(alone: {alone['processed']}/{alone['published']} = {fmt(_pct(alone['ratio']), '.0f')} %)")
    if res["skipped"]:
        for k, why in res["skipped"].items():
            print(f"skipped {k}: {why}")
    print(f"targets ({bundle}):")

    def line(text: str, key: str, value: str) -> None:
        met = t.get(key)
        print(f"  {text:<58} {value:>12}  {'—' if met is None else ('met' if met else 'NOT met')}")
    line("gRPC front p50 (1 client) − local p50 ≤ 250 µs", "grpc_p50_met",
         fmt(t.get("grpc_p50_over_local_us"), ".0f", " µs"))
    line("gRPC front saturation ≥ 0.9× plain servicer's", "grpc_saturation_met",
         fmt(t.get('grpc_saturation_over_plain'), ".2f", "×"))
    line(f"at {load_key}: answered p99 ≤ 3× p50 (gRPC)", "grpc_load_p99_met",
         fmt(t.get('grpc_load_p99_over_p50'), ".2f", "×"))
    line(f"at {load_key}: camera processed/offered ≥ 90 % (gRPC)", "grpc_load_camera_met",
         fmt(_pct(t.get('grpc_load_camera_ratio')), ".0f", " %"))
    if bundle == "detector":
        print(f"  (Frigate front, no target of the issue: saturation ÷ ZeroMQ REP "
              f"{fmt(t.get('frigate_saturation_over_zmq'), '.2f', '×')}; at {load_key} p99 ÷ p50 "
              f"{fmt(t.get('frigate_load_p99_over_p50'), '.2f', '×')}, camera "
              f"{fmt(_pct(t.get('frigate_load_camera_ratio')), '.0f', ' %')})")


def _pct(x):
    return None if x is None else 100 * x


# ------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per row (default 5: about 3-4 min)")
    ap.add_argument("--models", default="orientation,detector")
    ap.add_argument("--clients", default="1,4,16", help="concurrent clients of the closed-loop rows")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    ap.add_argument("--camera-fps", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=1, help="models.NAME.batch of the daemon (micro-batching the "
                    "pool's ready requests; the detector has a fixed batch of 1)")
    ap.add_argument("--load", type=float, default=1.5, help="open-loop load, times the saturation throughput")
    ap.add_argument("--ref-workers", type=int, default=os.cpu_count(), help="the plain servicer's threads")
    ap.add_argument("--frigate-timeout-ms", type=int, default=5000,
                    help="the Frigate front's timeout_ms and its clients' (Frigate's default: 200)")
    ap.add_argument("--json", metavar="FILE", help="also write the JSON summary there")
    ap.add_argument("--camera-child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.camera_child:
        s, side, fps, ingress, results = a.camera_child
        return camera_child(s, int(side), float(fps), ingress, results)
    models = [m for m in a.models.split(",") if m]
    rows = {r for r in a.rows.split(",") if r}
    clients = [int(c) for c in a.clients.split(",") if c]
    if bad := [m for m in models if m not in MODELS] + [r for r in rows if r not in ROWS]:
        ap.error(f"unknown: {', '.join(bad)}")
    if os.geteuid() != 0:
        print("bench/fronts.py needs root (the daemon's SCHED_FIFO lanes)", file=sys.stderr)
        return 2
    for m in models:
        if not os.path.exists(os.path.join(ROOT, "models", "bundles", m, "model.onnx")):
            print(f"models/bundles/{m} is missing: make models", file=sys.stderr)
            return 2
    import zmq
    load_key = f"{a.load * 100:.0f}%"
    summary = {"machine": f"{os.cpu_count()} CPUs, {os.uname().release}", "seconds": a.seconds, "clients": clients,
               "camera_fps": a.camera_fps, "load": a.load, "batch": a.batch, "models": {}, "skipped": {}}
    if "frigate" in rows and not os.path.exists(os.path.join(ROOT, "daemon", "edgeinfer", "fronts", "frigate.py")):
        rows.discard("frigate")
        summary["skipped"]["frigate"] = "no Frigate front"
        print("skipped: no Frigate front")
    work = tempfile.mkdtemp(prefix="edgeinfer-fronts-", dir="/tmp")
    os.chmod(work, 0o755)
    zctx = zmq.Context()
    served = None
    t_start = time.monotonic()
    try:
        served = Served(work, models, a.frigate_timeout_ms, frigate="frigate" in rows, batch=a.batch)
        for m in models:
            res = measure(m, served, rows, clients, a.seconds, a, zctx)
            t = targets(res, load_key)
            summary["models"][m] = {**res, "targets": t}
            report(m, res, t, a.seconds, load_key)
    finally:
        if served is not None:
            served.close()
        zctx.destroy(linger=0)
        shutil.rmtree(work, ignore_errors=True)
    return finish(summary, t_start, a.json)


if __name__ == "__main__":
    sys.exit(main())
