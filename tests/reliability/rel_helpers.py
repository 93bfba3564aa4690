"""What the reliability tests share: a daemon on a fault model, its health, the
rings a process holds (memfds, since ABI 2), and the process resources a soak
watches."""
from __future__ import annotations

import os
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import fault_models
import numpy as np
from daemon_helpers import poll, read_stats, start_daemon, write_config

from edgeinfer.abi import ring

HERE = Path(__file__).resolve().parent
PUBLISHED_OFFSET = 152  # ring.h: offsetof(ei_frame_ring_header, published)
CONSUMED_OFFSET = 224  # ring.h: offsetof(ei_frame_ring_header, consumed)


def fault_daemon(children, tmp_path, signing_key, stream, kind="checksum", w=64, h=48, runtime=None,
                 extra_streams=(), max_age_ms=60000, model_args=None, wait_ready=True, stream_keys=None, env=None,
                 **kw):
    """edgeinferd serving a signed fault model on `stream`; returns (proc, stats file, config).
    `proc.ingress` / `proc.results` are its sockets; `stream_keys` adds keys to the first stream
    (e.g. its producer and readers); `env`: the daemon's environment (e.g. a NOTIFY_SOCKET)."""
    key, _, trust = signing_key
    path = fault_models.signed_bundle(kind, tmp_path / f"bundle-{kind}", key, w, h, **(model_args or {}))
    streams = [{"name": stream, "width": w, "height": h, "max_age_ms": max_age_ms, **(stream_keys or {})},
               *extra_streams]
    cfg = write_config(tmp_path, path, streams, runtime={"status_interval_s": 0.2, **(runtime or {})},
                       trust_dir=trust, **kw)
    stats = str(tmp_path / "stats.json")
    log = str(tmp_path / "daemon.log")
    return start_daemon(children, cfg, stats_file=stats, wait_ready=wait_ready, log_file=log, env=env), stats, cfg


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def unlabelled_metric(url: str, name: str) -> float:
    """One unlabelled sample of the daemon's /metrics (-1 when missing)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return -1.0
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


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


# ------------------------------------------------------------------ rings held by other processes

def memfds(pid: int, prefix: str = "") -> dict[int, str]:
    """{fd: name} of the memfds process `pid` holds open (names as /proc shows them: '/memfd:LABEL
    (deleted)'), those whose label starts with `prefix` only."""
    out = {}
    d = f"/proc/{pid}/fd"
    for entry in os.listdir(d):
        try:
            target = os.readlink(f"{d}/{entry}")
        except OSError:
            continue
        if target.startswith("/memfd:" + prefix):
            out[int(entry)] = target
    return out


def mapped_memfds(pid: int) -> int:
    """How many distinct memfds process `pid` has mapped (a ring unmapped on drop leaves none)."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            cols = line.split(maxsplit=5)
            if len(cols) == 6 and cols[5].startswith("/memfd:"):
                inodes.add(cols[4])
    return len(inodes)


def open_ring_of(pid: int, stream: str) -> int:
    """Our own fd (read-only) of the frame ring producer `pid` created for `stream` (via /proc: root
    may open another process's memfd). The ring outlives the producer as long as we hold it."""
    found = [fd for fd, name in memfds(pid, f"edgeinfer-frames:{stream}").items()]
    if len(found) != 1:
        raise AssertionError(f"pid {pid} holds {len(found)} frame rings of {stream}: {memfds(pid)}")
    return os.open(f"/proc/{pid}/fd/{found[0]}", os.O_RDONLY | os.O_CLOEXEC)


def slot_states(fd: int) -> list[int]:
    """The state byte of every slot of a frame ring, read through an fd (the ABI's offsets)."""
    head = os.pread(fd, 64, 0)
    slot_count = struct.unpack_from("<I", head, 24)[0]
    slot_stride = struct.unpack_from("<Q", head, 32)[0]
    return [struct.unpack("<Q", os.pread(fd, 8, 4096 + i * slot_stride))[0] & 0xFF
            for i in range(min(slot_count, 64))]


def published(fd: int) -> int:
    """Frames published into a frame ring so far (its header's `published`)."""
    return struct.unpack("<Q", os.pread(fd, 8, PUBLISHED_OFFSET))[0]


def consumed(fd: int) -> int:
    """The seq of the last frame a consumer (a daemon) took or refused: what it accounted for so far."""
    return struct.unpack("<Q", os.pread(fd, 8, CONSUMED_OFFSET))[0]


def latest_seq(fd: int) -> int:
    """The seq of the newest frame a consumer can take (`latest` >> 8; `published` runs ahead of it for the
    moment between the two stores of a publish)."""
    return struct.unpack("<Q", os.pread(fd, 8, 128))[0] >> 8


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    """SIGSTOP, and wait until the kernel says the process is stopped (state T)."""
    proc.send_signal(19)  # SIGSTOP
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return True
        time.sleep(0.001)
    return False


def stop_and_count(prods, names, stats, offered_before, timeout=20.0) -> list[int]:
    """Stops the producers (SIGSTOP: their connections stay open, so the daemon keeps their rings and
    takes their last frames), reads how many frames each published from its ring, waits until the daemon
    has accounted for every one of them, then kills the producers. Returns the counts."""
    fds = [open_ring_of(p.pid, n) for p, n in zip(prods, names)]
    try:
        if not all(stop(p) for p in prods):
            raise AssertionError("a producer did not stop")
        counts = [latest_seq(fd) for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)
    poll(lambda: all(read_stats(stats).get("streams", {}).get(n, {}).get("offered", 0) - base >= c
                     for n, c, base in zip(names, counts, offered_before)), timeout, 0.1)
    for p in prods:
        p.kill()
        p.wait(10)
    return counts


# ------------------------------------------------------------------ child processes

def first_line_or_exit(proc: subprocess.Popen, timeout: float = 20.0) -> tuple[str | None, int | None, str]:
    """(first stdout line, None, '') of a child, or (None, exit code, stderr) if it exited first."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if sel.select(timeout):
            line = proc.stdout.readline()
            if line:
                return line.strip(), None, ""
    finally:
        sel.close()
    try:
        code = proc.wait(5)
    except subprocess.TimeoutExpired:
        return None, None, f"no output within {timeout} s and still running"
    return None, code, proc.stderr.read() if proc.stderr else ""


class Lines:
    """A child's stdout read line by line with a timeout, unbuffered (a buffered readline() after select()
    can swallow a second line that select() then never reports). Use it for every read of that child."""

    def __init__(self, proc: subprocess.Popen):
        self.fd = proc.stdout.fileno()
        self.buf = b""

    def next(self, timeout: float = 10.0) -> str | None:
        """The next line (stripped), or None after `timeout` seconds or at end of output."""
        import select
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()


def process_sample(pid: int) -> dict:
    """RSS (KiB), open fds, threads and ring fds/mappings of a live process."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "ring_fds": len(memfds(pid)),
            "ring_maps": mapped_memfds(pid)}


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the daemon: control plane, zygote, lanes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def tree_sample(pid: int) -> dict:
    """process_sample summed over the daemon's processes (a lane's leak is the daemon's), with their count."""
    total = {"rss_kib": 0, "threads": 0, "fds": 0, "ring_fds": 0, "ring_maps": 0, "processes": 0}
    for p in process_tree(pid):
        try:
            one = process_sample(p)
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile
        for k, v in one.items():
            total[k] += v
        total["processes"] += 1
    return total


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(0.02)
    return None
