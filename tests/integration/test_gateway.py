"""edgeinfer-gateway's gRPC front (Open Inference Protocol v2) driven by tritonclient, unmodified, against the real
daemon: the same fused graph as a camera's frame, every error code as a client meets it."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from daemon_helpers import camera, results, start_daemon, write_config
from edgeinfer.cameras.synthetic import make_frames
from gateway_helpers import start_gateway, write_gateway_config

tc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (requirements/dev.txt)")


@pytest.fixture
def served(tmp_path, children, bundles):
    """The daemon with the orientation classifier and the detector, a camera stream of each (the local ABI path)
    and a pool of each for the gateway (this process's user), and the gateway in front of them."""
    uid = os.getuid()
    config = write_config(tmp_path, None, models={"orient": bundles("orientation"), "det": bundles("detector")},
                          streams=[{"name": "cam-o", "model": "orient"}, {"name": "cam-d", "model": "det"}],
                          pools={"gw-o": {"model": "orient", "user": uid, "streams": 2},
                                 "gw-d": {"model": "det", "user": uid, "streams": 2}},
                          runtime={"fault_injection": "true"})
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    gw_config, address = write_gateway_config(tmp_path, config, models={"orient": {"sizes": ["224x224", "320x240"]}})
    gateway = start_gateway(children, gw_config, address, log_file=str(tmp_path / "gateway.log"))
    client = tc.InferenceServerClient(address)
    yield daemon, gateway, client, address, config, tmp_path
    client.close()


def _infer(client, model, frame, fmt="rgb24", **kw):
    inp = tc.InferInput(f"frame_{fmt}", list(frame.shape), "UINT8")
    inp.set_data_from_numpy(frame)
    return client.infer(model, [inp], **kw)


def _local(daemon, stream, frame, fmt="rgb24"):
    """The same frame bytes through the local ABI path: a camera's ring and its result ring."""
    h, w = frame.shape[:2]
    reader = results(daemon, stream)
    writer = camera(daemon, stream, w, h, fmt)
    try:
        writer.begin()[:] = frame
        fid = writer.publish()
        rec = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rec = reader.read(1.0)
            if rec is not None and rec.frame_id == fid:
                return rec
        pytest.fail(f"no result for stream {stream}")
    finally:
        writer.close()
        reader.close()


def test_tritonclient_gets_what_the_local_abi_path_publishes_bit_for_bit(served):
    daemon, gateway, client, *_ = served
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("orient") and client.is_model_ready("det")
    meta = client.get_model_metadata("orient", as_json=True)
    assert meta["inputs"] == [{"name": "frame_rgb24", "datatype": "UINT8", "shape": ["-1", "-1", "3"]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == \
        [("classes", "FP32", ["-1", "2"]), ("labels", "BYTES", ["-1"])]
    assert meta["versions"] == ["0.0.11"]
    det_meta = client.get_model_metadata("det", as_json=True)
    assert det_meta["inputs"][0]["shape"] == ["416", "416", "3"]
    assert client.get_server_metadata(as_json=True)["name"] == "edgeinfer"

    for (frame, _truth) in make_frames(224, 224, pages=1)[:4]:
        got = _infer(client, "orient", frame)
        local = _local(daemon, "cam-o", frame)
        rows = np.frombuffer(local.payload, np.float32, local.item_count * 2).reshape(-1, 2)
        assert got.as_numpy("classes").tobytes() == rows.tobytes()  # bit for bit
        labels = ["0", "90", "180", "270"]
        assert [b.decode() for b in got.as_numpy("labels")] == [labels[int(c)] for c in rows[:, 0]]
        assert got.get_response().model_version == local.model_version == "0.0.11"
    # Batched as [1, H, W, 3], another accepted size, and the typed contents instead of raw bytes.
    frame = make_frames(320, 240, pages=1)[1][0]
    local = _local(daemon, "cam-o", frame)
    got = _infer(client, "orient", frame[None])
    assert got.as_numpy("classes").tobytes() == \
        np.frombuffer(local.payload, np.float32, local.item_count * 2).tobytes()

    frame = make_frames(416, 416, pages=1)[0][0]
    got = _infer(client, "det", frame)
    local = _local(daemon, "cam-d", frame)
    rows = np.frombuffer(local.payload, np.float32, local.item_count * 6).reshape(-1, 6)
    assert len(rows) > 0 and got.as_numpy("detections").tobytes() == rows.tobytes()
    assert {b.decode() for b in got.as_numpy("labels")} == {"text"}
