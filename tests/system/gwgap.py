"""A gateway client across an upgrade (run inside the container with the installed package's Python): ModelInfer
of one 224x224 frame to 127.0.0.1:8001, one request at a time, each with a 5 s client_timeout, until STOP_FILE
exists and one more answer came. Prints one JSON line: answers, the longest time between two answers (ms), and
the failures by gRPC status code (what a client sees while the daemon and the gateway restart).

Usage: gwgap.py MODEL SECONDS READY_FILE STOP_FILE"""
import collections
import json
import os
import sys
import time

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

model, seconds, ready, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
frame = np.zeros((224, 224, 3), np.uint8)
frame[:, 112:] = 255
codes = collections.Counter()
answers, gap, last, stopping, ready_written = 0, 0.0, None, False, False
end = time.monotonic() + seconds
client = None
while time.monotonic() < end:
    stopping = stopping or os.path.exists(stop)
    try:
        client = client or tc.InferenceServerClient("127.0.0.1:8001")
        inp = tc.InferInput("frame_rgb24", list(frame.shape), "UINT8")
        inp.set_data_from_numpy(frame)
        client.infer(model, [inp], client_timeout=5.0)
    except InferenceServerException as e:
        codes[str(e.status()) if e.status() else "no status"] += 1
        time.sleep(0.05)
        continue
    except Exception as e:  # the channel itself: made again on the next try
        codes[type(e).__name__] += 1
        client = None
        time.sleep(0.05)
        continue
    now = time.monotonic()
    if last is not None:
        gap = max(gap, now - last)
    last, answers = now, answers + 1
    if not ready_written:
        open(ready, "w").close()
        ready_written = True
    if stopping:
        break
    time.sleep(0.02)
print(json.dumps({"answers": answers, "max_gap_ms": round(gap * 1e3), "failures": dict(codes)}))
