"""The reliability campaign's fault matrix: profiles, rows, and the report.

Every reliability test records one row per fault it injects — how often, what
was expected, what happened — *before* it asserts, so a failing fault shows up
in the table too. The rows are printed at the end of the pytest run and, when
EDGEINFER_RELIABILITY_REPORT names a file, written there as Markdown
(`make reliability` writes docs/reliability.md). `make test` runs its tests in two
pytest processes side by side (scripts/run-tests): each writes its rows as JSON to
EDGEINFER_RELIABILITY_ROWS, and `python tests/reliability_matrix.py OUT ROWS...`
writes the one report from them (build/reliability.md).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

PROFILE = os.environ.get("EDGEINFER_RELIABILITY_PROFILE", "short")

# How hard each fault is pushed. "short" runs inside `make test`; "long" on demand.
_PROFILES = {
    "short": dict(producer_kills=1000, producer_resize_attempts=1000, daemon_kills=12, fuzz_segments=100_000, fuzz_native=1_000_000, fuzz_configs=1_000,
                  fuzz_bundle_flips=300, bad_bundles=600, bad_bundles_sample=50, load_seconds=8.0, soak_seconds=180.0, timestamp_frames=300,
                  rtsp_flap_seconds=40.0, control_plane_rounds=2),
    "long": dict(producer_kills=5000, producer_resize_attempts=10_000, daemon_kills=60, fuzz_segments=1_000_000, fuzz_native=20_000_000, fuzz_configs=30_000,
                 fuzz_bundle_flips=3000, bad_bundles=5000, bad_bundles_sample=150, load_seconds=120.0, soak_seconds=3600.0, timestamp_frames=3000,
                 rtsp_flap_seconds=300.0, control_plane_rounds=7),
}
if PROFILE not in _PROFILES:
    raise SystemExit(f"EDGEINFER_RELIABILITY_PROFILE={PROFILE!r}: use one of {sorted(_PROFILES)}")
COUNTS = _PROFILES[PROFILE]
COMMAND = os.environ.get("EDGEINFER_RELIABILITY_COMMAND", "make reliability")  # what produced the report


AREAS = ("isolation", "producer", "camera", "daemon", "gateway", "resource", "bad input", "access", "load", "soak")


@dataclass
class Row:
    area: str
    fault: str
    injected: int
    expected: str
    observed: str
    passed: bool
    test: str


class Matrix:
    def __init__(self):
        self.rows: list[Row] = []
        self.unrecorded: list[tuple[str, str]] = []  # (test, why): failed before recording its row
        self.started = time.time()

    def note_failures(self, reports) -> None:
        """Failed campaign tests that recorded no row (a timeout, an error in setup or before the record)."""
        have = {r.test for r in self.rows}
        for rep in reports:
            name = rep.nodeid.rsplit("::", 1)[-1]
            if ("tests/reliability/" in rep.nodeid or "test_system_nspawn" in rep.nodeid) and name not in have:
                text = str(getattr(rep, "longreprtext", "") or "").strip().splitlines()
                errors = [x[1:].strip() for x in text if x.startswith("E ")]  # pytest's "E   Failed: ..." lines
                self.unrecorded.append((name, (errors[0] if errors else text[-1] if text else rep.outcome)[:200]))

    def record(self, request, area: str, fault: str, injected: int, expected: str, observed: str,
               passed: bool) -> bool:
        """Adds a row; returns `passed` so a test can `assert matrix.record(...)`."""
        self.rows.append(Row(area, fault, injected, expected, observed, bool(passed), request.node.name))
        return bool(passed)

    def save_rows(self, path: str) -> None:
        """This process's rows, for merge() (one report from the processes that shared a run)."""
        with open(path, "w") as f:
            json.dump({"started": self.started, "rows": [asdict(r) for r in self.rows],
                       "unrecorded": self.unrecorded}, f)

    @classmethod
    def merge(cls, paths: list[str]) -> "Matrix":
        """One matrix from the rows several processes saved (a file that is missing: that process recorded none)."""
        m = cls()
        for path in paths:
            if not os.path.exists(path):
                continue
            with open(path) as f:
                saved = json.load(f)
            m.started = min(m.started, saved["started"])
            m.rows += [Row(**r) for r in saved["rows"]]
            m.unrecorded += [tuple(u) for u in saved["unrecorded"]]
        return m

    def table(self) -> list[str]:
        lines = ["| Area | Fault | Injected | Expected | Observed | Result |", "|---|---|---:|---|---|---|"]
        order = {a: i for i, a in enumerate(AREAS)}
        for r in sorted(self.rows, key=lambda r: order.get(r.area, len(order))):
            cells = [r.area, r.fault, f"{r.injected:,}", r.expected, r.observed, "pass" if r.passed else "**FAIL**"]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        return lines

    def markdown(self) -> str:
        took = time.time() - self.started
        passed = sum(r.passed for r in self.rows)
        cpu = _cpu_model()
        head = [
            "# Reliability and security campaign",
            "",
            f"Generated by `{COMMAND}` (the fault matrix in `tests/reliability/`); do not edit by hand —",
            "the prose around the table lives in `tests/reliability_matrix.py`.",
            "",
            f"- Profile: **{PROFILE}** (`make reliability PROFILE={PROFILE}`); `make test` runs the short profile.",
            f"- Run: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, {took / 60:.1f} min, "
            f"{passed} of {len(self.rows)} rows passed"
            + (f"; **{len(self.unrecorded)} tests failed before recording their row** (below the table)."
               if self.unrecorded else "."),
            f"- Machine: {os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, Python "
            f"{platform.python_version()}.",
            "",
        ]
        failed = ["", "Tests that failed before recording their row:", ""] + \
            [f"- `{name}`: {why}" for name, why in self.unrecorded] if self.unrecorded else []
        return "\n".join(head + self.table() + failed + ["", NOTES])


def _cpu_model() -> str:
    from edgeinfer.support.cpuflags import cpuinfo_field
    return cpuinfo_field("model name") or platform.machine()


NOTES = """\
## How to read and rerun it

- `make reliability` runs the short profile (about 12 minutes on 2 vCPUs after the package build) and
  rewrites this file; `make reliability PROFILE=long` pushes every fault harder (5,000 producer kills,
  10,000 resize attempts, 60 daemon kills, 1,000,000 fuzzed rings, 20,000,000 libFuzzer inputs, 2-minute
  load levels, a 1 h soak).
- Every row is one test in `tests/reliability/` (the container rows: `tests/system/test_system_nspawn.py`);
  the test asserts the row's expectation, so a **FAIL** row is also a failed test in `make test`.
- The **isolation** rows play the worst camera and the worst reader as real, unprivileged users
  (created for the run) against a live daemon that serves an honest neighbour: the attackers are plain
  C programs on ring.h (`tests/adversary/`), so they speak the raw protocol, not our library's checks.
  Besides its own outcome, every such row checks that the daemon lived and the neighbour kept >= 90 %
  of its offered frames with no forged or torn result.
- Counts are exact (from the daemon's own counters, compared with what the test offered); timings are
  never pass criteria (the machine is shared), only bounds that no queue could hide under.
- Two tiny ONNX models make faults visible in the daemon's own output
  (`tests/reliability/fault_models.py`): a checksum model whose result says whether the frame it ran
  on was whole and was the frame its id names, and a Loop model that hangs when the producer asks.
- Rings are fuzzed twice. The C readers in ring.h (ring checks, frame acquire, result read, the hello
  check) under coverage-guided libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer
  (`tests/reliability/fuzz_ring.c`), seeded with real rings; clang's source-based coverage of the grown
  corpus is reported per function and must reach each one. And the whole Python reader stack (sealed
  memfds handed to `FrameReader`, result rings, `latest`/`published`/`head` rewritten after attach)
  under a structure-aware mutational fuzzer in a child process (`tests/reliability/fuzz_segments.py`).

## Faults found by this campaign, and fixed in the same change

| Fault | Was | Now |
|---|---|---|
| capture timestamp 0, in the future or near 2^64 | OverflowError in the real-time loop: the loop stopped | dropped and counted `bad_timestamp` |
| result ring `head` near 2^64 (fuzzer) | `ResultReader.read` spun forever | bounded retries; `head > 2^62` or backwards is `CorruptRing` |
| model hangs on the warm-up frame | never READY, forever | warm-up cancelled after max(5 s, 10 × run_deadline_ms), model refused with the reason |
| state directory full or read-only at start | the daemon exited | serves, logs, counts (`edgeinfer_state_write_failures_total`), retries every 10 s |
| `edgeinferctl model allow-downgrade` run as root (as the refusal says) | model-versions.json left `root:root 0600`: the daemon could not read it, refused the allowed rollback, and every restart failed (restart loop) | state files keep their owner and mode whoever writes them (new: the state directory's owner); a writer that cannot is refused, the file unchanged |
| a refused reload (`current` on an unsigned bundle), then a restart | the start failed on the refused bundle: exit 1, restart loop, nothing served | starts on the last known-good bundle (verified again), said in the journal, STATUS=, `/healthz` and `edgeinfer_model_known_good_fallback`; without one, exit 1 with the refusal |
| fd limit reached | a lazy import raised EMFILE and the daemon exited (ABI 1); then (ABI 2) the main thread spun on a failing accept, 256,805 times in 1.5 s | chores guarded; a listener whose accept fails rests 0.2 s (counted, logged) |
| a subdirectory in a bundle | `IsADirectoryError` traceback | refused: not a regular file |
| a 2 MiB (or larger) model.yaml | parsed | refused above 1 MiB, before the YAML parser |
| a key given twice in YAML | the last value silently won | an error naming both lines |
| RSS after reloads | +28 MiB over 4 reloads (glibc kept the freed pages; nothing leaked) | gc + malloc_trim 3 s after a swap |
| a producer shrinks its ring (ABI 1: ftruncate on a named segment) | SIGBUS: the daemon, and every camera with it, died; later absorbed by a SIGBUS guard that a rename race still beat | ABI 2: the ring is sealed before it is handed over; every resize fails with EPERM (1,000 tries a run) |
| a camera that reconnects (soak) | the old ring stayed mapped until a garbage collection (a reference cycle) | closed and unmapped when the loop drops it |
| a ring the daemon cannot map (address-space limit) | answered as a permanent refusal: cameras gave up | answered as transient: the camera retries and is served once the limit is lifted |
| a daemon's "try again" refusal | read by clients as "no message yet": they saw a closed connection, not the reason | distinct codes: the reason reaches the client |
| every attack of the ABI 2 issue (readers forging/killing, cameras impersonating, stalling, starving) | see the issue | refused or confined: the isolation rows |

## Known limits (not covered by a passing row)

- A camera can punch holes in its own ring (`fallocate`; no seal a writer can live with prevents it):
  the daemon's next reads of those pages allocate zero pages charged to the daemon, at most the ring's
  size (`ingress.max_ring_mib`).
- The memory-cgroup row uses cgroup v1's memory controller (what this machine has); a host with only
  cgroup v2 fails it with the reason.
- Load levels are whole cameras at 30 fps, so "150 %" is the nearest multiple (the row shows the
  offered share of the capacity measured in the same run).
"""


if __name__ == "__main__":  # python tests/reliability_matrix.py OUT ROWS...: the report from the saved rows
    out, *saved = sys.argv[1:]
    merged = Matrix.merge(saved)
    with open(out, "w") as f:
        f.write(merged.markdown())
    print(f"reliability matrix: {sum(r.passed for r in merged.rows)} of {len(merged.rows)} rows passed, "
          f"written to {out}")
