"""The payloads the MQTT bridge publishes (docs/schemas/mqtt-result.schema.json).

A result message carries what the record carries, decoded (payloads.describe, labels by name through the
daemon's configuration), and the times a consumer needs: capture (the camera's CLOCK_REALTIME) and publish
(the bridge's), both as ISO-8601 and nanoseconds, and the end-to-end latency between them. A detection's box is
normalised to the frame (0-1, by the frame size the record carries since 0.3), and in pixels beside it.

The bundle digest is the sha256 of model.onnx of the configured bundle (or one beside it) whose model.yaml
names the record's model and version; null when no such bundle is found (the record itself carries only name
and version).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os

from edgeinfer.abi.payloads import describe
from edgeinfer.abi.vocabulary import RESULT_OK
from edgeinfer.config.labels import read_meta
from edgeinfer.models.bundle import BundleError
from edgeinfer.support.yamlconf import ConfigError

SCHEMA_ID = "https://edgeinfer.invalid/schemas/mqtt-result.schema.json"
DIGEST_READ = 1 << 20


def iso(ns: int) -> str:
    """UTC ISO-8601 with microseconds (the nanoseconds travel beside it)."""
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="microseconds") \
        .replace("+00:00", "Z")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(DIGEST_READ):
            h.update(chunk)
    return h.hexdigest()


class Digests:
    """(model, version) -> sha256 of model.onnx, from the bundles the daemon's configuration names (and their
    siblings, found by the same LabelSource rules); computed once per version."""

    def __init__(self, bundles):
        self._bundles = bundles   # callable: the candidate bundle directories
        self._known: dict[tuple[str, str], str | None] = {}

    def digest(self, model: str, version: str) -> str | None:
        key = (model, version)
        if key not in self._known:
            self._known[key] = None
            try:
                bundles = list(self._bundles())
            except (ConfigError, BundleError, OSError):  # the daemon's file unreadable now: no digest, not a crash
                bundles = []
            for bundle in bundles:
                try:
                    meta = read_meta(bundle)
                    if (meta.name, meta.version) == key:
                        self._known[key] = file_sha256(os.path.join(bundle, "model.onnx"))
                        break
                except (BundleError, OSError):  # a bundle we cannot read names no digest
                    continue
        return self._known[key]


def result_message(rec, stream: str, node: str, labels: list[str] | None, digest: str | None) -> dict:
    """The message of one record, without its publish time (added by `finish` when it is handed to the broker)."""
    status_ok = rec.status == RESULT_OK
    out = {"stream": stream, "node": node, "number": rec.number, "frame_id": rec.frame_id,
           "frame_seq": rec.frame_seq, "status": rec.status, "ok": status_ok,
           "capture_ns": rec.capture_realtime_ns, "capture_time": iso(rec.capture_realtime_ns),
           "model": {"name": rec.model_name, "version": rec.model_version, "digest": digest},
           "inference_ms": round((rec.done_ns - rec.start_ns) / 1e6, 3),
           "daemon_latency_ms": round((rec.done_ns - rec.capture_ns) / 1e6, 3),
           "missed": rec.missed, "kind": rec.kind,
           "frame": {"width": rec.frame_width, "height": rec.frame_height} if rec.frame_width and rec.frame_height
           else None}
    out.update(describe(rec.kind, rec.payload, rec.item_count, labels or []) if status_ok else {})
    if "detections" in out:
        out["detections"] = [normalised(d, out["frame"]) for d in out["detections"]]
    return out


def normalised(det: dict, frame: dict | None) -> dict:
    """A detection with `box` normalised to the frame (x1/w, y1/h, x2/w, y2/h; null when the record did not say
    the frame's size) and `box_px`, the same corners in the frame's pixels (what the rules' areas and regions use)."""
    px = det.pop("box")
    box = None if frame is None else [px[0] / frame["width"], px[1] / frame["height"], px[2] / frame["width"],
                                      px[3] / frame["height"]]
    return {"box": box, "box_px": px, **det}


def finish(msg: dict, now_ns: int) -> bytes:
    """The bytes sent: the message with its publish time and the end-to-end latency (publish − capture, wall)."""
    msg["publish_ns"] = now_ns
    msg["publish_time"] = iso(now_ns)
    if "capture_ns" in msg:  # a retained state has no capture of its own
        msg["latency_ms"] = round((now_ns - msg["capture_ns"]) / 1e6, 3)
    return json.dumps(msg, separators=(",", ":")).encode()
