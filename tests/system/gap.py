"""Follows a stream's results for a while and reports the longest silence (run inside the container with the
installed package's Python, as a reader): how long results stopped while the daemon was restarted or killed.

Usage: gap.py STREAM SECONDS READY_FILE. Writes READY_FILE once attached; prints one JSON line at the end:
{"results": n, "max_gap_ms": g, "attaches": a}."""
import json
import sys
import time

from edgeinfer import ring

stream, seconds, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
reader = ring.ResultReader.watch(stream)
open(ready, "w").close()
end = time.monotonic() + seconds
last = None
gap = 0.0
n = 0
while time.monotonic() < end:
    rec = reader.read(0.05)
    if rec is None:
        continue
    now = time.monotonic()
    if last is not None:
        gap = max(gap, now - last)
    last = now
    n += 1
print(json.dumps({"results": n, "max_gap_ms": round(gap * 1e3), "attaches": reader.attach_count}))
