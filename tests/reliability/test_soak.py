"""Soak: the daemon on the real orientation model, two cameras at 30 fps, its
/metrics scraped every second, a camera SIGKILLed and restarted every 30 s and
the model reloaded every 60 s — while its RSS, open fds, threads and the rings
it holds (memfds: open fds and mappings; rings have no names since ABI 2, so
a leaked ring shows up only there) are sampled every second. Nothing may grow
beyond the stated bounds once the first minute (allocator and ORT arenas
settling) is over.

Timing is not a criterion (the machine is shared: a fresh-clone run once saw
inference at 2.6x its usual time and scrapes slower than their timeout). A
scrape that times out, or a run cancelled at run_deadline_ms, is reported, not
failed; any other error, or a metrics endpoint that stops answering, fails."""
from __future__ import annotations

import os
import signal
import statistics
import time

import pytest
from conftest import read_line
from daemon_helpers import daemon_log, read_stats, sign_copy, start_daemon, stop_daemon, write_config
from rel_helpers import http_status, tree_sample
from reliability_matrix import COUNTS

RSS_BOUND_KIB = 16 * 1024   # growth of the last minute's median RSS over the second minute's
FD_SLACK = 2                # transient fds (a reload reads the bundle; a restarted camera's connection and ring)
SETTLE_S = 2.0              # how long a ring count above its reference may take to come back (a handover in flight)
THREAD_SLACK = 2            # transient threads (the warm-up deadline timer of a reload)
WARM_S = 60.0


@pytest.mark.timeout(COUNTS["soak_seconds"] + 300)
def test_soak(request, matrix, tmp_path, stream, children, c_producer, bundles, signing_key):
    """Sampled over the daemon's whole process tree (control plane, zygote, lanes): a lane's leak is the
    daemon's. Each reload flips the bundle path to a newer signed version (a reload of unchanged content is
    a no-op), then sends SIGHUP."""
    seconds = COUNTS["soak_seconds"]
    names = [f"{stream}-{i}" for i in range(2)]
    current = tmp_path / "current"
    os.symlink(bundles("orientation"), current)
    cfg = write_config(tmp_path, str(current), [{"name": n, "width": 224, "height": 224} for n in names])
    stats = str(tmp_path / "stats.json")
    proc = start_daemon(children, cfg, stats_file=stats, log_file=str(tmp_path / "daemon.log"))
    prods = []
    for n in names:
        prods.append(children.spawn([c_producer, n, "224", "224", "--fps", "30", "--socket", proc.ingress]))
        read_line(prods[-1])
    samples, restarts, reloads, scrapes_ok, scrapes = [], 0, 0, 0, 0
    start = time.monotonic()
    next_restart, next_reload = start + 30, start + 60
    rings_ref = None  # rings held by the tree once both cameras are served: a leak grows beyond it
    while (now := time.monotonic()) - start < seconds:
        s = tree_sample(proc.pid)
        s["t"] = now - start
        s["transient_rings"] = 0
        if rings_ref is None and s["t"] >= 5:
            rings_ref = (s["ring_fds"], s["ring_maps"])
        RINGS = max(rings_ref) if rings_ref else 1 << 30
        if max(s["ring_fds"], s["ring_maps"]) > RINGS:
            # A sample can land inside a handover (a restarted camera's new ring attached while the loop has not
            # yet dropped the old mapping): a leaked ring stays, a handover in flight is gone within SETTLE_S.
            s["transient_rings"] = max(s["ring_fds"], s["ring_maps"])
            settle = time.monotonic() + SETTLE_S
            while max(s["ring_fds"], s["ring_maps"]) > RINGS and time.monotonic() < settle:
                time.sleep(0.05)
                s.update({k: v for k, v in tree_sample(proc.pid).items() if k in ("ring_fds", "ring_maps")})
        samples.append(s)
        scrapes += 1
        scrapes_ok += http_status(proc.metrics_url + "/metrics", timeout=5.0) == 200
        if now >= next_restart:
            next_restart += 30
            i = restarts % 2
            prods[i].send_signal(signal.SIGKILL), prods[i].wait(10)
            prods[i] = children.spawn([c_producer, names[i], "224", "224", "--fps", "30", "--socket", proc.ingress])
            read_line(prods[i])
            restarts += 1
        if now >= next_reload:
            next_reload += 60
            version = f"0.0.{12 + reloads}"
            newer = sign_copy("orientation", tmp_path / f"v{version}", signing_key[0], lambda d, v=version: (
                d / "model.yaml").write_text((d / "model.yaml").read_text().replace("version: 0.0.11", f"version: {v}")))
            os.symlink(newer, tmp_path / "current.new")
            os.replace(tmp_path / "current.new", current)
            proc.send_signal(signal.SIGHUP)
            reloads += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    st = read_stats(stats)
    final_scrape = http_status(proc.metrics_url + "/metrics", timeout=60.0) == 200
    processed = sum(v["processed"] for v in st["streams"].values())
    errors = sum(v["error"] + v["torn"] for v in st["streams"].values())
    code = stop_daemon(proc)
    left = [p for p in (proc.ingress, proc.results) if os.path.exists(p)]
    log = daemon_log(proc)
    # counted by the lanes (a cancellation is logged once a minute per lane, the rest counted in the next line)
    cancelled = sum(ln["runs_cancelled"] for ln in st.get("lanes", {}).values())
    problems = [x.split(": ", 1)[-1][:160] for x in log.splitlines()
                if " ERROR " in x and "inference passed its deadline" not in x]
    infer_p50 = max(v.get("infer_ms_p50", 0) for v in st["streams"].values())

    warm = [x for x in samples if x["t"] >= WARM_S] or samples
    base = [x for x in warm if x["t"] < WARM_S + 60] or warm
    last = [x for x in warm if x["t"] >= seconds - 60] or warm
    rss_growth = statistics.median(x["rss_kib"] for x in last) - statistics.median(x["rss_kib"] for x in base)
    fd_base, th_base = min(x["fds"] for x in warm), min(x["threads"] for x in warm)
    fd_max, th_max = max(x["fds"] for x in warm), max(x["threads"] for x in warm)
    RINGS = max(rings_ref) if rings_ref else 0
    rings_max = max(max(x["ring_fds"], x["ring_maps"]) for x in samples if x["t"] >= 5)
    rings_end = (samples[-1]["ring_fds"], samples[-1]["ring_maps"])
    transients = [x["transient_rings"] for x in samples if x["transient_rings"]]
    fd_end, th_end = samples[-1]["fds"], samples[-1]["threads"]
    # A leak lifts the floor: the last minute's fewest fds against the whole run's; a sample taken while a reload
    # reads its bundle and a killed camera's successor hands its ring over is a transient peak (44 against 41 once,
    # in make test's fresh clone of 6bc4310, back to 41 at the end), not a leak.
    fd_floor_end = min(x["fds"] for x in last)
    observed = (f"{len(samples)} samples over {seconds / 60:.0f} min, {restarts} camera kills, {reloads} reloads "
                f"({st.get('reloads')} done), {scrapes_ok}/{scrapes} scrapes OK within 5 s, {processed:,} frames served "
                f"(inference p50 {infer_p50:.1f} ms), {errors} errors ({cancelled} runs cancelled at the deadline); RSS {statistics.median(x['rss_kib'] for x in base) / 1024:.0f} → "
                f"{statistics.median(x['rss_kib'] for x in last) / 1024:.0f} MiB ({rss_growth / 1024:+.1f}); fds "
                f"{fd_base}–{fd_max} (end {fd_end}, the last minute's floor {fd_floor_end}); threads {th_base}–{th_max} (end {th_end}) over "
                f"{samples[-1]['processes']} processes; rings held by the daemon's processes ≤ {rings_max} "
                f"(reference {rings_ref}) while running, {len(transients)} samples inside a handover (up to "
                f"{max(transients, default=RINGS)}, back to ≤ {RINGS} within {SETTLE_S:.0f} s) (end: {rings_end[0]} fds, "
                f"{rings_end[1]} mappings); sockets left "
                f"after stop: {len(left)}"
                + (f"; logged errors: {problems[:2]}" if problems else ""))
    passed = (rss_growth <= RSS_BOUND_KIB and fd_floor_end <= fd_base + FD_SLACK and fd_end <= fd_base + FD_SLACK
              and th_max <= th_base + THREAD_SLACK and rings_max <= RINGS and rings_end == rings_ref
              and not left and code == 0
              and final_scrape and scrapes_ok > 0 and errors == cancelled and not problems
              and st.get("reloads") == reloads and processed > 0)
    assert matrix.record(request, "soak", f"{seconds / 60:.0f} min: 2 × 30 fps, scrape 1/s, camera kill 1/30 s, "
                         "reload 1/60 s (a newer signed version)", len(samples), f"after the first minute, the whole process tree: "
                         f"RSS +≤ {RSS_BOUND_KIB // 1024} MiB, fds (the last minute's floor and the end) +≤ {FD_SLACK}, threads +≤ {THREAD_SLACK}, rings held "
                         f"≤ those at 5 s (no ring leaked; a "
                         f"handover in flight settles within {SETTLE_S:.0f} s), sockets "
                         "removed at stop; no error but "
                         "deadline cancellations; /metrics answering",
                         observed, passed)
