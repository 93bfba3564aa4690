"""The metrics listener under abuse (issue #13, item 4): a local user who is nobody to edgeinfer (not in its
group; the listener is on loopback, which every local user reaches) holds 1,000 half-open connections, drips
a slow request, and runs 32 parallel /metrics scrapers, against the real daemon serving a camera. /healthz
must keep answering, the daemon must not grow a thread per connection nor run out of fds, /metrics must be
rendered once per interval and shared, and the camera must go on being served."""
from __future__ import annotations

import os
import sys
import time
import urllib.request

from conftest import ROOT, read_line
from daemon_helpers import read_stats, start_daemon, stop_daemon, wait_for, write_config

FLOOD = (ROOT / "tests/adversary/http_flood.py").read_text()  # run with -c: the clone may be 0700 to others


def process_sample(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {"threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            r.read()
            return r.status
    except OSError:
        return 0


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def closed(url: str, reason: str) -> float:
    return metric(url, f'edgeinfer_http_connections_closed_total{{reason="{reason}"}}')


def test_half_open_flood_and_32_scrapers_cannot_silence_health_or_the_camera(children, tmp_path, stream, bundles,
                                                                             c_producer, users):
    seconds = 8.0
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 224, "height": 224}])
    stats = str(tmp_path / "stats.json")
    proc = start_daemon(children, cfg, stats_file=stats)
    cam = children.spawn([c_producer, stream, "224", "224", "--fps", "30", "--socket", proc.ingress])
    assert read_line(cam) == "CONNECTED accepted=1"
    url = proc.metrics_url
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    before = process_sample(proc.pid)
    served_before = wait_for(lambda: read_stats(stats).get("streams", {}).get(stream, {}).get("processed"), 30,
                             "the camera to be served")
    renders_before = metric(url, "edgeinfer_http_metrics_renders_total")

    flood = children.spawn([*users.run_as(users.outsider), sys.executable, "-c", FLOOD, host, port,
                            str(seconds)], cwd="/")
    held = read_line(flood, timeout=60)
    assert held.startswith("HELD "), held
    answers, worst = [], {"threads": 0, "fds": 0}
    end = time.monotonic() + seconds - 1
    while time.monotonic() < end:
        answers.append(get(url + "/healthz"))
        s = process_sample(proc.pid)
        worst = {k: max(worst[k], s[k]) for k in worst}
        time.sleep(0.2)
    scrapes = read_line(flood, timeout=60)
    flood.wait(30)
    renders = metric(url, "edgeinfer_http_metrics_renders_total") - renders_before
    ok_scrapes = int(scrapes.split("ok=")[1].split()[0])
    served = read_stats(stats)["streams"][stream]["processed"] - served_before

    assert int(held.split()[1]) >= 900, held  # the flood really held its connections (client-side fd limit)
    assert answers and all(a == 200 for a in answers), answers  # /healthz answered throughout
    assert worst["threads"] <= before["threads"] + 1, (before, worst)  # no thread per connection
    assert worst["fds"] <= before["fds"] + 80, (before, worst)  # the connection cap (64), not 1,000 sockets
    assert closed(url, "evicted") >= 900  # half-open connections made room for honest ones
    assert ok_scrapes > 0 and renders < ok_scrapes, (ok_scrapes, renders)  # one render shared by many scrapes
    assert served >= 30 * (seconds - 2) * 0.5, served  # the camera was served meanwhile
    assert stop_daemon(proc) == 0
