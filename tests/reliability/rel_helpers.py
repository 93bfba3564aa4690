"""What the reliability tests share: a daemon on a fault model, its health, and
the process resources a soak watches."""
from __future__ import annotations

import os
import struct
import urllib.error
import urllib.request

import fault_models
import numpy as np
from daemon_helpers import read_stats, start_daemon, write_config

from edgeinfer import ring


def stream_of(shm_name: str) -> str:
    """The stream whose segments are `shm_name` and `shm_name.results` (both cleaned up by the fixture)."""
    return shm_name.split("edgeinfer.", 1)[1]


def fault_daemon(children, tmp_path, signing_key, shm_name, kind="checksum", w=64, h=48, runtime=None,
                 extra_streams=(), max_age_ms=60000, model_args=None, wait_ready=True, **kw):
    """edgeinferd serving a signed fault model on stream `shm_name`; returns (proc, stats file)."""
    key, _, trust = signing_key
    path = fault_models.signed_bundle(kind, tmp_path / f"bundle-{kind}", key, w, h, **(model_args or {}))
    streams = [{"name": stream_of(shm_name), "width": w, "height": h, "max_age_ms": max_age_ms}, *extra_streams]
    cfg = write_config(tmp_path, path, streams, runtime={"status_interval_s": 0.2, **(runtime or {})},
                       trust_dir=trust, **kw)
    stats = str(tmp_path / "stats.json")
    log = str(tmp_path / "daemon.log")
    return start_daemon(children, cfg, stats_file=stats, wait_ready=wait_ready, log_file=log), stats, cfg


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def stream_stats(stats_file: str, stream: str) -> dict:
    return read_stats(stats_file).get("streams", {}).get(stream, {})


def drain(reader: ring.ResultReader) -> list:
    out = []
    while (rec := reader.read(0)) is not None:
        out.append(rec)
    return out


def checksum_ok(rec) -> bool:
    """A checksum-model result: the frame had no stray byte and is the frame its id names."""
    mismatches, first = np.frombuffer(rec.payload, np.float32)[:2]
    return mismatches == 0 and int(first) == (rec.frame_id * 7) & 0xFF


def slot_states(path: str) -> list[int]:
    """The state byte of every slot of a frame segment, read from the file (the ABI's offsets)."""
    with open(path, "rb") as f:
        head = f.read(64)
        slot_count = struct.unpack_from("<I", head, 24)[0]
        slot_stride = struct.unpack_from("<Q", head, 32)[0]
        states = []
        for i in range(min(slot_count, 64)):
            f.seek(4096 + i * slot_stride)
            states.append(struct.unpack("<Q", f.read(8))[0] & 0xFF)
    return states


def process_sample(pid: int) -> dict:
    """RSS (KiB), open fds and threads of a live process."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def shm_entries(*prefixes: str, shm_dir: str = "/dev/shm") -> list[str]:
    return sorted(e for e in os.listdir(shm_dir) if any(p in e for p in prefixes))
