"""Follows a stream's results for a while and reports the longest silence (run inside the container with the
installed package's Python, as a reader): how long results stopped while the daemon was restarted or killed.

Usage: gap.py STREAM SECONDS READY_FILE [STOP_FILE]. Writes READY_FILE once attached; follows for SECONDS at
most, or until STOP_FILE exists (the caller's restarts are over) and one more result came (the last silence is
closed, so it is measured); prints one JSON line at the end: {"results": n, "max_gap_ms": g, "attaches": a}."""
import json
import os
import sys
import time

from edgeinfer import ring

stream, seconds, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
stop = sys.argv[4] if len(sys.argv) > 4 else None
reader = ring.ResultReader.watch(stream)
open(ready, "w").close()
end = time.monotonic() + seconds
last = None
gap = 0.0
n = 0
stopping = False
while time.monotonic() < end:
    stopping = stopping or bool(stop and os.path.exists(stop))
    rec = reader.read(0.05)
    if rec is None:
        continue
    now = time.monotonic()
    if last is not None:
        gap = max(gap, now - last)
    last = now
    n += 1
    if stopping:
        break
print(json.dumps({"results": n, "max_gap_ms": round(gap * 1e3), "attaches": reader.attach_count}))
