"""What the daemon reports about itself: its snapshot (telemetry/snapshot.py, also
what /metrics reads), the status dict (edgeinferctl status, the stats file, the
demo) and systemd's one-line STATUS=."""
from __future__ import annotations

import numpy as np

from edgeinfer.abi import ring
from edgeinfer.telemetry.snapshot import (DriftView, FdCloserView, LoopView, ModelView, RegistryView, Snapshot,
                                         StreamView)


def take_snapshot(streams, lanes, models, ingress, loop, rollouts, *, started_ns: int, restored: int,
                  chore_errors: int, metrics_address: str | None, drift: DriftView | None = None) -> Snapshot:
    """The daemon's state now, from its parts: streams (their StreamStates), lanes (the Supervisor, None before
    the start), models (the registry), ingress (None before its sockets exist), loop (the LoopClock), rollouts
    (None before the lanes run), drift (the drift chore's last view; None: off)."""
    now = ring.monotonic_ns()
    return Snapshot(
        now_ns=now, uptime_s=(now - started_ns) / 1e9,
        streams=tuple(StreamView(s.name, s.model, s.stream.stats, s.connected,
                                 str(s.conn.peer) if s.conn else None, s.geometry, s.attach_count, s.reader_count,
                                 s.pool)
                      for s in streams),
        models=tuple(ModelView(name, m.entry.bundle, m.entry.ort_threads,
                               (m.runtime.name, m.runtime.version, m.runtime.bundle.sha256) if m.runtime else None,
                               m.reloads, dict(m.failures), m.last_error, m.fallback,
                               rollouts.view(name) if rollouts is not None and m.runtime else None,
                               m.provider.label, lanes.providers(name) if lanes is not None else {})
                     for name, m in list(models.served.items())),
        lanes=lanes.status(now) if lanes is not None else {},
        registry=RegistryView(models.reloads, models.reload_failures, models.last_reload_error,
                              models.state_write_failures, models.last_state_error, models.last_known_good_error),
        refusals=ingress.refuse_count() if ingress is not None else {},
        loop=LoopView(loop.age(), loop.stalls, loop.stalled_s),
        fds=FdCloserView(ingress.closer.waiting, ingress.closer.slow, ingress.closer.limit,
                         ingress.closer.full_parties, ingress.closer.threads) if ingress is not None else None,
        restored=restored, chore_errors=chore_errors, metrics_address=metrics_address, drift=drift)


def _model_quantiles(streams) -> dict:
    """p50/p99 (ms) over the recent e2e windows of a model's streams."""
    windows = [s.stats.e2e_ns[:min(s.stats.count, len(s.stats.e2e_ns))] for s in streams]
    e2e = np.concatenate(windows) if windows else np.zeros(0)
    if not len(e2e):
        return {}
    return {"p50": float(np.percentile(e2e, 50)) / 1e6, "p99": float(np.percentile(e2e, 99)) / 1e6}


def status(snap: Snapshot) -> dict:
    """The status dict (edgeinferctl status, the stats file, the demo) of a snapshot."""
    now, uptime, refusals = snap.now_ns, snap.uptime_s, snap.refusals
    lanes = {name: dict(ln) for name, ln in snap.lanes.items()}
    for ln in lanes.values():
        ln["busy_pct"] = 100.0 * ln["busy_ns"] / 1e9 / uptime if uptime > 0 else 0.0
    reg = snap.registry
    return {
        "models": {m.name: {"name": m.served[0], "version": m.served[1], "sha256": m.served[2],
                            "bundle": m.bundle, "reloads": m.reloads, "reload_failures": dict(m.failures),
                            "last_reload_error": m.last_error,
                            # serving the last known-good bundle: the configured one was refused at start
                            "known_good_fallback": m.fallback,
                            # the configured execution provider; serving on the CPU one instead where it failed
                            "provider": m.provider,
                            "provider_fallback": m.provider_fallback(),
                            "streams": [s.name for s in snap.streams if s.model == m.name],
                            "e2e_ms": _model_quantiles([s for s in snap.streams if s.model == m.name]),
                            "rollout": _rollout(m.rollout)}
                   for m in snap.models if m.served is not None},
        "lanes": lanes,
        "metrics_address": snap.metrics_address,
        "reloads": reg.reloads,
        "reload_failures": reg.reload_failures,
        "last_reload_error": reg.last_reload_error,
        "state_write_failures": reg.state_write_failures,
        "last_state_error": reg.last_state_error,
        "last_known_good_error": reg.last_known_good_error,
        "segment_truncations": ring.sigbus_absorbed(),
        "realtime_active": bool(lanes) and all(ln["realtime"] for ln in lanes.values()),
        "loop_alive": bool(lanes) and all(ln["state"] == "ready" for ln in lanes.values()),
        "uptime_s": uptime,
        "restored_producers": snap.restored,
        "refusals": {f"{st}/{role}/{reason}": n for (st, role, reason), n in sorted(refusals.items())},
        "streams": {s.name: {**s.stats.snapshot(now), "model": s.model, "connected": s.connected,
                             "producer": s.producer,
                             "geometry": list(s.geometry) if s.geometry else None,
                             "attaches": s.attaches, "readers": s.readers,
                             "refused": {f"{role}/{reason}": n for (st, role, reason), n in refusals.items()
                                         if st == s.name}}
                    for s in snap.streams},
    }


def _rollout(r) -> dict | None:
    """A model's rollout in the status dict: its policy and gates, the candidate under way with its figures, the
    last decision."""
    if r is None:
        return None
    f = r.figures
    return {"policy": r.policy, "candidate": r.candidate, "canary": list(r.canary), "gates": r.gates,
            "figures": None if f is None else {
                "frames": f.frames, "agreement": f.agreement, "runs": f.runs, "errors": f.errors,
                "error_rate": f.error_rate, "skipped": f.skipped, "p99_candidate_us": f.p99_candidate_us,
                "p99_serving_us": f.p99_serving_us, "p99_ratio": f.p99_ratio, "elapsed_s": f.elapsed_s,
                "agreement_low": f.agreement_low, "agreement_high": f.agreement_high, "time_ratio": f.time_ratio,
                "time_ratio_low": f.time_ratio_low, "time_ratio_high": f.time_ratio_high, "pairs": f.pairs,
                "confidence": f.confidence},
            "decisions": {"/".join(k): n for k, n in sorted(r.decisions.items())}, "last": r.last}


def _rollout_said(r: dict | None) -> str:
    if not r:
        return ""
    if r["candidate"]:
        f, g = r["figures"] or {}, r["gates"]
        agreement = f.get("agreement")
        return (f" ({r['policy']} rollout of {r['candidate']}: {f.get('frames', 0)}/{g['min_frames']} frames, "
                f"agreement {'-' if agreement is None else format(agreement, '.3f')})")
    last = r.get("last")
    if last:
        return f" (last rollout: {last['candidate']} {'promoted' if last['decision'] == 'promote' else 'rolled back'})"
    return ""


def status_line(st: dict) -> str:
    """One line for systemd's STATUS=: models, lanes, then per stream fps, p99, drops."""
    parts = [", ".join(f"{n}: {m['name']} {m['version']}" + (
        f" (LAST KNOWN-GOOD: the configured {m['known_good_fallback']['configured']} was refused)"
        if m.get("known_good_fallback") else "") + (
        f" (ON THE CPU: {m['provider_fallback']['configured']} failed)" if m.get("provider_fallback") else "")
        + _rollout_said(m.get("rollout"))
        for n, m in st["models"].items()) or "no model"]
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
