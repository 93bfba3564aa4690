"""The cameras of a benchmark, in a process of their own (bench/mqtt.py, bench/rollout.py): n streams published
at a rate between "go" and "stop", every result read back, the lanes' latency (capture → result committed) of
each window from the cameras' own readers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from edgeinfer.abi import ring  # noqa: E402


def camera_child(n: int, fps: float, ingress: str, results: str, width: int, height: int) -> int:
    """Publishes width x height bgr24 frames on streams s00..s{n-1} at `fps` each between "go" and "stop" (stdin);
    reads every stream's results and answers "stop" with the lanes' latencies (done - capture, µs) of the window,
    the counts and the model versions that answered."""
    import select
    rng = np.random.default_rng(7)
    frame = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    names = [f"s{i:02d}" for i in range(n)]
    writers = [ring.FrameWriter.connect(s, width, height, "bgr24", socket=ingress) for s in names]
    readers = [ring.ResultReader.connect(s, socket=results) for s in names]
    print("ready", flush=True)
    period = 1.0 / fps
    fid = 0

    versions: dict[str, int] = {}

    def drain(lat: list | None) -> int:
        got = 0
        for r in readers:
            while (rec := r.read(0.0)) is not None:
                got += 1
                if lat is not None:
                    lat.append((rec.done_ns - rec.capture_ns) / 1e3)
                    versions[rec.model_version] = versions.get(rec.model_version, 0) + 1
        return got
    for line in sys.stdin:
        if line.strip() != "go":
            break
        drain(None)
        lat: list[float] = []
        versions.clear()
        published = read = 0
        next_t = time.monotonic()
        while True:
            if select.select([sys.stdin], [], [], max(next_t - time.monotonic(), 0.0))[0]:
                sys.stdin.readline()
                break
            fid += 1
            for w in writers:
                np.copyto(w.begin(), frame)
                w.publish(frame_id=fid)
            published += len(writers)
            read += drain(lat)
            next_t += period
            late = time.monotonic() - next_t
            if late > 0:
                next_t += (int(late / period) + 1) * period
        time.sleep(0.2)
        read += drain(lat)
        print(json.dumps({"published": published, "read": read, "lat_us": lat, "versions": versions}), flush=True)
    for x in writers + readers:
        x.close()
    return 0


class Cameras:
    def __init__(self, n: int, fps: float, ingress: str, results: str, width: int, height: int):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(n), str(fps), ingress, results,
                                      str(width), str(height)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the cameras did not connect: {line!r}")

    def window(self, seconds: float, during=lambda: None) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        during()
        time.sleep(seconds)
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


if __name__ == "__main__":
    n, fps, ingress, results, width, height = sys.argv[1:7]
    sys.exit(camera_child(int(n), float(fps), ingress, results, int(width), int(height)))
