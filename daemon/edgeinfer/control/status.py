"""What the daemon reports about itself: the status dict (edgeinferctl status,
the stats file, the demo) and systemd's one-line STATUS=."""
from __future__ import annotations

import numpy as np

from edgeinfer.abi import ring


def _model_quantiles(streams) -> dict:
    """p50/p99 (ms) over the recent e2e windows of a model's streams."""
    windows = [s.stats.e2e_ns[:min(s.stats.count, len(s.stats.e2e_ns))] for s in streams]
    e2e = np.concatenate(windows) if windows else np.zeros(0)
    if not len(e2e):
        return {}
    return {"p50": float(np.percentile(e2e, 50)) / 1e6, "p99": float(np.percentile(e2e, 99)) / 1e6}


def status(d) -> dict:
    now = ring.monotonic_ns()
    refusals = d.ingress.refuse_count() if d.ingress else {}
    models = d.models
    lanes = d.lanes.status(now) if d.lanes else {}
    uptime = (now - d.started_ns) / 1e9
    for ln in lanes.values():
        ln["busy_pct"] = 100.0 * ln["busy_ns"] / 1e9 / uptime if uptime > 0 else 0.0
    return {
        "models": {name: {"name": m.runtime.name, "version": m.runtime.version, "sha256": m.runtime.bundle.sha256,
                          "bundle": m.entry.bundle, "reloads": m.reloads, "reload_failures": dict(m.failures),
                          "last_reload_error": m.last_error,
                          # serving the last known-good bundle: the configured one was refused at start
                          "known_good_fallback": m.fallback,
                          "streams": [s.name for s in d.streams if s.model == name],
                          "e2e_ms": _model_quantiles([s for s in d.streams if s.model == name])}
                   for name, m in models.served.items() if m.runtime is not None},
        "lanes": lanes,
        "metrics_address": d.metrics.address if d.metrics else None,
        "reloads": models.reloads,
        "reload_failures": models.reload_failures,
        "last_reload_error": models.last_reload_error,
        "state_write_failures": models.state_write_failures,
        "last_state_error": models.last_state_error,
        "last_known_good_error": models.last_known_good_error,
        "segment_truncations": ring.sigbus_absorbed(),
        "realtime_active": bool(lanes) and all(ln["realtime"] for ln in lanes.values()),
        "loop_alive": bool(lanes) and all(ln["state"] == "ready" for ln in lanes.values()),
        "uptime_s": uptime,
        "restored_producers": d.restored,
        "refusals": {f"{st}/{role}/{reason}": n for (st, role, reason), n in sorted(refusals.items())},
        "streams": {s.name: {**s.stats.snapshot(now), "model": s.model, "connected": s.connected,
                             "producer": str(s.conn.peer) if s.conn else None,
                             "geometry": list(s.geometry_key) if s.geometry_key else None,
                             "attaches": s.attach_count, "readers": s.reader_count,
                             "refused": {f"{role}/{reason}": n for (st, role, reason), n in refusals.items()
                                         if st == s.name}}
                    for s in d.streams},
    }


def status_line(st: dict) -> str:
    """One line for systemd's STATUS=: models, lanes, then per stream fps, p99, drops."""
    parts = [", ".join(f"{n}: {m['name']} {m['version']}" + (
        f" (LAST KNOWN-GOOD: the configured {m['known_good_fallback']['configured']} was refused)"
        if m.get("known_good_fallback") else "") for n, m in st["models"].items()) or "no model"]
    lanes = st["lanes"]
    if lanes:
        ready = sum(1 for ln in lanes.values() if ln["state"] == "ready")
        parts.append(f"{ready}/{len(lanes)} lanes ready" + "".join(
            f" ({name} {ln['state']})" for name, ln in lanes.items() if ln["state"] != "ready"))
    for name, s in st["streams"].items():
        drops = s["offered"] - s["processed"]
        p99 = (s.get("e2e_ms") or {}).get("p99")
        parts.append(f"{name}: {s['fps']:.1f} fps, p99 {p99:.1f} ms, {drops} dropped" if p99 is not None
                     else f"{name}: {'no frames yet' if s['connected'] else 'waiting for its producer'}")
    if st["last_reload_error"]:
        parts.append("last reload refused")
    if st["last_state_error"]:
        parts.append("anti-rollback state not written")
    if st.get("last_known_good_error"):
        parts.append("known-good record not written")
    if lanes and not st["realtime_active"]:
        parts.append("NOT real-time")
    return "; ".join(parts)
