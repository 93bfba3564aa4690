"""`edgeinferctl status` and `edgeinferctl top`: the daemon's lanes (busy %, fps,
models), models (version, p50/p99) and streams, read from its /metrics
endpoint (no other channel to the daemon needed)."""
from __future__ import annotations

import socket
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from edgeinfer.abi.vocabulary import DROPS
from edgeinfer.cli import rolloutview

_SHORT = {"bad_timestamp": "bad_ts"}  # column headers: the outcome's name, shortened where it is long


# The samples of a configured stream (edgeinfer_connections_refused_total, say, also has a stream label: it is not
# a stream's row).
_STREAM_SAMPLES = ("edgeinfer_frames_total", "edgeinfer_e2e_latency_recent_seconds", "edgeinfer_stream_connected")


def _width(outcome: str) -> int:
    return max(6, len(_SHORT.get(outcome, outcome)) + 2)


DEFAULT_CONFIG = "/etc/edgeinfer/edgeinferd.yaml"


def metrics_url(config: str) -> str:
    """The daemon's /metrics URL from its configuration's metrics.listen (a wildcard address is reached on
    loopback). Raises ConfigError, OSError, or ValueError saying why there is none."""
    from pydantic import BaseModel, ConfigDict
    from edgeinfer.config.schema import MetricsConfig
    from edgeinfer.support.yamlconf import load_yaml_file

    class MetricsOnly(BaseModel):  # the one section status needs: the rest (users, groups, bundles) is the daemon's
        model_config = ConfigDict(extra="ignore")
        metrics: MetricsConfig = MetricsConfig()
    m = load_yaml_file(MetricsOnly, config).metrics
    if not m.enabled:
        raise ValueError(f"{config}: metrics.enabled is false: the daemon serves no /metrics")
    host, _, port = m.listen.rpartition(":")
    if port == "0":
        raise ValueError(f"{config}: metrics.listen {m.listen} takes any free port: the daemon logs the one it got "
                         "(\"metrics and health on http://…\"): give it as --url http://HOST:PORT/metrics")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host.strip("[]"), host.strip("[]"))
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


class Endpoint:
    """Where status and top read /metrics: --url as given, else from the configuration; every failure says the URL
    tried, where it came from, and the options that choose another."""

    def __init__(self, url: str | None, config: str = DEFAULT_CONFIG, timeout: float = 3.0):
        self.from_config = url is None
        self.timeout = timeout
        if url is None:
            try:
                url = metrics_url(config)
            except (ValueError, OSError) as e:  # ConfigError is a ValueError
                raise ValueError(f"cannot tell where edgeinferd's metrics are: {e} (give --url "
                                 "http://HOST:PORT/metrics, or --config the daemon's configuration)") from None
        self.url, self.config = url, config

    def scrape(self) -> dict:
        try:
            return scrape(self.url, self.timeout)
        except OSError as e:  # URLError, a refused or timed-out connection
            why = getattr(e, "reason", None) or e.strerror or e
            where = f"metrics.listen of {self.config}" if self.from_config else "--url"
            other = "--url URL (or --config FILE)" if self.from_config else "another --url"
            if timed_out(e):  # it is there, and busy: not "is it running?"
                raise OSError(f"edgeinferd's metrics at {self.url} (from {where}) did not answer within "
                              f"{self.timeout:g} s: the daemon is up but busy (a loaded host, a slow render); "
                              f"give it longer with --timeout SECONDS") from None
            hint = "is edgeinferd running?" if refused(e) else "is edgeinferd running, and is this its address?"
            raise OSError(f"cannot read edgeinferd's metrics at {self.url} (from {where}): {why}; {hint} "
                          f"{other} reads another") from None


def _cause(e: BaseException) -> BaseException:
    return e.reason if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException) else e


def timed_out(e: BaseException) -> bool:
    """A scrape that connected (or tried to) and got no answer in time: socket.timeout is TimeoutError."""
    return isinstance(_cause(e), (TimeoutError, socket.timeout))


def refused(e: BaseException) -> bool:
    """Nothing listens at the address: the daemon is not running (or listens elsewhere)."""
    return isinstance(_cause(e), ConnectionRefusedError)


def scrape(url: str, timeout: float = 3.0) -> dict:
    """The daemon's state from one scrape: models, lanes, streams (and their e2e buckets per model)."""
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    # When: the daemon's own clock (edgeinfer_uptime_seconds, read as it took the figures) where it says it, else
    # the middle of this scrape on ours.
    out = {"models": {}, "lanes": {}, "realtime": None, "ready": None, "streams": {}, "buckets": {}, "rollouts": {},
           "uptime_s": None, "at": (t0 + time.monotonic()) / 2}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # A row per configured stream: only the per-stream families make one (the refused connections'
            # family labels names that are not configured "(unknown)": no stream of the table).
            stream = s.labels.get("stream") if s.name in _STREAM_SAMPLES else None
            lane = s.labels.get("lane")
            row = out["streams"].setdefault(stream, {}) if stream else None
            lrow = out["lanes"].setdefault(lane, {"models": []}) if lane else None
            if s.name == "edgeinfer_frames_total":
                row[s.labels["outcome"]] = int(s.value)
                row["model"] = s.labels.get("model")
            elif s.name == "edgeinfer_e2e_latency_recent_seconds" and "quantile" in s.labels:
                row["p" + s.labels["quantile"].replace("0.", "").ljust(2, "0")] = s.value * 1e3
            elif s.name == "edgeinfer_e2e_latency_seconds_bucket":
                le = float(s.labels["le"])
                per_model = out["buckets"].setdefault(s.labels.get("model", ""), {})
                per_model[le] = per_model.get(le, 0.0) + s.value
            elif s.name == "edgeinfer_stream_connected":
                row["connected"] = bool(s.value)
            elif s.name == "edgeinfer_model_info":
                out["models"][s.labels.get("model", "")] = f"{s.labels['name']} {s.labels['version']}"
            elif s.name == "edgeinfer_realtime_active":
                lrow["realtime"] = bool(s.value)
            elif s.name == "edgeinfer_lane_up":
                lrow["up"] = bool(s.value)
            elif s.name == "edgeinfer_lane_busy_seconds_total":
                lrow["busy_s"] = s.value
            elif s.name == "edgeinfer_lane_frames_total":
                lrow["frames"] = s.value
            elif s.name == "edgeinfer_lane_restarts_total":
                lrow["restarts"] = int(s.value)
            elif s.name == "edgeinfer_lane_model":
                lrow["models"].append(s.labels["model"])
            elif s.name == "edgeinfer_ready":
                out["ready"] = bool(s.value)
            elif s.name == "edgeinfer_uptime_seconds":
                out["uptime_s"] = s.value
            elif s.name.startswith("edgeinfer_rollout_"):
                rolloutview.absorb(out["rollouts"].setdefault(s.labels.get("model", ""), rolloutview.empty()), s)
    lanes = out["lanes"].values()
    out["realtime"] = bool(lanes) and all(ln.get("realtime") for ln in lanes)
    return out


def quantile(buckets: dict, q: float) -> float:
    """The q-quantile (s) of cumulative Prometheus buckets {le: count}, interpolated inside the bucket
    (as histogram_quantile does); nan without observations."""
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0
    if not total:
        return float("nan")
    rank, lo, below = q * total, 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(buckets[le] - below, 1e-12)
        lo, below = le, buckets[le]
    return lo


def _recent(now: dict, before: dict | None) -> dict:
    """Per model, the buckets of the frames between two scrapes (all of them without a previous one)."""
    out = {}
    for model, b in now["buckets"].items():
        prev = (before or {}).get("buckets", {}).get(model, {})
        out[model] = {le: c - prev.get(le, 0.0) for le, c in b.items()}
    return out


def interval(now: dict, before: dict) -> float:
    """Seconds between the figures of two scrapes: the difference of the daemon's uptimes where both carry it
    (what its counters moved in, however long each scrape took to arrive); else of the scrapes' middles on this
    process's monotonic clock. nan where the daemon restarted in between (its counters started again)."""
    up0, up1 = before.get("uptime_s"), now.get("uptime_s")
    if up0 is not None and up1 is not None:
        return up1 - up0 if up1 >= up0 else float("nan")
    return now["at"] - before["at"]


def render(now: dict, before: dict | None, dt: float) -> str:
    nan = float("nan")
    names = ", ".join(f"{v} ({k})" for k, v in sorted(now["models"].items())) or "-"
    head = (f"model {names}   real-time {'on' if now['realtime'] else 'OFF'}   "
            f"ready {'yes' if now['ready'] else 'no'}")
    lines = [head, f"{'lane':<10}{'state':>7}{'busy %':>8}{'fps':>8}{'restarts':>10}  models"]
    for name, ln in sorted(now["lanes"].items()):
        prev = (before or {}).get("lanes", {}).get(name, {})
        rate = (lambda k: (ln.get(k, 0) - prev.get(k, 0)) / dt) if before and dt > 0 else (lambda k: nan)
        lines.append(f"{name:<10}{'up' if ln.get('up') else 'DOWN':>7}{100 * rate('busy_s'):>8.1f}"
                     f"{rate('frames'):>8.1f}{ln.get('restarts', 0):>10}  {','.join(ln['models'])}")
    recent = _recent(now, before)
    lines.append(f"{'model':<14}{'version':<28}{'p50 ms':>9}{'p99 ms':>9}")
    for model, version in sorted(now["models"].items()):
        b = recent.get(model, {})
        lines.append(f"{model:<14}{version:<28}{1e3 * quantile(b, 0.5):>9.2f}{1e3 * quantile(b, 0.99):>9.2f}")
    lines += [x for m, r in sorted(now.get("rollouts", {}).items()) if (x := rolloutview.summary(m, r))]
    drops = "".join(f"{_SHORT.get(o, o):>{_width(o)}}" for o in DROPS)
    lines.append(f"{'stream':<20}{'fps':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'processed':>11}{drops}  producer")
    for name, r in sorted(now["streams"].items()):
        prev = (before or {}).get("streams", {}).get(name, {})
        fps = (r.get("processed", 0) - prev.get("processed", 0)) / dt if before and dt > 0 else nan
        drops = "".join(f"{r.get(o, 0):>{_width(o)}}" for o in DROPS)
        lines.append(f"{name:<20}{fps:>7.1f}{r.get('p50', nan):>9.2f}{r.get('p95', nan):>9.2f}"
                     f"{r.get('p99', nan):>9.2f}{r.get('processed', 0):>11}{drops}  "
                     f"{'connected' if r.get('connected') else 'absent'}")
    return "\n".join(lines)


def status(endpoint: Endpoint, pause: float = 0.5) -> int:
    """Two scrapes `pause` s apart; the rates are over the time between them (interval())."""
    before = endpoint.scrape()
    time.sleep(pause)
    now = endpoint.scrape()
    print(render(now, before, interval(now, before)))
    return 0


def top(endpoint: Endpoint, iterations: int = 0, pause: float = 1.0) -> int:
    before = endpoint.scrape()
    n = 0
    try:
        while not iterations or n < iterations:
            time.sleep(pause)
            now = endpoint.scrape()
            sys.stdout.write("\x1b[H\x1b[2J" if sys.stdout.isatty() else "")
            print(render(now, before, interval(now, before)), flush=True)
            before = now
            n += 1
    except KeyboardInterrupt:
        pass
    return 0
