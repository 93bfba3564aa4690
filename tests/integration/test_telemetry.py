"""Observability: native histogram accuracy, /metrics checked by promtool and
scraped by a real Prometheus server, health endpoints, status/top, logs."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, read_line, require_tool
from daemon_helpers import edgeinferd_args, poll, results, start_daemon, stop_daemon, wait_for, write_config
from edgeinfer import _hist
from edgeinfer.abi import ring

CTL = [sys.executable, "-m", "edgeinfer.cli"]


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""  # not listening (yet)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_native_histogram_quantiles_within_5_percent():
    rng = np.random.default_rng(11)
    for values in (np.exp(rng.uniform(np.log(1e3), np.log(1e10), 50_000)),          # 1 µs .. 10 s, log-uniform
                   rng.lognormal(np.log(5e6), 0.3, 50_000),                           # ~5 ms inference-like
                   np.concatenate([rng.normal(2e5, 1e4, 45_000), rng.normal(3e7, 1e6, 5_000)])):  # bimodal
        h = _hist.StageHistograms()
        for v in values.astype(np.int64):
            h.record(6, int(v))
        counts, total_ns, n = h.snapshot(6)
        assert n == len(values) and counts.sum() == len(values)
        assert abs(total_ns - values.astype(np.int64).sum()) <= len(values)
        for q in (0.5, 0.95, 0.99):
            exact = np.quantile(values, q)
            assert abs(_hist.quantile(counts, q) - exact) / exact <= 0.05, (q, exact)


def test_metrics_promtool_and_a_real_prometheus_server(children, tmp_path, stream, bundles):
    promtool = require_tool("promtool")
    prometheus = require_tool("prometheus")
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 224, "height": 224}])
    proc = start_daemon(children, cfg)
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "224", "--height", "224",
                           "--fps", "50", "--socket", proc.ingress])
    reader = results(proc, stream)  # one reader connected: edgeinfer_stream_readers 1
    with pytest.raises(ring.BadArgument):  # a refusal to count: a camera for a stream not configured here
        ring.FrameWriter.connect("nosuchstream", 224, 224, socket=proc.ingress, wait=5.0)
    base = proc.metrics_url.rsplit("/", 0)[0]
    wait_for(lambda: b'outcome="processed"' in get(base + "/metrics")[1] and
             int(next(s.value for f in text_string_to_metric_families(get(base + "/metrics")[1].decode())
                      for s in f.samples if s.name == "edgeinfer_frames_total" and
                      s.labels["outcome"] == "processed")) > 50, 30, "50 processed frames")
    status, body = get(base + "/metrics")
    assert status == 200
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
    text = body.decode()
    for name in ("edgeinfer_stage_duration_seconds_bucket", "edgeinfer_e2e_latency_seconds_bucket",
                 "edgeinfer_frames_total", "edgeinfer_model_reload_failures_total", "edgeinfer_model_info",
                 "edgeinfer_realtime_active", "edgeinfer_stream_connected", "edgeinfer_ort_intra_op_threads",
                 "edgeinfer_e2e_latency_recent_seconds", "edgeinfer_stream_readers", "edgeinfer_model_sessions",
                 "edgeinfer_model_session_evictions_total", "edgeinfer_producers_restored_total",
                 "edgeinfer_ingress_refusals_total"):
        assert name in text, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    ids = (("model", "default"), ("stream", stream))
    assert samples[("edgeinfer_stream_connected", ids)] == 1
    assert samples[("edgeinfer_stream_readers", ids)] == 1
    lanes = [dict(k[1])["lane"] for k in samples if k[0] == "edgeinfer_lane_up"]
    assert lanes and all(samples[("edgeinfer_lane_up", (("lane", ln),))] == 1 for ln in lanes)
    # one geometry (224x224 bgr24): one session in every lane (each holds the model)
    assert all(samples[("edgeinfer_model_sessions", (("lane", ln),))] == 1 for ln in lanes)
    assert samples[("edgeinfer_ingress_refusals_total",
                    (("reason", "unknown_stream"), ("role", "producer"), ("stream", "(unknown)")))] == 1
    reader.close()

    port = free_port()
    target = base.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
        f"scrape_configs:\n  - job_name: edgeinfer\n    static_configs: [{{targets: ['{target}']}}]\n")
    prom = children.spawn([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def promql(q: str):
        status, body = get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        if status != 200:
            return None
        res = json.loads(body)["data"]["result"]
        return float(res[0]["value"][1]) if res else None

    q = f'histogram_quantile(0.99, sum by (le) (edgeinfer_e2e_latency_seconds_bucket{{stream="{stream}"}}))'
    prom_p99 = wait_for(lambda: promql(q), 60, "Prometheus to scrape the daemon")
    feed.terminate()
    feed.wait(10)
    time.sleep(2.5)  # two more scrapes of the now-still counters
    prom_p99 = promql(q)
    # The daemon's own p99 over the same frames, from its native histogram.
    fams = {f.name: f for f in text_string_to_metric_families(get(base + "/metrics")[1].decode())}
    buckets = [(float(s.labels["le"]), s.value) for s in fams["edgeinfer_e2e_latency_seconds"].samples
               if s.name.endswith("_bucket")]
    total = buckets[-1][1]
    own_bucket = next(le for le, c in buckets if c >= 0.99 * total)
    lower = max([le for le, _ in buckets if le < own_bucket] or [0.0])
    # Prometheus interpolates inside the same bucket the daemon's own p99 falls in.
    assert lower <= prom_p99 <= own_bucket, (prom_p99, lower, own_bucket)
    assert stop_daemon(proc) == 0


def test_shipped_rules_and_dashboard_are_valid():
    promtool = require_tool("promtool")
    r = subprocess.run([promtool, "check", "rules", str(ROOT / "share/prometheus/edgeinfer-rules.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS: 24 rules found" in r.stdout, r.stdout + r.stderr
    # The lane and model alerts fire on series shaped like the daemon's (promtool's rule unit tests); the
    # drop-rate alert fires on drops, not on a daemon restart (its counters start again, its gap counted once);
    # the gateway's alerts (shedding, not ready, UNAVAILABLE, p99, down) on series shaped like its fronts'; the MQTT
    # bridge's (broker down, dropping, stream refused, down) on series shaped like its own; the drift alert on a
    # stream's PSI held over 0.25 for 10 minutes, never on the pooled stream="*"; the rollout alert on a rollback,
    # the first of a pair of versions (a new series) and a later one alike, never on a promotion; the p99 alert on a
    # camera's stream over its SLO, never on a front's pool stream (edgeinfer_stream_pool: its latency is the
    # request's age by design).
    for case in ("lane_alerts_test.yml", "drop_alert_test.yml", "front_alerts_test.yml", "mqtt_alerts_test.yml",
                 "drift_alert_test.yml", "rollout_alert_test.yml", "latency_alert_test.yml"):
        t = subprocess.run([promtool, "test", "rules", str(ROOT / "tests/promtool" / case)],
                           capture_output=True, text=True, timeout=60)
        assert t.returncode == 0 and "SUCCESS" in t.stdout, case + ": " + t.stdout + t.stderr
    dash = json.loads((ROOT / "share/grafana/edgeinfer-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))  # a row has none
    for metric in ("edgeinfer_e2e_latency_seconds_bucket", "edgeinfer_stage_duration_seconds_bucket",
                   "edgeinfer_frames_total", "edgeinfer_model_info", "edgeinfer_loop_progress",
                   "edgeinfer_model_reload_failures_total", "edgeinfer_lane_busy_seconds_total",
                   "edgeinfer_lane_restarts_total", "edgeinfer_front_requests_total",
                   "edgeinfer_front_refusals_total", "edgeinfer_front_in_flight",
                   "edgeinfer_front_latency_seconds_bucket", "edgeinfer_front_model_ready",
                   "edgeinfer_mqtt_published_total", "edgeinfer_mqtt_dropped_total", "edgeinfer_mqtt_queue_messages",
                   "edgeinfer_mqtt_broker_connected", "edgeinfer_mqtt_publish_latency_seconds_bucket",
                   "edgeinfer_model_drift_psi", "edgeinfer_rollout_agreement", "edgeinfer_rollout_time_ratio",
                   "edgeinfer_rollout_time_ratio_high", "edgeinfer_rollout_agreement_low"):
        assert metric in exprs, metric


def test_health_goes_bad_when_the_loop_stalls_and_recovers(children, tmp_path, stream, bundles):
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}], runtime={"fault_injection": "true"},
                       metrics={"health_deadline_s": 1.0})
    proc = start_daemon(children, cfg)
    base = proc.metrics_url
    assert get(base + "/healthz")[0] == 200
    assert get(base + "/readyz")[0] == 503  # ready_requires_stream, and no camera yet
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "96", "--height", "48",
                           "--fps", "20", "--socket", proc.ingress])
    wait_for(lambda: get(base + "/readyz")[0] == 200, 30, "ready once a stream is attached")
    proc.send_signal(__import__("signal").SIGUSR1)  # test-only hook: the loop stalls for 3 s
    wait_for(lambda: get(base + "/healthz")[0] == 503, 3, "/healthz to fail during the stall")
    assert get(base + "/readyz")[0] == 503
    wait_for(lambda: get(base + "/healthz")[0] == 200, 10, "/healthz to recover after the stall")
    feed.terminate()
    feed.wait(10)
    assert stop_daemon(proc) == 0


def test_readyz_is_not_ready_before_warm_up(children, tmp_path, stream, bundles):
    cfg = write_config(tmp_path, bundles("detector"), [{"name": stream, "width": 416, "height": 416}],
                       metrics={"ready_requires_stream": "false"})
    proc = children.spawn(edgeinferd_args(cfg))
    line = read_line(proc, timeout=60)
    assert line.startswith("edgeinferd: metrics ")
    base = line.split()[-1]
    assert get(base + "/readyz")[0] == 503  # loading + warming the detector takes a while
    assert get(base + "/healthz")[0] == 200  # alive while starting
    assert read_line(proc, timeout=60) == "edgeinferd: ready"
    assert get(base + "/readyz")[0] == 200
    assert stop_daemon(proc) == 0


def test_status_and_top(children, tmp_path, stream, bundles):
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}])
    proc = start_daemon(children, cfg)
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "96", "--height", "48",
                           "--fps", "40", "--socket", proc.ingress])
    url = proc.metrics_url + "/metrics"
    wait_for(lambda: f'outcome="processed",stream="{stream}"'.encode() in get(url)[1], 30, "frames")
    s = subprocess.run([*CTL, "status", "--url", url], capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert "model ppocr-cls 2.0" in s.stdout and stream in s.stdout and "connected" in s.stdout
    # Each lane (state, busy %, fps, restarts, models) and each model (version, p50/p99).
    lane_rows = [x.split() for x in s.stdout.splitlines() if x.startswith("lane")][1:]
    assert lane_rows and all(r[1] == "up" and r[-1] == "default" for r in lane_rows), s.stdout
    assert sum(float(r[3]) for r in lane_rows) > 10  # the lanes' fps add up to the camera's
    model_row = next(x.split() for x in s.stdout.splitlines() if x.startswith("default "))
    assert model_row[1:3] == ["ppocr-cls", "2.0"] and float(model_row[3]) > 0 and float(model_row[4]) > 0
    row = next(x for x in s.stdout.splitlines() if x.startswith(stream)).split()
    assert 10 < float(row[1]) < 80  # fps of a 40 fps camera
    t = subprocess.run([*CTL, "top", "--url", url, "--iterations", "2"], capture_output=True, text=True, timeout=60)
    assert t.returncode == 0 and t.stdout.count("model ppocr-cls") == 2
    down = subprocess.run([*CTL, "status", "--url", "http://127.0.0.1:1/metrics"], capture_output=True, text=True,
                          timeout=60)
    assert down.returncode == 1 and down.stderr.startswith("edgeinferctl:") and "Traceback" not in down.stderr
    feed.terminate()
    feed.wait(10)
    # The camera's connection is its liveness: gone at once, and the table says so.
    gone = poll(lambda: f'edgeinfer_stream_connected{{model="default",stream="{stream}"}} 0.0'.encode() in get(url)[1], 5)
    assert gone, [ln for ln in get(url)[1].decode().splitlines() if "connected" in ln]
    s = subprocess.run([*CTL, "status", "--url", url], capture_output=True, text=True, timeout=60)
    row = next(x for x in s.stdout.splitlines() if x.startswith(stream))
    assert row.endswith("absent"), s.stdout
    assert stop_daemon(proc) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_finds_the_daemon_from_its_config_and_says_where_it_looked(children, tmp_path, stream, bundles):
    """status and top read metrics.listen of --config (the operator's daemon on a port of its own), list only the
    configured streams (a refused camera's "(unknown)" stream label is no row), and a wrong endpoint says the URL
    it tried and --url."""
    port = _free_port()
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}], metrics={"listen": f"0.0.0.0:{port}"})
    proc = start_daemon(children, cfg)
    assert proc.metrics_url.endswith(f":{port}")
    # A camera of a stream that is not configured: refused, counted under the stream label "(unknown)".
    r = subprocess.run([*CTL, "feed", "--synthetic", "--stream", "nosuch", "--frames", "1", "--socket",
                        proc.ingress, "--wait", "10"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no stream 'nosuch'" in r.stderr, r.stderr
    assert b'stream="(unknown)"' in get(proc.metrics_url + "/metrics")[1]
    for cmd in (["status"], ["top", "--iterations", "1"]):
        s = subprocess.run([*CTL, *cmd, "--config", cfg], capture_output=True, text=True, timeout=60)
        assert s.returncode == 0, s.stderr
        rows = s.stdout.split("producer\n", 1)[1].splitlines()
        assert [x.split()[0] for x in rows] == [stream], s.stdout  # the one configured stream, no "(unknown)"
    stop_daemon(proc)
    # Nothing listens there now: the URL tried, where it came from, and the options that choose another.
    s = subprocess.run([*CTL, "status", "--config", cfg], capture_output=True, text=True, timeout=60)
    assert s.returncode == 1 and "Traceback" not in s.stderr and len(s.stderr.splitlines()) == 1, s.stderr
    assert f"http://127.0.0.1:{port}/metrics (from metrics.listen of {cfg})" in s.stderr and "--url" in s.stderr, \
        s.stderr
    # A config the daemon gives any free port: no URL to guess, and it says so.
    any_port = write_config(tmp_path / "any", bundles("cls-tiny"), [{"name": stream}]) \
        if (tmp_path / "any").mkdir() is None else None
    s = subprocess.run([*CTL, "status", "--config", any_port], capture_output=True, text=True, timeout=60)
    assert s.returncode == 1 and "127.0.0.1:0 takes any free port" in s.stderr and "--url" in s.stderr, s.stderr
    s = subprocess.run([*CTL, "status", "--config", str(tmp_path / "absent.yaml")], capture_output=True, text=True,
                       timeout=60)
    assert s.returncode == 1 and "absent.yaml" in s.stderr and "--url" in s.stderr, s.stderr


def test_logs_are_one_line_per_event_with_journald_priorities(tmp_path, bundles):
    bad = write_config(tmp_path, str(tmp_path / "nowhere"), [{"name": "x"}])
    env = {**__import__("os").environ, "JOURNAL_STREAM": "8:1234"}
    r = subprocess.run(edgeinferd_args(bad), capture_output=True, text=True, timeout=60, env=env)
    lines = [x for x in r.stderr.splitlines() if x.startswith("<")]
    assert r.returncode == 1 and lines and all(x[:3] in ("<3>", "<4>", "<6>", "<7>") for x in lines), r.stderr
    assert any(x.startswith("<6>edgeinferd: loading model bundle") for x in lines)
