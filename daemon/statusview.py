"""`edgeinferctl status` and `edgeinferctl top`: the daemon's per-stream table,
read from its /metrics endpoint (no other channel to the daemon needed)."""
from __future__ import annotations

import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, timeout: float = 3.0) -> dict:
    """The daemon's state from one scrape: {"model", "realtime", "streams": {name: {...}}}."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {"model": None, "realtime": None, "ready": None, "streams": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            stream = s.labels.get("stream")
            row = out["streams"].setdefault(stream, {}) if stream else None
            if s.name == "edgeinfer_frames_total":
                row[s.labels["outcome"]] = int(s.value)
            elif s.name == "edgeinfer_e2e_latency_recent_seconds" and "quantile" in s.labels:
                row["p" + s.labels["quantile"].replace("0.", "").ljust(2, "0")] = s.value * 1e3
            elif s.name == "edgeinfer_stream_connected":
                row["connected"] = bool(s.value)
            elif s.name == "edgeinfer_model_info":
                out["model"] = f"{s.labels['name']} {s.labels['version']}"
            elif s.name == "edgeinfer_realtime_active":
                out["realtime"] = bool(s.value)
            elif s.name == "edgeinfer_ready":
                out["ready"] = bool(s.value)
    return out


def render(now: dict, before: dict | None, dt: float) -> str:
    head = (f"model {now['model'] or '-'}   real-time {'on' if now['realtime'] else 'OFF'}   "
            f"ready {'yes' if now['ready'] else 'no'}")
    lines = [head, f"{'stream':<20}{'fps':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'processed':>11}"
                   f"{'stale':>8}{'overload':>10}{'torn':>6}{'error':>7}{'bad_ts':>8}  producer"]
    for name, r in sorted(now["streams"].items()):
        prev = (before or {}).get("streams", {}).get(name, {})
        fps = (r.get("processed", 0) - prev.get("processed", 0)) / dt if before and dt > 0 else float("nan")
        lines.append(f"{name:<20}{fps:>7.1f}{r.get('p50', float('nan')):>9.2f}{r.get('p95', float('nan')):>9.2f}"
                     f"{r.get('p99', float('nan')):>9.2f}{r.get('processed', 0):>11}{r.get('stale', 0):>8}"
                     f"{r.get('overload', 0):>10}{r.get('torn', 0):>6}{r.get('error', 0):>7}{r.get('bad_timestamp', 0):>8}  "
                     f"{'connected' if r.get('connected') else 'absent'}")
    return "\n".join(lines)


def status(url: str, interval: float = 0.5) -> int:
    before = scrape(url)
    time.sleep(interval)
    print(render(scrape(url), before, interval))
    return 0


def top(url: str, iterations: int = 0, interval: float = 1.0) -> int:
    before, t0 = scrape(url), time.monotonic()
    n = 0
    try:
        while not iterations or n < iterations:
            time.sleep(interval)
            now, t1 = scrape(url), time.monotonic()
            sys.stdout.write("\x1b[H\x1b[2J" if sys.stdout.isatty() else "")
            print(render(now, before, t1 - t0), flush=True)
            before, t0 = now, t1
            n += 1
    except KeyboardInterrupt:
        pass
    return 0
