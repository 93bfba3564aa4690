#!/usr/bin/env python3
"""The MQTT bridge (edgeinfer-mqtt): what it adds to a result's way, what it sustains, what it costs, and what
a stalled broker does to the cameras.

One real edgeinferd with --streams streams of the tiny classifier (models/bundles/cls-tiny, 192x48: the model
costs little, so the bridge is what is measured), a camera process publishing on every stream at --fps and
reading every result itself (the lanes' latency, capture → result committed, from its own reader), a real
mosquitto on a loopback port, the real bridge (`edgeinferctl mqtt`, every result published, QoS 0), and a paho
subscriber to <prefix>/+/result in this process. Each round runs three windows of --seconds, side by side:
  none      the bridge not running: the lanes' latency with no bridge at all
  healthy   the bridge publishing every result: the added latency (result committed → the subscriber has it;
            split into committed → handed to the client, and → received), the rate published and received, the
            drops, and the bridge's CPU per 1,000 messages (utime + stime of its process over the window)
  stalled   the broker SIGSTOPped for the whole window (its TCP connection up, nothing read): the lanes'
            latency again, the bridge's drops, its queue and its RSS
The lanes' p99 in "healthy" and "stalled" is divided by "none" of the same round; the rounds' median and spread
are printed. The issue's target: stalled ÷ none ≤ 1.1.

Usage: bench/mqtt.py [--streams 63] [--fps 30.5] [--seconds 10] [--rounds 3] [--json FILE]   (root, make models)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from _cameras import Cameras  # noqa: E402
from _proc import cpu_ticks, process_tree  # noqa: E402


BUNDLE = os.path.join(ROOT, "models", "bundles", "cls-tiny")
WIDTH, HEIGHT = 192, 48
CTL = [sys.executable, "-c", "import sys; from edgeinfer.cli.ctl import edgeinferctl_main as m; sys.exit(m())"]
PHASES = ("none", "healthy", "stalled")
TICK = os.sysconf("SC_CLK_TCK")


def q(values, p: float) -> float | None:
    return float(np.percentile(values, p)) if len(values) else None


# ------------------------------------------------------------------ the broker, the bridge, the subscriber

class Broker:
    def __init__(self, work: str, children):
        from gateway_helpers import free_port
        self.port = free_port()
        conf = os.path.join(work, "mosquitto.conf")
        Path(conf).write_text(f"listener {self.port} 127.0.0.1\npersistence false\nallow_anonymous true\n"
                              "log_dest stderr\nuser root\nset_tcp_nodelay true\n")
        self.log = os.path.join(work, "mosquitto.log")
        mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = children.spawn([mosquitto, "-c", conf], stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while "running" not in Path(self.log).read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(Path(self.log).read_text())
            time.sleep(0.05)


class Bridge:
    def __init__(self, work: str, children, daemon_config: str, port: int, streams: int):
        doc = {"daemon_config": daemon_config, "node": "bench",
               "broker": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 1, "reconnect_max_s": 2},
               "streams": {f"s{i:02d}": {} for i in range(streams)},
               "metrics": {"listen": "127.0.0.1:0"}, "decisions": {"path": os.path.join(work, "decisions.db")}}
        config = os.path.join(work, "mqtt.yaml")
        Path(config).write_text(json.dumps(doc))
        self.log = Path(work) / f"bridge-{time.monotonic_ns()}.log"
        self.proc = children.spawn([*CTL, "mqtt", "--config", config], stdout=open(self.log, "a"),
                                   stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (m := re.search(r"metrics and health on (http://\S+)", self.log.read_text())):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-2000:])
            time.sleep(0.1)
        self.url = m.group(1)

    def metric(self, name: str, **labels) -> float:
        from gateway_helpers import metric
        return metric(self.url, name, **labels)

    def drops(self) -> dict[str, float]:
        """edgeinfer_mqtt_dropped_total by "kind/reason"."""
        import urllib.request
        from prometheus_client.parser import text_string_to_metric_families
        text = urllib.request.urlopen(self.url + "/metrics", timeout=5).read().decode()
        return {f"{s.labels['kind']}/{s.labels['reason']}": s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "edgeinfer_mqtt_dropped_total"}

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) / 1024

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)


class Subscriber:
    """<prefix>/+/result at QoS 0; per message: committed → published and published → received (µs, wall)."""

    def __init__(self, port: int):
        import paho.mqtt.client as mqtt
        self.lock = threading.Lock()
        self.rows: list[tuple[float, float]] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe("edgeinfer/+/result", qos=0)
        self.c.on_message = self._message
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()

    def _message(self, c, u, m) -> None:
        now = time.time_ns()
        d = json.loads(m.payload)
        committed = d["capture_ns"] + d["daemon_latency_ms"] * 1e6
        with self.lock:
            self.rows.append(((d["publish_ns"] - committed) / 1e3, (now - d["publish_ns"]) / 1e3))

    def take(self) -> list[tuple[float, float]]:
        with self.lock:
            rows, self.rows = self.rows, []
        return rows

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


# ------------------------------------------------------------------ one round

def window(cams: Cameras, seconds: float, procs: dict[str, int]) -> tuple[dict, dict]:
    """The cameras' window, and the share of one CPU each of `procs` (name → pid, with its descendants; -pid: the
    process alone) used in it, with "host": the share of all CPUs busy (anything, /proc/stat)."""
    trees = {k: process_tree(pid) if pid > 0 else [-pid] for k, pid in procs.items()}  # -pid: that process alone
    before = {k: cpu_ticks(pids) for k, pids in trees.items()}
    t0 = time.monotonic()
    lanes = cams.window(seconds)
    dt = time.monotonic() - t0
    after = {k: cpu_ticks(pids) for k, pids in trees.items()}
    use = {k: (after[k][1] - before[k][1]) / TICK / dt for k in trees}
    any_ = next(iter(trees))
    use["host"] = (after[any_][0] - before[any_][0]) / TICK / dt / os.cpu_count()
    lanes["published_per_s"] = lanes["published"] / seconds
    return lanes, use


def round_(cams: Cameras, work: str, children, config: str, broker: Broker, sub: Subscriber, daemon_pid: int,
           args) -> dict:
    out = {}
    procs = {"daemon": daemon_pid, "cameras": cams.proc.pid, "broker": broker.proc.pid, "subscriber": -os.getpid()}
    lanes, use = window(cams, args.seconds, procs)
    out["none"] = {"p50_us": q(lanes["lat_us"], 50), "p99_us": q(lanes["lat_us"], 99),
                   "published_per_s": lanes["published_per_s"], "read": lanes["read"], "cpu": use}

    bridge = Bridge(work, children, config, broker.port, args.streams)
    try:
        deadline = time.monotonic() + 20
        while bridge.metric("edgeinfer_mqtt_broker_connected") != 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the bridge did not connect")
            time.sleep(0.1)
        cams.window(1.0)   # warm: every stream attached, the subscriber receiving
        sub.take()
        m0 = {k: bridge.metric("edgeinfer_mqtt_published_total", kind="result") if k == "pub" else
              bridge.metric("edgeinfer_mqtt_dropped_total", kind="result") for k in ("pub", "drop")}
        procs["bridge"] = bridge.proc.pid
        cpu0 = bridge.cpu_s()
        lanes, use = window(cams, args.seconds, procs)
        cpu = bridge.cpu_s() - cpu0
        time.sleep(0.5)
        rows = sub.take()
        pub = bridge.metric("edgeinfer_mqtt_published_total", kind="result") - m0["pub"]
        drop = bridge.metric("edgeinfer_mqtt_dropped_total", kind="result") - m0["drop"]
        total = [a + b for a, b in rows]
        out["healthy"] = {"p50_us": q(lanes["lat_us"], 50), "p99_us": q(lanes["lat_us"], 99),
                          "offered_per_s": lanes["read"] / args.seconds, "published_per_s": pub / args.seconds,
                          "received_per_s": len(rows) / args.seconds, "dropped": drop,
                          "added_p50_us": q(total, 50), "added_p99_us": q(total, 99),
                          "bridge_p50_us": q([a for a, _ in rows], 50), "bridge_p99_us": q([a for a, _ in rows], 99),
                          "broker_p50_us": q([b for _, b in rows], 50), "broker_p99_us": q([b for _, b in rows], 99),
                          "cpu_ms_per_1000": 1e6 * cpu / pub if pub else None,
                          "cpu_share": cpu / args.seconds, "cameras_per_s": lanes["published_per_s"], "cpu": use}

        d0 = bridge.metric("edgeinfer_mqtt_dropped_total", kind="result")
        why0 = bridge.drops()
        rss0 = bridge.rss_mib()
        broker.proc.send_signal(signal.SIGSTOP)
        samples: list[tuple[float, float]] = []   # (queue, in flight) every 0.5 s of the stall
        done = threading.Event()

        def sample():
            while not done.wait(0.5):
                samples.append((bridge.metric("edgeinfer_mqtt_queue_messages"),
                                bridge.metric("edgeinfer_mqtt_inflight")))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            lanes, use = window(cams, args.seconds, {k: v for k, v in procs.items() if k != "broker"})
            done.set()
            sampler.join(5)
            depth = bridge.metric("edgeinfer_mqtt_queue_messages")
            rss = bridge.rss_mib()
            drop = bridge.metric("edgeinfer_mqtt_dropped_total", kind="result") - d0
            why = {k: v - why0.get(k, 0) for k, v in bridge.drops().items() if v - why0.get(k, 0)}
            connected = bridge.metric("edgeinfer_mqtt_broker_connected")
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        out["stalled"] = {"p50_us": q(lanes["lat_us"], 50), "p99_us": q(lanes["lat_us"], 99),
                          "read": lanes["read"], "dropped": drop, "queue": depth, "rss_mib": [rss0, rss],
                          "published_per_s": lanes["published_per_s"], "cpu": use, "dropped_by": why,
                          "connected_at_end": connected,
                          "queue_max": max((q for q, _ in samples), default=None),
                          "inflight_max": max((f for _, f in samples), default=None)}
    finally:
        bridge.stop()
    sub.take()
    time.sleep(1.0)
    return out


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        name = next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} CPUs"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=63)  # the most a daemon takes (config/schema.py STREAMS_MAX)
    ap.add_argument("--fps", type=float, default=30.5)  # 63 x 30.5 = 1,921 results/s: 64 cameras at 30 fps
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    from conftest import Children
    from daemon_helpers import start_daemon, write_config
    from edgeinfer.models.sign import self_sign
    work = tempfile.mkdtemp(prefix="bench-mqtt-")
    children = Children()
    cams = sub = None
    try:
        trust = os.path.join(work, "trust")
        os.makedirs(trust)
        signed = os.path.join(work, "signed")
        self_sign(BUNDLE, signed, trust, "bench-mqtt")
        streams = [{"name": f"s{i:02d}", "width": WIDTH, "height": HEIGHT} for i in range(args.streams)]
        # The cameras' reader and the bridge are both this user: two readers per stream.
        config = write_config(Path(work), signed, streams, trust_dir=trust, state_dir=os.path.join(work, "state"),
                              ingress={"max_readers_per_user": max(32, 2 * args.streams + 8)})
        try:
            daemon = start_daemon(children, config, log_file=os.path.join(work, "daemon.log"))
        except BaseException:
            print(Path(work, "daemon.log").read_text()[-3000:], file=sys.stderr)
            raise
        broker = Broker(work, children)
        cams = Cameras(args.streams, args.fps, daemon.ingress, daemon.results, WIDTH, HEIGHT)
        sub = Subscriber(broker.port)
        print(f"# bench/mqtt.py: {args.streams} streams x {args.fps:g} fps ({args.streams * args.fps:.0f} results/s), "
              f"{args.seconds:g} s windows, {args.rounds} rounds; {cpu_model()}", flush=True)
        rounds = []
        for r in range(args.rounds):
            rounds.append(round_(cams, work, children, config, broker, sub, daemon.pid, args))
            h, s, n = rounds[-1]["healthy"], rounds[-1]["stalled"], rounds[-1]["none"]
            if None in (n["p99_us"], h["p99_us"], s["p99_us"], h["added_p99_us"]):
                raise RuntimeError(f"round {r + 1}: a window with no results: {json.dumps(rounds[-1])}")
            print(f"round {r + 1}: lanes p99 none {n['p99_us']:.0f} µs, healthy {h['p99_us']:.0f}, stalled "
                  f"{s['p99_us']:.0f}; added p50/p99 {h['added_p50_us']:.0f}/{h['added_p99_us']:.0f} µs; published "
                  f"{h['published_per_s']:.0f}/s of {h['offered_per_s']:.0f}/s, received {h['received_per_s']:.0f}/s; "
                  f"CPU {h['cpu_ms_per_1000']:.0f} ms per 1,000 messages ({100 * h['cpu_share']:.0f} % of a CPU); "
                  f"stalled: dropped {s['dropped']:.0f} {s['dropped_by']}, queue {s['queue']:.0f} (max {s['queue_max']:.0f}, "
                  f"in flight max {s['inflight_max']:.0f}), still connected "
                  f"{s['connected_at_end']:.0f}, RSS {s['rss_mib'][0]:.0f} -> "
                  f"{s['rss_mib'][1]:.0f} MiB", flush=True)
            for ph in PHASES:
                c = rounds[-1][ph]["cpu"]
                print(f"  {ph}: cameras published {rounds[-1][ph]['published_per_s']:.0f}/s; CPU (share of one): "
                      + ", ".join(f"{k} {100 * v:.0f} %" for k, v in c.items() if k != "host")
                      + f"; host busy {100 * c['host']:.0f} % of {os.cpu_count()}", flush=True)
        summary = summarize(rounds)
        for line in summary["lines"]:
            print(line)
        if args.json:
            Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": summary["figures"]}, indent=1))
        print(json.dumps(summary["figures"]))
        return 0
    finally:
        for x in (sub, cams):
            if x is not None:
                x.close()
        children.cleanup()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def summarize(rounds: list[dict]) -> dict:
    def spread(key, phase="healthy"):
        v = [r[phase][key] for r in rounds if r[phase][key] is not None]
        return (float(np.median(v)), min(v), max(v)) if v else (None, None, None)

    def ratio(phase):
        v = [r[phase]["p99_us"] / r["none"]["p99_us"] for r in rounds]
        return float(np.median(v)), min(v), max(v)
    fig = {k: spread(k) for k in ("added_p50_us", "added_p99_us", "bridge_p50_us", "bridge_p99_us", "broker_p50_us",
                                  "broker_p99_us", "published_per_s", "received_per_s", "offered_per_s",
                                  "cpu_ms_per_1000", "cpu_share")}
    fig["lanes_p99_us"] = {p: spread("p99_us", p) for p in PHASES}
    fig["healthy_over_none_p99"] = ratio("healthy")
    fig["stalled_over_none_p99"] = ratio("stalled")
    f = lambda t, spec=".0f": f"{t[0]:{spec}} ({t[1]:{spec}}–{t[2]:{spec}})"  # noqa: E731
    lines = ["", "median (min–max) over the rounds:",
             f"  added latency, result committed → subscriber: p50 {f(fig['added_p50_us'])} µs, "
             f"p99 {f(fig['added_p99_us'])} µs",
             f"    of which committed → handed to the client p50 {f(fig['bridge_p50_us'])}, p99 "
             f"{f(fig['bridge_p99_us'])} µs; → received p50 {f(fig['broker_p50_us'])}, p99 {f(fig['broker_p99_us'])} µs",
             f"  sustained: offered {f(fig['offered_per_s'])}/s, published {f(fig['published_per_s'])}/s, received "
             f"{f(fig['received_per_s'])}/s",
             f"  bridge CPU: {f(fig['cpu_ms_per_1000'])} ms per 1,000 messages",
             f"  lanes' p99 (capture → committed): none {f(fig['lanes_p99_us']['none'])} µs, healthy "
             f"{f(fig['lanes_p99_us']['healthy'])}, stalled broker {f(fig['lanes_p99_us']['stalled'])}",
             f"  stalled ÷ none {f(fig['stalled_over_none_p99'], '.2f')} (target ≤ 1.1); healthy ÷ none "
             f"{f(fig['healthy_over_none_p99'], '.2f')}"]
    return {"figures": fig, "lines": lines}


if __name__ == "__main__":
    sys.exit(main())
