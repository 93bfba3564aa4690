"""The decision log: events (always) and results (optionally) on the host, for `edgeinferctl decisions`.

SQLite in WAL mode (docs/decisions/0027-decision-log-format.md):

- **No torn record.** Every batch of appends is one transaction; a crash (kill -9, OOM, a power cut) leaves the
  database at a committed state: a row is all there or not there.
- **What a power cut can lose** is bounded by `fsync_interval_ms`: appends wait in memory, and the first append or
  `flush()` after the oldest waiting one is `fsync_interval_ms` old commits them all with `synchronous=FULL`
  (the WAL is fsynced before the commit returns). The bridge calls `flush()` on every turn of its loop (at most
  50 ms apart), so a decision is durable at most fsync_interval_ms + one turn + the commit's fsync after it was
  made. `commits` counts the commits (one WAL fsync each) and `max_commit_delay_ns` the oldest append's age when
  its commit returned: the bound measured, not only claimed. A process crash loses only what waited in memory.
- **Bounded disk.** `auto_vacuum=INCREMENTAL`: rows older than `max_age_days`, then the oldest rows while the
  live pages exceed `max_bytes` (down to 90% of it), are deleted and the freed pages returned to the filesystem
  (`PRAGMA incremental_vacuum`): the age every ROTATE_EVERY_S, the size after every commit that left the file
  over max_bytes. So the file stays within max_bytes + one commit's rows; the WAL beside it is checkpointed
  every WAL_PAGES pages and truncated to WAL_LIMIT after a checkpoint.
- **Queryable.** Indexes on (stream, time_ns) and (model_version, time_ns); `DecisionReader` opens the file
  read-only (`mode=ro` URI) and reads while the bridge writes (WAL: readers never block the writer).
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from typing import Iterator

log = logging.getLogger("edgeinfer-mqtt")

KIND_EVENT = "event"
KIND_RESULT = "result"
KINDS = (KIND_EVENT, KIND_RESULT)

SCHEMA_VERSION = 1
ROTATE_EVERY_S = 10.0         # how often the age and size bounds are enforced (and at open and close)
MAX_PENDING = 4096            # appends waiting in memory at most: over it, a commit now (memory stays bounded)
WAL_PAGES = 1000              # checkpoint the WAL every this many pages (SQLite's default)
WAL_LIMIT = 4 << 20           # and truncate it to this size after a checkpoint
SIZE_TARGET = 0.9             # rotation by size deletes down to this fraction of max_bytes
DELETE_BATCH_MIN = 64
ERROR_LOG_S = 10.0            # a failing disk is logged at most this often (every failure is counted)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('event', 'result')),
    stream TEXT NOT NULL,
    time_ns INTEGER NOT NULL,          -- the decision's time (wall clock): capture time of the frame that decided
    model_name TEXT,
    model_version TEXT,
    logged_ns INTEGER NOT NULL,        -- when the log took it (wall clock): what max_age_days is measured by
    record TEXT NOT NULL               -- the whole event or result message, JSON
);
CREATE INDEX IF NOT EXISTS decisions_stream_time ON decisions (stream, time_ns);
CREATE INDEX IF NOT EXISTS decisions_version_time ON decisions (model_version, time_ns);
CREATE INDEX IF NOT EXISTS decisions_logged ON decisions (logged_ns);
"""


class DecisionLogError(OSError):
    """The log cannot be opened or written (an OSError, so the bridge's start reports it in one line)."""


def _model(d: dict) -> tuple[str | None, str | None]:
    m = d.get("model")
    if isinstance(m, dict):
        return m.get("name"), m.get("version")
    return d.get("model_name", m if isinstance(m, str) else None), d.get("model_version")


def _time_ns(d: dict, now_ns: int) -> int:
    # the frame that decided (an event's `capture_ns`: the frame that started, updated or ended it)
    for key in ("time_ns", "capture_ns", "end_ns", "start_ns"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return now_ns


def row_of(kind: str, d: dict, now_ns: int) -> tuple:
    """The row of one decision: (kind, stream, time_ns, model_name, model_version, logged_ns, record JSON)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {KINDS}")
    stream = d.get("stream")
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"a decision names its stream: {d!r:.200}")
    name, version = _model(d)
    return (kind, stream, _time_ns(d, now_ns), None if name is None else str(name),
            None if version is None else str(version), now_ns,
            json.dumps(d, separators=(",", ":"), default=str))


class DecisionLog:
    """The writer (one per database: the bridge). Not thread-safe: the bridge's loop is its one caller."""

    def __init__(self, path: str, *, fsync_interval_ms: float = 200, max_bytes: int = 256 << 20,
                 max_age_days: float = 30, registry=None, clock=time.time_ns, monotonic=time.monotonic_ns):
        self.path = path
        self.interval_ns = int(fsync_interval_ms * 1e6)
        self.max_bytes = int(max_bytes)
        self.max_age_ns = int(max_age_days * 86400e9)
        self._clock, self._mono = clock, monotonic
        self._pending: list[tuple] = []
        self._oldest_ns = 0                 # monotonic time of the oldest pending append
        self._next_rotate = 0.0
        self.commits = 0                    # transactions committed (one WAL fsync each: synchronous=FULL)
        self.appended = {KIND_EVENT: 0, KIND_RESULT: 0}
        self.committed_rows = 0
        self.rotated = {"age": 0, "size": 0}
        self.max_commit_delay_ns = 0        # the oldest append's age when its commit returned, the worst seen
        self.errors = 0                     # failed commits or rotations (disk full, I/O error)
        self.dropped = 0                    # decisions lost because writes failed and MAX_PENDING was reached
        self._next_error_log = 0.0
        self._metrics = _Metrics(registry) if registry is not None else None
        parent = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(parent, mode=0o750, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
            db = self.db
            # auto_vacuum must be set before the first table exists (a no-op on an existing database that has it).
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise DecisionLogError(f"{path}: cannot use WAL mode (journal_mode is {mode})")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                # a file made elsewhere without it: switch it (a one-off VACUUM), or disk would not shrink
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")
                db.execute("VACUUM")
        except sqlite3.Error as e:
            raise DecisionLogError(f"decision log {path}: {e}") from e
        self.rotate()

    # ------------------------------------------------------------------ writing

    def append_event(self, event: dict) -> None:
        self._append(KIND_EVENT, event)

    def append_result(self, record: dict) -> None:
        self._append(KIND_RESULT, record)

    def _append(self, kind: str, d: dict) -> None:
        row = row_of(kind, d, self._clock())
        if not self._pending:
            self._oldest_ns = self._mono()
        self._pending.append(row)
        self.appended[kind] += 1
        if self._metrics:
            self._metrics.appended.labels(kind).inc()
        if len(self._pending) >= MAX_PENDING:
            self.commit()
        self.flush()

    def due_in_s(self) -> float:
        """Seconds until the waiting appends must be committed (inf when none wait)."""
        if not self._pending:
            return float("inf")
        return max(0.0, (self._oldest_ns + self.interval_ns - self._mono()) / 1e9)

    def flush(self, force: bool = False) -> bool:
        """Commits the waiting appends if the oldest has waited fsync_interval_ms (or `force`); True if it did.
        Called by every append and by the bridge's loop on every turn. Also enforces the bounds now and then."""
        done = False
        if self._pending and (force or self._mono() - self._oldest_ns >= self.interval_ns):
            self.commit()
            done = True
        if time.monotonic() >= self._next_rotate:
            self.rotate()
        return done

    def commit(self) -> bool:
        """Commits what waits, in one transaction (one WAL fsync). A failed write (disk full, I/O error) is logged
        (at most every ERROR_LOG_S), counted in `errors`, and the rows wait for the next try, the oldest dropped
        (counted in `dropped`) beyond MAX_PENDING: the bridge's loop never stops for its log."""
        if not self._pending:
            return False
        rows, self._pending = self._pending, []
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany("INSERT INTO decisions (kind, stream, time_ns, model_name, model_version, "
                                    "logged_ns, record) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            self._failed(e, len(rows))
            rows += self._pending
            over = len(rows) - MAX_PENDING
            if over > 0:
                self.dropped += over
                if self._metrics:
                    self._metrics.dropped.inc(over)
                rows = rows[over:]
            self._pending = rows
            return False
        self.commits += 1
        self.committed_rows += len(rows)
        delay = self._mono() - self._oldest_ns
        self.max_commit_delay_ns = max(self.max_commit_delay_ns, delay)
        if self._metrics:
            self._metrics.commits.inc()
            self._metrics.delay.observe(delay / 1e9)
        if self.file_bytes() > self.max_bytes:  # the size bound after every commit (two cheap pragmas)
            self.rotate()
        return True

    def _failed(self, e: Exception, waiting: int = 0) -> None:
        self.errors += 1
        if self._metrics:
            self._metrics.errors.inc()
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + ERROR_LOG_S
            log.error("decision log %s: cannot write (%s); %d decision(s) wait in memory, %d dropped so far",
                      self.path, e, waiting or len(self._pending), self.dropped)

    # ------------------------------------------------------------------ bounds

    def size_bytes(self) -> int:
        """Live pages × page size: what the rows and indexes take (free pages excluded)."""
        pc, fl, ps = (self.db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                               "page_size"))
        return (pc - fl) * ps

    def file_bytes(self) -> int:
        return self.db.execute("PRAGMA page_count").fetchone()[0] * self.db.execute("PRAGMA page_size").fetchone()[0]

    def rotate(self) -> dict:
        """Deletes rows older than max_age_days, then the oldest rows while the live size exceeds max_bytes (down
        to SIZE_TARGET of it), and gives the freed pages back. Returns what it deleted, by reason."""
        self._next_rotate = time.monotonic() + ROTATE_EVERY_S
        out = {"age": 0, "size": 0}
        db = self.db
        try:
            cutoff = self._clock() - self.max_age_ns
            out["age"] = db.execute("DELETE FROM decisions WHERE logged_ns < ?", (cutoff,)).rowcount
            size = self.size_bytes()
            if size > self.max_bytes:
                target = int(self.max_bytes * SIZE_TARGET)
                while size > target:
                    rows = db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
                    if not rows:
                        break
                    per_row = max(1, size // rows)
                    n = max(DELETE_BATCH_MIN, (size - target) // per_row + 1)
                    cur = db.execute("DELETE FROM decisions WHERE id IN (SELECT id FROM decisions ORDER BY id "
                                     "LIMIT ?)", (n,))
                    out["size"] += cur.rowcount
                    size = self.size_bytes()
            # also pages a rotation killed between its DELETE and its vacuum left free
            if out["age"] or out["size"] or db.execute("PRAGMA freelist_count").fetchone()[0]:
                # executescript steps it to the end (execute() would free one page: one step)
                db.executescript("PRAGMA incremental_vacuum;")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as e:
            self._failed(e)
        for reason, n in out.items():
            self.rotated[reason] += n
            if self._metrics and n:
                self._metrics.rotated.labels(reason).inc(n)
        if self._metrics:
            self._metrics.bytes.set(self.file_bytes())
        return out

    def stats(self) -> dict:
        return {"commits": self.commits, "errors": self.errors, "dropped": self.dropped, "appended": dict(self.appended), "committed_rows": self.committed_rows,
                "pending": len(self._pending), "rotated": dict(self.rotated),
                "max_commit_delay_ms": round(self.max_commit_delay_ns / 1e6, 3)}

    def close(self) -> None:
        if self.db is None:
            return
        try:
            self.commit()
            self.rotate()
        finally:
            self.db.close()
            self.db = None


class _Metrics:
    def __init__(self, registry):
        from prometheus_client import Counter, Gauge, Histogram
        self.appended = Counter("edgeinfer_mqtt_decisions_appended", "Decisions handed to the decision log, by "
                                "kind (event, result).", ["kind"], registry=registry)
        self.commits = Counter("edgeinfer_mqtt_decisions_commits", "Commits of the decision log (each one WAL "
                               "fsync: synchronous=FULL).", registry=registry)
        self.delay = Histogram("edgeinfer_mqtt_decisions_commit_delay_seconds", "The oldest decision's age when "
                               "its commit returned: what a power cut could have lost.",
                               buckets=(0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 1.0, 2.5), registry=registry)
        self.errors = Counter("edgeinfer_mqtt_decisions_errors", "Failed writes of the decision log (disk full, "
                              "I/O error): the decisions wait in memory, up to a bound.", registry=registry)
        self.dropped = Counter("edgeinfer_mqtt_decisions_dropped", "Decisions lost: writes kept failing and more "
                               "than the bound waited in memory.", registry=registry)
        self.rotated = Counter("edgeinfer_mqtt_decisions_rotated", "Decisions deleted by rotation, by reason "
                               "(age, size).", ["reason"], registry=registry)
        self.bytes = Gauge("edgeinfer_mqtt_decisions_bytes", "The decision log's file size (pages × page size).",
                           registry=registry)


# ---------------------------------------------------------------------- reading


class DecisionReader:
    """Queries, read-only (`mode=ro`): safe beside a writing bridge, and needs no write permission on the file."""

    def __init__(self, path: str):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no decision log there")
        from urllib.parse import quote
        try:
            self.db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=5.0)
            self.db.execute("SELECT 1 FROM decisions LIMIT 1").fetchall()
        except sqlite3.Error as e:
            raise DecisionLogError(f"decision log {path}: {e}") from e

    def query(self, *, stream: str | None = None, since_ns: int | None = None, until_ns: int | None = None,
              model_version: str | None = None, kind: str | None = None,
              limit: int | None = None) -> Iterator[dict]:
        """Decisions in time order (then log order), each {id, kind, stream, time_ns, model_name, model_version,
        logged_ns, record} with record the decoded JSON."""
        where, args = [], []
        for col, val in (("stream = ?", stream), ("time_ns >= ?", since_ns), ("time_ns < ?", until_ns),
                         ("model_version = ?", model_version), ("kind = ?", kind)):
            if val is not None:
                where.append(col)
                args.append(val)
        sql = ("SELECT id, kind, stream, time_ns, model_name, model_version, logged_ns, record FROM decisions"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY time_ns, id")
        if limit:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            for row in self.db.execute(sql, args):
                yield {"id": row[0], "kind": row[1], "stream": row[2], "time_ns": row[3], "model_name": row[4],
                       "model_version": row[5], "logged_ns": row[6], "record": json.loads(row[7])}
        except sqlite3.Error as e:
            raise DecisionLogError(f"decision log: {e}") from e

    def close(self) -> None:
        self.db.close()
