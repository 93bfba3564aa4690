"""`edgeinferctl decisions`: query the MQTT bridge's decision log (read-only; works while the bridge writes)."""
from __future__ import annotations

import datetime
import json
import re
import sys
import time

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now_ns: int | None = None) -> int:
    """ISO-8601 (a time without a zone is UTC; `Z` accepted) or a relative '90s', '10m', '2h', '7d' (ago): ns."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    m = _RELATIVE.match(text)
    if m:
        return now_ns - int(float(m.group(1)) * _UNIT_S[m.group(2)] * 1e9)
    try:
        t = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: not a time (ISO-8601 such as 2026-11-25T20:00:00Z, or 10m, 2h, 7d ago)") \
            from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def _iso(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _line(d: dict) -> dict:
    return {"kind": d["kind"], "stream": d["stream"], "time": _iso(d["time_ns"]), "time_ns": d["time_ns"],
            "model": d["model_name"], "model_version": d["model_version"], "id": d["id"], "decision": d["record"]}


def _table(rows: list[dict], out) -> None:
    head = ("TIME", "STREAM", "KIND", "MODEL", "VERSION", "WHAT")
    body = []
    for d in rows:
        r = d["record"]
        if d["kind"] == "event":
            what = " ".join(str(x) for x in (r.get("type"), r.get("rule"), r.get("label"),
                                             f"peak {r['peak_score']}" if "peak_score" in r else None,
                                             r.get("id")) if x is not None)
        else:
            what = f"frame {r.get('frame_id')}" + ("" if r.get("ok", True) else f" status {r.get('status')}")
        body.append((_iso(d["time_ns"]), d["stream"], d["kind"], d["model_name"] or "-", d["model_version"] or "-",
                     what))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    for row in (head, *body):
        out.write("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() + "\n")


def cmd_decisions(args) -> int:
    from edgeinfer.bridges.decisionlog import DecisionReader
    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    reader = DecisionReader(args.db)
    try:
        rows = reader.query(stream=args.stream, since_ns=since, until_ns=until, model_version=args.model_version,
                            kind=args.kind, limit=args.limit)
        if args.table:
            _table(list(rows), sys.stdout)
        else:
            for d in rows:
                sys.stdout.write(json.dumps(_line(d), separators=(",", ":")) + "\n")
    finally:
        reader.close()
    return 0
