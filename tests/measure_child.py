"""Runs a command and reports what it alone read and its own peak RSS (tests/daemon_helpers.measured).

    measure_child.py REPORT CMD...   runs CMD (its stdout and stderr are ours), then writes REPORT:
                                     {"rc": exit code, "rchar": bytes read by system calls, "maxrss": bytes}

Linux carries a process's RSS high-water mark into a child it forks and through that child's exec, so a
command forked straight from a large test process reports the test's peak as its own. Forked from this
small launcher instead, the command's ru_maxrss is its own (plus this launcher's few MiB at most).
"""
import json
import os
import sys

report, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie: its /proc/PID/io is still there
try:
    with open(f"/proc/{pid}/io") as f:
        rchar = int(next(x for x in f if x.startswith("rchar:")).split()[1])
except OSError:
    rchar = -1
_, status, usage = os.wait4(pid, 0)
rc = os.waitstatus_to_exitcode(status)
with open(report, "w") as f:
    json.dump({"rc": rc, "rchar": rchar, "maxrss": usage.ru_maxrss * 1024}, f)
sys.exit(rc if rc >= 0 else 128 - rc)
