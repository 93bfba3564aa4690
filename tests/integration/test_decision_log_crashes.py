"""The decision log (bridges/decisionlog.py) against crashes and from the operator's side: a writer process killed
with SIGKILL at random moments leaves a database that opens, passes `PRAGMA integrity_check` and holds only whole
records, every commit it reported still there; rotation keeps the size bound under the same kills; the fsync
interval measured by counting commits; `edgeinferctl decisions` (a subprocess, read-only) finds an event by stream,
time and model version while the writer holds the log open."""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

from edgeinfer.bridges.decisionlog import DecisionLog, DecisionReader

CTL = [sys.executable, "-c", "import sys; from edgeinfer.cli.ctl import edgeinferctl_main as m; sys.exit(m())"]
KILLS = 20
FIELDS = {"id", "type", "stream", "rule", "peak_score", "start_ns", "capture_ns", "model", "run", "seq", "pad"}

# A writer in a tight loop: events of run RUN numbered 0, 1, …; after every commit it prints how many of them are
# committed (so the parent knows what a crash must not lose).
WRITER = r"""
import sys, time
from edgeinfer.bridges.decisionlog import DecisionLog
path, run, interval, max_bytes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
log = DecisionLog(path, fsync_interval_ms=interval, max_bytes=max_bytes)
print("ready", flush=True)
seq = 0
while True:
    t = time.time_ns()
    log.append_event({"id": f"r{run}-{seq}", "type": "new", "stream": f"cam{seq % 3}", "rule": "r",
                      "peak_score": 0.5, "start_ns": t, "capture_ns": t, "model": {"name": "m", "version": "7"},
                      "run": run, "seq": seq, "pad": "p" * (seq % 700)})
    seq += 1
    before = log.commits
    log.flush()
    if log.commits != before:
        print(log.committed_rows, flush=True)
"""


def _kill_runs(path: str, runs: range, interval_ms: float, max_bytes: int) -> dict[int, int]:
    """Starts the writer once per run, kills it with SIGKILL at a random moment; returns run -> rows it reported
    committed before it died."""
    rng = random.Random(26)
    reported = {}
    for run in runs:
        p = subprocess.Popen([sys.executable, "-c", WRITER, path, str(run), str(interval_ms), str(max_bytes)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.35))
        p.send_signal(signal.SIGKILL)
        out = p.communicate(timeout=10)[0].split()
        assert p.returncode == -signal.SIGKILL
        reported[run] = int(out[-1]) if out else 0
    return reported


def _check(path: str) -> list[dict]:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = db.execute("SELECT kind, stream, time_ns, model_version, record FROM decisions ORDER BY id").fetchall()
    finally:
        db.close()
    out = []
    for kind, stream, time_ns, version, record in rows:
        rec = json.loads(record)                         # whole: it parses, and has every field
        assert set(rec) == FIELDS, rec
        assert (kind, stream, time_ns, version) == ("event", rec["stream"], rec["capture_ns"], "7")
        assert rec["pad"] == "p" * (rec["seq"] % 700) and rec["id"] == f"r{rec['run']}-{rec['seq']}"
        out.append(rec)
    return out


def test_kill_9_mid_write_leaves_whole_records_and_loses_nothing_committed(tmp_path):
    path = str(tmp_path / "decisions.db")
    reported = _kill_runs(path, range(KILLS), 2, 1 << 30)   # commits every 2 ms: kills land inside commits
    recs = _check(path)
    for run, committed in reported.items():
        seqs = [r["seq"] for r in recs if r["run"] == run]
        assert seqs == list(range(len(seqs))), run          # no hole: a run's rows are a prefix of what it wrote
        assert len(seqs) >= committed, (run, len(seqs), committed)   # every reported commit survived
    assert sum(reported.values()) > KILLS * 100             # it did write, a lot, before each kill
    print(f"\n{KILLS} kills: {len(recs)} rows, all whole; reported committed {sum(reported.values())}")


def test_rotation_keeps_its_bound_under_kill_9(tmp_path):
    path = str(tmp_path / "decisions.db")
    max_bytes = 1 << 20
    _kill_runs(path, range(6), 2, max_bytes)
    recs = _check(path)
    log = DecisionLog(path, max_bytes=max_bytes)            # what the next start sees, and does at once
    assert log.file_bytes() <= max_bytes
    log.close()
    assert os.path.getsize(path) <= max_bytes
    assert not os.path.exists(path + "-wal") or os.path.getsize(path + "-wal") == 0
    # the oldest went first: what is kept is the newest, without holes inside a run but the first one kept
    runs = sorted({r["run"] for r in recs})
    assert runs[-1] == 5 and len(recs) > 500
    for run in runs[1:]:
        seqs = [r["seq"] for r in recs if r["run"] == run]
        assert seqs == list(range(len(seqs)))


def test_the_fsync_interval_bounds_what_waits_measured_by_commits(tmp_path):
    log = DecisionLog(str(tmp_path / "decisions.db"), fsync_interval_ms=200)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 2.0:                      # ~2,000 decisions a second for 2 s
        log.append_event({"stream": "cam0", "id": str(n), "type": "new", "model": {"version": "1"}})
        n += 1
        time.sleep(0.0005)
    log.close()
    s = log.stats()
    print(f"\n{n} appends in 2 s, fsync_interval_ms=200: {s['commits']} commits, worst wait "
          f"{s['max_commit_delay_ms']} ms (appended → committed)")
    assert s["committed_rows"] == n
    assert 9 <= s["commits"] <= 12                          # 2 s / 200 ms = 10, +1 at close
    assert s["max_commit_delay_ms"] < 200 + 50              # each commit's own fsync included


def test_edgeinferctl_decisions_finds_an_event_by_stream_time_and_version(tmp_path):
    path = str(tmp_path / "decisions.db")
    log = DecisionLog(path, fsync_interval_ms=0)            # held open: the bridge writing
    now = time.time_ns()
    hour = 3600 * 10**9
    ev = lambda sid, stream, t, v: {"id": sid, "type": "new", "stream": stream, "rule": "person",  # noqa: E731
                                    "label": "person", "peak_score": 0.91, "start_ns": t, "capture_ns": t,
                                    "model": {"name": "det", "version": v, "digest": None}}
    log.append_event(ev("old", "cam0", now - 3 * hour, "2"))
    log.append_event(ev("wanted", "cam0", now - 60 * 10**9, "2"))
    log.append_event(ev("other-version", "cam0", now - 50 * 10**9, "3"))
    log.append_event(ev("other-stream", "cam1", now - 40 * 10**9, "2"))
    log.append_result({"stream": "cam0", "capture_ns": now - 30 * 10**9, "frame_id": 9, "ok": True,
                       "model": {"name": "det", "version": "2"}})

    def ctl(*args) -> list[dict]:
        r = subprocess.run([*CTL, "decisions", "--db", path, *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines()]

    got = ctl("--stream", "cam0", "--since", "10m", "--model-version", "2", "--kind", "event")
    assert [g["decision"]["id"] for g in got] == ["wanted"]
    assert got[0]["decision"] == ev("wanted", "cam0", now - 60 * 10**9, "2")
    assert got[0]["stream"] == "cam0" and got[0]["model_version"] == "2" and got[0]["time"].endswith("Z")
    assert [g["decision"].get("id", "result") for g in ctl("--stream", "cam0", "--since", "2h",
                                                           "--model-version", "2")] == ["wanted", "result"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((now - 4 * hour) // 10**9))
    assert [g["decision"]["id"] for g in ctl("--stream", "cam0", "--since", iso, "--model-version", "2",
                                             "--kind", "event")] == ["old", "wanted"]
    assert ctl("--stream", "cam2") == []
    r = subprocess.run([*CTL, "decisions", "--db", path, "--stream", "cam0", "--since", "10m", "--table"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.splitlines()[0].split() == ["TIME", "STREAM", "KIND", "MODEL", "VERSION",
                                                                       "WHAT"]
    assert "new person person peak 0.91 wanted" in r.stdout and "other-version" in r.stdout
    assert "old" not in r.stdout.replace("other", "")
    r = subprocess.run([*CTL, "decisions", "--db", path, "--since", "yesterday"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "not a time" in r.stderr
    r = subprocess.run([*CTL, "decisions", "--db", str(tmp_path / "none.db")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "no decision log there" in r.stderr
    log.close()
    assert DecisionReader(path).query(stream="cam0").__next__()["record"]["id"] == "old"
