"""What benchmarks share: a process and its descendants, the CPU time they used (bench/scale.py, bench/mqtt.py,
bench/shedding.py), and the end of a run (its wall time and its JSON summary: bench/fronts.py, bench/shedding.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (lanes may be processes of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids: list[int]) -> tuple[int, int]:
    """(busy clock ticks of all CPUs, /proc/stat; ticks of `pids`, every thread: utime + stime)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(v) - v[3] - v[4], pid_ticks(pids)


def pid_ticks(pids) -> int:
    """Clock ticks of `pids`, every thread: utime + stime (a process gone meanwhile counts nothing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total


def finish(summary: dict, t_start: float, json_path: str | None) -> int:
    """The end of a run: its wall time (into `summary` too), then the summary as one JSON line, on stdout and
    in `json_path` if given. The bench's exit status (0)."""
    summary["wall_s"] = time.monotonic() - t_start
    summary["load_at_end"] = os.getloadavg()  # a shared machine's other work, beside the figures
    print(f"\n(wall time {summary['wall_s']:.0f} s; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in summary['load_at_end'])}; {summary['machine']})")
    text = json.dumps(summary)
    if json_path:
        with open(json_path, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def await_ready(proc: subprocess.Popen) -> str | None:
    """Reads a starting edgeinferd's stdout to its "edgeinferd: ready" line; returns its metrics URL (None if it
    printed none). RuntimeError with the line it printed instead."""
    url = None
    line = proc.stdout.readline().strip()
    while line.startswith("edgeinferd: metrics "):
        url = line.split()[-1]
        line = proc.stdout.readline().strip()
    if line != "edgeinferd: ready":
        raise RuntimeError(f"edgeinferd did not start: {line!r}")
    return url


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout_s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
