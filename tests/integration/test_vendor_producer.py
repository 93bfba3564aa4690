"""A vendor's producer written from docs/abi.md alone (issue 22, defects 1 and 4): Python's standard library,
nv12 frames of the documented length, the real daemon serving them; and the daemon's one log line when a frame
has the wrong length (the old table's row_stride x height), naming both lengths."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, read_line
from daemon_helpers import read_stats, results, start_daemon, stop_daemon, wait_for, write_config

W, H = 320, 240
FRAME = W * H * 3 // 2  # docs/abi.md, "Frame length": nv12 takes height x 3/2 rows


def test_a_stdlib_producer_from_the_docs_is_served_and_a_short_frame_is_said_once(bundles, children, tmp_path,
                                                                                 stream):
    """`python3 -I -S tests/stdlib_producer.py` (nothing but the standard library: no edgeinfer, no numpy)
    hands over an nv12 ring and publishes frames one at a time: each is served (its result names its frame id).
    Two frames with payload_len = width x height are counted `short`, served nothing, stall nothing, and give
    exactly one log line (rate-limited per stream) with the frame, both lengths and the geometry."""
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": stream, "width": W, "height": H, "pixel_format": "nv12", "max_age_ms": 60000}])
    stats, log = str(tmp_path / "stats.json"), tmp_path / "daemon.log"
    proc = start_daemon(children, cfg, stats_file=stats, log_file=str(log))
    reader = results(proc, stream)
    cam = children.spawn([sys.executable, "-I", "-S", str(ROOT / "tests/stdlib_producer.py"), proc.ingress, stream,
                          str(W), str(H)], stdin=subprocess.PIPE)
    try:
        assert read_line(cam, 30) == "CONNECTED"

        def send(verb: str, frame_id: int, length: int) -> None:
            cam.stdin.write(f"{verb} {frame_id}\n")
            cam.stdin.flush()
            line = read_line(cam)
            assert line.startswith("PUBLISHED ") and line.endswith(f" len={length}"), line

        def served(frame_id: int) -> None:
            rec = reader.read(30.0)
            assert rec is not None and rec.status == 0 and rec.frame_id == frame_id, (frame_id, rec)

        def counted_short(n: int) -> None:
            wait_for(lambda: read_stats(stats).get("streams", {}).get(stream, {}).get("short") == n, 30,
                     f"{n} short frame(s) counted")

        for i in range(1, 6):
            send("frame", i, FRAME)
            served(i)
        send("short", 6, W * H)
        counted_short(1)
        send("frame", 7, FRAME)
        served(7)  # the short frame stalled nothing
        send("short", 8, W * H)
        counted_short(2)
        send("frame", 9, FRAME)
        served(9)
        cam.stdin.write("quit\n")
        cam.stdin.flush()
        assert cam.wait(30) == 0, cam.stderr.read()
    finally:
        reader.close()
    assert stop_daemon(proc) == 0
    s = read_stats(stats)["streams"][stream]  # written after the lanes stopped
    assert (s["processed"], s["short"], s["torn"], s["error"], s["stale"]) == (7, 2, 0, 0, 0), s
    said = [line for line in log.read_text().splitlines() if "dropped as short" in line]
    assert len(said) == 1, said  # the second short frame came within the minute: counted, not said again
    assert f"stream {stream}: frame 6 dropped as short: its payload_len is {W * H} bytes, a whole {W}x{H} nv12 " \
           f"frame is {FRAME} bytes" in said[0], said[0]
