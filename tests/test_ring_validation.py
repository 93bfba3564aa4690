"""Malformed segments: each is refused with its own error type and a message
naming the segment; a fuzz of header fields never crashes the reader."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer import ring
from ring_helpers import LATEST_OFFSET

SHM = "/dev/shm"
# Offsets of the immutable frame-ring header fields (ring.h, docs/abi.md).
FIELDS = {  # name: (offset, struct format)
    "abi_version": (8, "<I"), "header_size": (12, "<I"), "total_size": (16, "<Q"), "slot_count": (24, "<I"),
    "slot_header_size": (28, "<I"), "slot_stride": (32, "<Q"), "payload_capacity": (40, "<Q"),
    "width": (48, "<I"), "height": (52, "<I"), "channels": (56, "<I"), "pixel_format": (60, "<I"),
    "row_stride": (64, "<I"),
}


def valid_image(name: str, width=16, height=8, slots=3) -> bytes:
    """The bytes of a real, valid frame ring with one published frame."""
    with ring.FrameWriter.create(name, width, height, slots=slots) as w:
        w.begin()[:] = 5
        w.publish()
        with open(f"{SHM}/{name}", "rb") as f:
            data = f.read()
    return data


def write_segment(name: str, data: bytes, mode: int = 0o660) -> None:
    path = f"{SHM}/{name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def patch(data: bytes, field: str, value: int) -> bytes:
    off, fmt = FIELDS[field]
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


@pytest.fixture(scope="module")
def image():
    name = "edgeinfer.test-validation-image"
    try:
        yield valid_image(name)
    finally:
        if os.path.exists(f"{SHM}/{name}"):
            os.unlink(f"{SHM}/{name}")


CASES = [
    ("bad magic", lambda d: b"NOTARING" + d[8:], ring.BadMagic, "bad magic"),
    ("result ring", None, ring.BadMagic, "is a result ring"),
    ("future ABI", lambda d: patch(d, "abi_version", 2), ring.AbiMismatch, "ABI version 2"),
    ("shorter than the header", lambda d: d[:100], ring.TruncatedSegment, "smaller than the 4096-byte header"),
    ("empty file", lambda d: b"", ring.TruncatedSegment, "0 bytes"),
    ("shorter than its geometry", lambda d: d[:-1], ring.TruncatedSegment, "its geometry needs"),
    ("two slots", lambda d: patch(d, "slot_count", 2), ring.BadGeometry, "2 slots"),
    ("65 slots", lambda d: patch(d, "slot_count", 65), ring.BadGeometry, "65 slots"),
    ("width beyond the row", lambda d: patch(d, "width", 1000), ring.BadGeometry, "row stride"),
    ("height beyond the payload", lambda d: patch(d, "height", 9), ring.BadGeometry, "do not hold"),
    ("channels disagree with format", lambda d: patch(d, "channels", 4), ring.BadGeometry, "channels"),
    ("unknown pixel format", lambda d: patch(d, "pixel_format", 99), ring.BadGeometry, "pixel format"),
    ("declared size disagrees", lambda d: patch(d, "total_size", 12345), ring.BadGeometry, "declared size"),
    ("slot stride unaligned", lambda d: patch(d, "slot_stride", 500), ring.BadGeometry, "slot stride"),
    ("zero row stride", lambda d: patch(d, "row_stride", 0), ring.BadGeometry, "row stride 0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_segment_is_refused_with_its_reason(shm_name, image, case):
    _, mutate, exc, text = case
    if mutate is None:
        with ring.ResultWriter.create(shm_name, 8):
            with pytest.raises(exc, match=text) as info:
                ring.FrameReader.attach(shm_name)
    else:
        write_segment(shm_name, mutate(image))
        with pytest.raises(exc, match=text) as info:
            ring.FrameReader.attach(shm_name)
    assert shm_name in str(info.value)


def test_world_writable_segment_is_refused(shm_name, image):
    write_segment(shm_name, image, mode=0o666)
    with pytest.raises(ring.InsecureSegment, match="world-writable"):
        ring.FrameReader.attach(shm_name)


def test_owner_outside_the_allowed_set_is_refused(shm_name, image):
    write_segment(shm_name, image)
    with pytest.raises(ring.UntrustedOwner, match=f"uid {os.getuid()}"):
        ring.FrameReader.attach(shm_name, allowed_uids=[os.getuid() + 4242])
    ring.FrameReader.attach(shm_name, allowed_uids=[os.getuid()]).close()


def test_symlink_is_refused(shm_name, image, tmp_path):
    target = f"{SHM}/{shm_name}.target"
    write_segment(f"{shm_name}.target", image)
    os.symlink(target, f"{SHM}/{shm_name}")
    with pytest.raises(ring.InsecureSegment, match="symbolic link"):
        ring.FrameReader.attach(shm_name)


def test_missing_segment(shm_name):
    with pytest.raises(ring.SegmentNotFound, match=shm_name):
        ring.FrameReader.attach(shm_name)


def test_out_of_bounds_latest_slot_is_skipped_not_followed(shm_name, image):
    b = bytearray(image)
    struct.pack_into("<Q", b, LATEST_OFFSET, (7 << 8) | 60)  # slot 60 of 3
    write_segment(shm_name, bytes(b))
    with ring.FrameReader.attach(shm_name) as r:
        with pytest.raises(ring.CorruptFrame, match="out-of-bounds"):
            r.acquire_latest()
        assert r.acquire_latest() is None  # the bad frame is skipped, not retried forever


def test_payload_length_beyond_capacity_is_refused(shm_name, image):
    b = bytearray(image)
    latest = struct.unpack_from("<Q", b, LATEST_OFFSET)[0]
    slot_off = 4096 + (latest & 0xFF) * struct.unpack_from("<Q", b, 32)[0]
    struct.pack_into("<Q", b, slot_off + 32, 1 << 40)  # payload_len
    write_segment(shm_name, bytes(b))
    with ring.FrameReader.attach(shm_name) as r:
        with pytest.raises(ring.CorruptFrame):
            r.acquire_latest()


u32 = st.one_of(st.integers(0, 16), st.integers(0, 2**32 - 1), st.sampled_from([3, 4, 64, 65, 4096, 2**31]))
u64 = st.one_of(st.integers(0, 2**16), st.integers(0, 2**64 - 1), st.sampled_from([64, 4096, 9216, 2**63]))


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_fuzzed_headers_never_crash_the_reader(data, image):
    """10,000 headers with fields, `latest`, slot words and file length mutated:
    attach either refuses with a RingError or yields frames whose every byte
    lies inside the file (a wrong bound would SIGBUS/SIGSEGV this process)."""
    name = "edgeinfer.test-fuzz"
    b = bytearray(image)
    for field in data.draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        fmt = FIELDS[field][1]
        struct.pack_into(fmt, b, FIELDS[field][0], data.draw(u64 if fmt == "<Q" else u32))
    if data.draw(st.booleans()):
        struct.pack_into("<Q", b, LATEST_OFFSET, data.draw(u64))
    if data.draw(st.booleans()):
        for slot in range(3):
            off = 4096 + slot * 4160 if len(b) >= 4096 + 3 * 4160 else None
            if off is not None:
                struct.pack_into("<QQQQQ", b, off, *(data.draw(u64) for _ in range(5)))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(b))))
    write_segment(name, bytes(b[:cut] if cut is not None else b))
    try:
        r = ring.FrameReader.attach(name)
    except ring.RingError:
        return
    finally:
        os.unlink(f"{SHM}/{name}")
    try:
        for _ in range(2):
            try:
                f = r.acquire_latest()
            except ring.CorruptFrame:
                continue
            if f is not None:
                with f:
                    int(f.array.sum())  # touch every byte of the view
                    assert f.payload_len <= r.layout["payload_capacity"]
    finally:
        r.close()


# ------------------------------------------------------------------ a segment shrunk under the consumer
# Named shared memory cannot be sealed, so a producer can ftruncate its ring while we have it mapped; a read of
# a lost page is then a SIGBUS. These run in a child process: a failing guard must not take pytest with it.

_SHRINK_CHILD = r"""
import json, os, sys
from edgeinfer import ring
name, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from ring_helpers import publish_into_slot
r = ring.FrameReader.attach(name)
os.truncate(path, size)
if size:  # the header page is still there: publish a newer frame into a slot whose pages are gone
    publish_into_slot(path, 1)
out = {"acquired": None, "refresh": None}
try:
    if r.wait(0.05):
        out["acquired"] = repr(r.acquire_latest())
except ring.CorruptFrame:
    out["acquired"] = "CorruptFrame"
except ring.TruncatedSegment as e:  # wait() looked at the name and found the ring ruined
    out["refresh"] = str(e)
if out["refresh"] is None:
    try:
        r.refresh()
    except ring.TruncatedSegment as e:
        out["refresh"] = str(e)
out["truncations"], out["absorbed"] = r.truncations, ring.sigbus_absorbed()
out["attached_after"] = r._native is not None
print(json.dumps(out))
"""


@pytest.mark.parametrize("size", [0, 4096], ids=["to-zero", "to-header-page"])
def test_segment_shrunk_under_the_consumer_is_absorbed_and_detached(shm_name, image, size):
    write_segment(shm_name, image)
    r = subprocess.run([sys.executable, "-c", _SHRINK_CHILD, shm_name, f"{SHM}/{shm_name}", str(size),
                        os.path.dirname(os.path.abspath(__file__))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the consumer died ({r.returncode}): {r.stderr[-2000:]}"
    out = json.loads(r.stdout)
    assert out["truncations"] == 1 and out["absorbed"] >= 1  # the fault happened, was absorbed and noticed
    assert out["acquired"] in (None, "None", "CorruptFrame")  # nothing read from the lost pages is handed out
    assert "shrank the segment while it was mapped" in out["refresh"] and not out["attached_after"]


_OTHER_SIGBUS_CHILD = r"""
import mmap, os, sys
from edgeinfer import ring
r = ring.FrameReader.attach(sys.argv[1])  # installs the guard
if sys.argv[3] == "fault":  # a SIGBUS in memory the guard does not own: must kill as before
    with open(sys.argv[2], "w+b") as f:
        f.truncate(8192)
        m = mmap.mmap(f.fileno(), 8192)
        f.truncate(0)
        m[4096]
else:  # a SIGBUS sent, not a fault
    os.kill(os.getpid(), 7)
print("survived")
"""


@pytest.mark.parametrize("how", ["fault", "kill"])
def test_a_sigbus_the_guard_does_not_own_still_kills(shm_name, image, tmp_path, how):
    write_segment(shm_name, image)
    r = subprocess.run([sys.executable, "-c", _OTHER_SIGBUS_CHILD, shm_name, str(tmp_path / "other"), how],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGBUS and "survived" not in r.stdout, (r.returncode, r.stderr[-1000:])
