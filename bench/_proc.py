"""Processes of a benchmark: a process and its descendants, and the CPU time they used (bench/scale.py,
bench/mqtt.py)."""
from __future__ import annotations

import os


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
    busy = sum(v) - v[3] - v[4]
    mine = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            mine += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return busy, mine
