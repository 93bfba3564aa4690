#!/usr/bin/env python3
"""What shedding costs the gateway: goodput under overload from clients that retry at once, and one refusal's CPU.

One real edgeinferd (its defaults: SCHED_FIFO lanes, one per CPU) serving the orientation classifier
(models/bundles/orientation, 224x224) to a pool of 4 streams, and the real edgeinfer-gateway
(`edgeinferctl gateway`) in front of it with the pool's default max_waiting (4: 8 requests held at most, the
rest shed). The clients are tritonclient.grpc (sync infer, one client object per thread) in --procs processes of
--threads threads each, niced to 10 so that on a small host they queue behind the gateway (nice 0) and the lanes
(SCHED_FIFO) rather than starve them; their CPU is reported too. In ONE run, --rounds times, interleaved:
  capacity   closed loop: 8 clients (4 rings + 4 waiting: never shed), each sending its next request when it has an
             answer: answered/s is the capacity C
  100 %, 150 %, 300 %
             open loop at that share of C (each client thread its own schedule), and every request refused
             (RESOURCE_EXHAUSTED or UNAVAILABLE) sent again AT ONCE, the worst honest client, until answered or
             --give-up seconds after its scheduled start (then counted abandoned); in two client models (--clients):
               budget  each attempt's deadline (client_timeout) is what is left of --give-up: deadline propagation,
                       so a late retry carries a short deadline
               fixed   each attempt its own client_timeout (--attempt-timeout, 1 s), --give-up checked between
                       attempts: tritonclient as usually called in a retry loop ("150% fixed" in the tables)
  refusal    the direct cost of one refusal: the daemon stopped (SIGSTOP), 8 requests hold the pool (4 rings, 4
             waiting), then a burst of requests that are all shed; the gateway's CPU per refusal
Per window: answered/s (goodput), refused/s, goodput ÷ the best window of its round, the gateway's, the daemon's
and the clients' CPU seconds per answered and per refused request (utime + stime of every thread, /proc/PID/stat:
"per answered" is the window's CPU ÷ answered, "per refused" the window's CPU ÷ refused, both the whole window's),
the steal of the window (/proc/stat, % of the machine's time) and the load average at its end (the host may be
shared).

Usage: bench/shedding.py [--seconds S] [--rounds N] [--procs P] [--threads T] [--loads 1,1.5,3] [--json FILE]
                         [--clients budget,fixed] [--attempt-timeout S] [--quick]   (needs root and `make models`)
Prints a table per round, the median and spread over rounds, the target (goodput at 150 % and 300 % within 10 %
of the best), and a JSON summary as its last line.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

BUNDLE, MODEL, SIDE, OUTPUT = "orientation", "orient", 224, "classes"
POOL_STREAMS = 4
HELD = 2 * POOL_STREAMS  # the pool's rings and its default max_waiting: what the gateway holds before it sheds
RETRY = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
CLIENT_NICE = 10


# ------------------------------------------------------------------ the client processes

def client_child(address: str, threads: int) -> int:
    """--client-child: `threads` tritonclient threads; per line of stdin (a JSON window) a JSON line of counts."""
    os.nice(CLIENT_NICE)
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException
    rng = np.random.default_rng(os.getpid())
    clients = [tc.InferenceServerClient(address) for _ in range(threads)]
    inputs = []
    for _ in range(threads):
        inp = tc.InferInput("frame_rgb24", [SIDE, SIDE, 3], "UINT8")
        inp.set_data_from_numpy(rng.integers(0, 256, (SIDE, SIDE, 3), np.uint8))
        inputs.append(inp)

    def call(k: int, timeout: float) -> str:
        try:
            r = clients[k].infer(MODEL, [inputs[k]], client_timeout=timeout)
        except InferenceServerException as e:
            return str(e.status()).replace("StatusCode.", "")
        out = r.as_numpy(OUTPUT)
        return "OK" if out is not None and out.ndim == 2 else "BAD_ANSWER"

    for k in range(threads):  # channels up
        call(k, 30.0)
    print("ready", flush=True)
    for line in sys.stdin:
        w = json.loads(line)
        counts = [collections.Counter() for _ in range(threads)]
        lat = [[] for _ in range(threads)]
        budgets = [[] for _ in range(threads)]  # each attempt's client_timeout (open loop)

        def worker(k: int) -> None:
            c, end, give_up, attempt = counts[k], w["end"], w["give_up"], w.get("attempt")
            if w["rate"] is None:  # closed loop: the next request when the last is answered (or refused)
                while time.monotonic() < end:
                    t = time.monotonic()
                    code = call(k, 10.0)
                    c["offered"] += 1
                    c[code] += 1
                    if code == "OK":
                        lat[k].append(time.monotonic() - t)
                return
            period = 1.0 / w["rate"]
            next_t = w["start"] + period * (w["phase"] + k) / threads
            while next_t < end:
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                c["offered"] += 1
                while True:  # this request until answered: refused → again at once
                    now = time.monotonic()
                    if now >= end:
                        c["unfinished"] += 1
                        break
                    if now - next_t > give_up:
                        c["abandoned"] += 1
                        break
                    # budget: each attempt's deadline is what is left of give_up (deadline propagation);
                    # fixed: each attempt its own client_timeout, give_up checked between attempts
                    timeout = attempt if attempt else max(0.05, give_up - (now - next_t))
                    budgets[k].append(timeout)
                    code = call(k, timeout)
                    if code in RETRY:
                        c["refused"] += 1
                        continue
                    c[code] += 1
                    if code == "OK":
                        lat[k].append(time.monotonic() - next_t)
                    break
                if time.monotonic() >= end:
                    break
                next_t += period

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        delay = w["start"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        total = sum(counts, collections.Counter())
        b = np.asarray([x for per in budgets for x in per], np.float64)
        print(json.dumps({"counts": dict(total), "lat": [x for per in lat for x in per],
                          "budget_p50": float(np.median(b)) if len(b) else None,
                          "budget_short": int((b < 0.1).sum()), "attempts": len(b)}), flush=True)
    for c in clients:
        c.close()
    return 0


class Clients:
    """The client processes (this script's --client-child), niced; windows run in all of them at once."""

    def __init__(self, address: str, procs: int, threads: int):
        self.threads = threads
        self.procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client-child", address,
                                        str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for _ in range(procs)]
        for p in self.procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                self.close()
                raise RuntimeError(f"a client process did not start: {line!r}")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def window(self, rate: float | None, seconds: float, give_up: float, only: int | None = None,
               attempt: float | None = None) -> dict:
        """All (or the first `only`) processes: closed loop (rate None) or open loop at `rate` per second in all;
        attempt: each attempt's client_timeout (the fixed client), None: what is left of give_up (the budget one)."""
        procs = self.procs[:only] if only else self.procs
        start = time.monotonic() + 0.2
        for i, p in enumerate(procs):
            per = None if rate is None else rate / len(procs) / self.threads  # each thread's own rate
            p.stdin.write(json.dumps({"rate": per, "start": start, "end": start + seconds, "give_up": give_up,
                                      "attempt": attempt, "phase": i / len(procs)}) + "\n")
            p.stdin.flush()
        time.sleep(0.2)
        outs = [json.loads(p.stdout.readline()) for p in procs]
        counts = sum((collections.Counter(o["counts"]) for o in outs), collections.Counter())
        p50 = [o.get("budget_p50") for o in outs if o.get("budget_p50") is not None]
        return {"counts": dict(counts), "lat": [x for o in outs for x in o["lat"]],
                "budget_p50": float(np.median(p50)) if p50 else None,
                "budget_short": sum(o.get("budget_short", 0) for o in outs),
                "attempts": sum(o.get("attempts", 0) for o in outs)}

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
                p.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                p.kill()
                p.wait(5)


# ------------------------------------------------------------------ CPU accounting

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_ticks(pids: list[int]) -> int:
    """Clock ticks of `pids` and their descendants."""
    from _proc import pid_ticks, process_tree
    return pid_ticks({p for root in pids for p in process_tree(root)})


def machine_ticks() -> tuple[int, int]:
    """(all ticks of all CPUs, steal ticks) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v), v[7]


def gateway_counts(url: str | None) -> collections.Counter:
    """The gateway's own count of its answers by code (code:X) and of its refusals by reason (why:X), gRPC front."""
    out = collections.Counter()
    if url is None:
        return out
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for smp in family.samples:
            if smp.labels.get("front") != "grpc":
                continue
            if smp.name == "edgeinfer_front_requests_total":
                out["code:" + smp.labels["code"]] += int(smp.value)
            elif smp.name == "edgeinfer_front_refusals_total":
                out["why:" + smp.labels["reason"]] += int(smp.value)
    return out


class Meter:
    """CPU seconds of the gateway, the daemon and the clients over a window, the machine's steal, and the gateway's
    own counts (its answers by code, its refusals by reason)."""

    metrics_url: str | None = None

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups

    def __enter__(self):
        self.g0 = gateway_counts(self.metrics_url)
        self.t0 = time.monotonic()
        self.m0 = machine_ticks()
        self.p0 = {k: proc_ticks(v) for k, v in self.groups.items()}
        return self

    def __exit__(self, *exc):
        self.elapsed = time.monotonic() - self.t0
        m1 = machine_ticks()
        self.cpu_s = {k: (proc_ticks(v) - self.p0[k]) / CLK_TCK for k, v in self.groups.items()}
        total = m1[0] - self.m0[0]
        self.steal_pct = 100.0 * (m1[1] - self.m0[1]) / total if total else 0.0
        g = gateway_counts(self.metrics_url)
        g.subtract(self.g0)
        self.gateway = {k: v for k, v in sorted(g.items()) if v}


# ------------------------------------------------------------------ windows

def row(name: str, res: dict, meter: Meter, seconds: float) -> dict:
    c = res["counts"]
    answered, refused = c.get("OK", 0), c.get("refused", 0) + sum(c.get(k, 0) for k in RETRY)
    lat = np.asarray(res["lat"], np.float64) * 1e3
    per = {}
    for k, cpu in meter.cpu_s.items():
        per[k] = {"cpu_s": cpu, "ms_per_answered": 1e3 * cpu / answered if answered else None,
                  "ms_per_refused": 1e3 * cpu / refused if refused else None}
    other = {k: v for k, v in c.items() if k not in ("OK", "refused", "offered", *RETRY)}
    return {"window": name, "seconds": seconds, "offered": c.get("offered", 0), "answered": answered,
            "refused": refused, "goodput": answered / seconds, "refused_per_s": refused / seconds, "other": other,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
            "cpu": per, "steal_pct": meter.steal_pct, "load1": os.getloadavg()[0], "gateway_said": meter.gateway,
            "budget_p50_ms": None if res.get("budget_p50") is None else 1e3 * res["budget_p50"],
            "attempts": res.get("attempts", 0), "attempts_under_100ms": res.get("budget_short", 0)}


def refusal_burst(served, clients: Clients, groups: dict, seconds: float) -> dict:
    """The daemon stopped; 8 requests hold the pool (4 rings, 4 waiting); a burst of requests all shed."""
    import tritonclient.grpc as tc
    from _proc import process_tree
    holders_done = []
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)

    def hold() -> None:
        c = tc.InferenceServerClient(served.address)
        inp = tc.InferInput("frame_rgb24", [SIDE, SIDE, 3], "UINT8")
        inp.set_data_from_numpy(frame)
        try:
            c.infer(MODEL, [inp], client_timeout=seconds + 3.0)
        except Exception:
            pass
        finally:
            holders_done.append(1)
            c.close()

    daemon = process_tree(served.daemon.pid)
    for pid in daemon:
        os.kill(pid, signal.SIGSTOP)
    try:
        holders = [threading.Thread(target=hold) for _ in range(HELD)]
        for t in holders:
            t.start()
        time.sleep(0.5)  # the holders' requests are in the rings and in line
        with Meter(groups) as m:
            res = clients.window(None, seconds, 0.0)  # closed loop: every answer is a refusal
        c = res["counts"]
    finally:
        for pid in daemon:
            os.kill(pid, signal.SIGCONT)
    for t in holders:
        t.join(seconds + 10)
    refused = sum(c.get(k, 0) for k in RETRY)
    return {"window": "refusal", "seconds": seconds, "refused": refused, "other": {k: v for k, v in c.items()
                                                                                  if k not in (*RETRY, "offered")},
            "refused_per_s": refused / m.elapsed,
            "cpu": {k: {"cpu_s": v, "ms_per_refused": 1e3 * v / refused if refused else None}
                    for k, v in m.cpu_s.items()}, "steal_pct": m.steal_pct}


def window_name(load: float, model: str) -> str:
    return f"{load * 100:.0f}%" + ("" if model == "budget" else f" {model}")


def one_round(served, clients: Clients, groups: dict, loads: list[float], seconds: float, give_up: float,
              capacity_procs: int, models: list[str], attempt: float) -> dict:
    rows = {}
    with Meter(groups) as m:
        res = clients.window(None, seconds, give_up, only=capacity_procs)
    rows["capacity"] = row("capacity", res, m, seconds)
    cap = rows["capacity"]["goodput"]
    for model in models:
        for x in loads:
            name = window_name(x, model)
            with Meter(groups) as m:
                res = clients.window(x * cap, seconds, give_up, attempt=attempt if model == "fixed" else None)
            rows[name] = row(name, res, m, seconds)
            rows[name]["rate"] = x * cap
    best = max(r["goodput"] for r in rows.values())
    for r in rows.values():
        r["of_best"] = r["goodput"] / best if best else None
    return {"capacity": cap, "best": best, "rows": rows}


def fmt(x, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def print_round(i: int, rnd: dict) -> None:
    print(f"\nround {i + 1}: capacity {rnd['capacity']:.1f} answered/s (CPU ms per answered | per refused)")
    print(f"{'window':<12}{'offered/s':>10}{'goodput':>9}{'refused/s':>10}{'÷best':>7}{'p50ms':>7}{'p99ms':>7}"
          f"{'gateway':>16}{'daemon':>14}{'clients':>16}{'steal%':>8}{'load1':>6}  other")
    for k, r in rnd["rows"].items():
        cpu = r["cpu"]
        cells = [f"{fmt(cpu[g]['ms_per_answered'])}|{fmt(cpu[g]['ms_per_refused'])}" for g in
                 ("gateway", "daemon", "clients")]
        print(f"{k:<12}{r['offered'] / r['seconds']:>10.1f}{r['goodput']:>9.1f}{r['refused_per_s']:>10.1f}"
              f"{fmt(r['of_best'], '.2f'):>7}{fmt(r['p50_ms'], '.0f'):>7}{fmt(r['p99_ms'], '.0f'):>7}"
              f"{cells[0]:>16}{cells[1]:>14}{cells[2]:>16}{r['steal_pct']:>8.1f}{r['load1']:>6.1f}  {r['other'] or ''}")
    print("  the gateway's own counts per window (its answers by code, its refusals by reason) and the clients' "
          "attempts (median client_timeout, share under 100 ms):")
    for k, r in rnd["rows"].items():
        share = r["attempts_under_100ms"] / r["attempts"] if r["attempts"] else 0.0
        print(f"  {k:<12}{fmt(r['budget_p50_ms'], '.0f'):>6} ms {100 * share:>4.0f} %  {r['gateway_said']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per window (default 8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4, help="client processes (default 4)")
    ap.add_argument("--threads", type=int, default=8, help="client threads per process (default 8: 32 clients)")
    ap.add_argument("--loads", default="1,1.5,3", help="offered loads, times the capacity")
    ap.add_argument("--give-up", type=float, default=2.0, help="a client abandons a request after retrying it this "
                    "long (seconds)")
    ap.add_argument("--clients", default="budget,fixed", help="client models: budget (each attempt's deadline "
                    "what is left of --give-up) and/or fixed (each attempt --attempt-timeout)")
    ap.add_argument("--attempt-timeout", type=float, default=1.0, help="the fixed client's client_timeout per "
                    "attempt (seconds)")
    ap.add_argument("--burst-seconds", type=float, default=3.0, help="the all-refused burst's window")
    ap.add_argument("--quick", action="store_true", help="one short round (a smoke run)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--client-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client_child:
        return client_child(a.client_child[0], int(a.client_child[1]))
    if a.quick:
        a.seconds, a.rounds, a.procs, a.threads, a.burst_seconds = 1.0, 1, 2, 8, 1.0
    loads = [float(x) for x in a.loads.split(",") if x]
    models = [x for x in a.clients.split(",") if x]
    if not models or any(x not in ("budget", "fixed") for x in models):
        ap.error("--clients: budget and/or fixed")
    if os.geteuid() != 0:
        print("bench/shedding.py needs root (the daemon's SCHED_FIFO lanes)", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(ROOT, "models", "bundles", BUNDLE, "model.onnx")):
        print(f"models/bundles/{BUNDLE} is missing: make models", file=sys.stderr)
        return 2
    from fronts import Served
    with open("/proc/cpuinfo") as f:
        cpu_model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    summary = {"machine": f"{cpu_model}, {os.cpu_count()} CPUs, {os.uname().release}", "seconds": a.seconds,
               "load_at_start": os.getloadavg(), "client_models": models, "attempt_timeout_s": a.attempt_timeout,
               "clients": f"{a.procs} processes x {a.threads} threads, nice {CLIENT_NICE}", "rounds": []}
    work = tempfile.mkdtemp(prefix="edgeinfer-shedding-", dir="/tmp")
    os.chmod(work, 0o755)
    served = clients = None
    t_start = time.monotonic()
    try:
        served = Served(work, [BUNDLE], 5000, frigate=False, max_waiting=None)
        clients = Clients(served.address, a.procs, a.threads)
        groups = {"gateway": [served.gateway.pid], "daemon": [served.daemon.pid], "clients": clients.pids}
        from gateway_helpers import gateway_metrics_url
        Meter.metrics_url = gateway_metrics_url(served.gateway)
        capacity_procs = max(1, HELD // a.threads) if a.threads <= HELD else 1
        print(f"{summary['machine']}; clients {summary['clients']}; capacity with "
              f"{capacity_procs * a.threads} closed-loop clients; {a.seconds:g} s windows; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for i in range(a.rounds):
            rnd = one_round(served, clients, groups, loads, a.seconds, a.give_up, capacity_procs, models,
                            a.attempt_timeout)
            rnd["refusal"] = refusal_burst(served, clients, groups, a.burst_seconds)
            summary["rounds"].append(rnd)
            print_round(i, rnd)
            b = rnd["refusal"]
            print(f"refusal burst (daemon stopped, pool held): {b['refused']} refused in {b['seconds']:g} s "
                  f"({b['refused_per_s']:.0f}/s); CPU ms per refusal: gateway "
                  f"{fmt(b['cpu']['gateway']['ms_per_refused'], '.2f')}, clients "
                  f"{fmt(b['cpu']['clients']['ms_per_refused'], '.2f')}; steal {b['steal_pct']:.1f} %; "
                  f"other {b['other'] or 0}")
    finally:
        if clients is not None:
            clients.close()
        if served is not None:
            served.close()
        shutil.rmtree(work, ignore_errors=True)
    keys = list(summary["rounds"][0]["rows"])
    agg = {}
    for k in keys:
        of_best = [r["rows"][k]["of_best"] for r in summary["rounds"]]
        good = [r["rows"][k]["goodput"] for r in summary["rounds"]]
        agg[k] = {"goodput_median": float(np.median(good)), "goodput_min": min(good), "goodput_max": max(good),
                  "of_best_median": float(np.median(of_best)), "of_best_min": min(of_best)}
    per_ref = [r["refusal"]["cpu"]["gateway"]["ms_per_refused"] for r in summary["rounds"]
               if r["refusal"]["cpu"]["gateway"]["ms_per_refused"] is not None]
    summary["aggregate"] = agg
    summary["refusal_gateway_ms"] = {"median": float(np.median(per_ref)), "min": min(per_ref),
                                     "max": max(per_ref)} if per_ref else None
    print(f"\nover {a.rounds} round(s): goodput median [min, max] answered/s, ÷ best median [min]")
    for k, v in agg.items():
        print(f"  {k:<12}{v['goodput_median']:>8.1f} [{v['goodput_min']:.1f}, {v['goodput_max']:.1f}]"
              f"{v['of_best_median']:>8.2f} [{v['of_best_min']:.2f}]")
    if per_ref:
        r = summary["refusal_gateway_ms"]
        print(f"  gateway CPU per refusal: {r['median']:.2f} ms [{r['min']:.2f}, {r['max']:.2f}]")
    targets = {window_name(x, m): agg[window_name(x, m)]["of_best_median"] >= 0.9 for m in models
               for x in (1.5, 3.0) if window_name(x, m) in agg}
    summary["targets"] = targets
    for k, met in targets.items():
        print(f"target: goodput at {k:<11} within 10 % of the best (median)  "
              f"{agg[k]['of_best_median']:.2f}  {'met' if met else 'NOT met'}")
    from _proc import finish
    return finish(summary, t_start, a.json)


if __name__ == "__main__":
    sys.exit(main())
