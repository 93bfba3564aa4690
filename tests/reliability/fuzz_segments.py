"""Mutational fuzzer for what a producer controls, through the whole Python
reader stack: frame and result ring headers, slot and record metadata,
`latest`/`published`/`head`, the ring's length — before the consumer attaches
and while it is attached.

Since ABI 2 a ring is a memfd handed over by fd: every input is written into a
fresh memfd, sealed as the writers seal theirs (a frame ring against resizing,
a result ring also read-only for every later mapping), and handed to
ring.FrameReader(fd) or ring.ResultReader.from_fd(fd). (The fd checks
themselves — unsealed, write-sealed, not a memfd — are tested case by case in
tests/unit/test_ring_validation.py and over the daemon's socket in test_access.py.)

Run as a child process (a crash must not take pytest down with it):
    python fuzz_segments.py N SEED
prints one JSON line: inputs run, outcome counts by exception class. Any
exception that is not a RingError is an uncaught fault: counted and named.
A SIGSEGV/SIGBUS ends the process; the caller sees the signal.

Mutations are structure-aware (header fields set to boundary values, slot
words, payload lengths, truncation, extension) plus random byte flips. It is
not coverage-guided; it covers the Python stack around the C readers (fd
check, mapping, views, typed errors, take() outcomes). The C readers themselves
are fuzzed coverage-guided with libFuzzer and sanitizers: fuzz_ring.c,
test_native_fuzz.py.
"""
from __future__ import annotations

import collections
import fcntl
import json
import mmap
import os
import random
import struct
import sys

from edgeinfer.abi import ring

U32 = [0, 1, 2, 3, 4, 63, 64, 65, 255, 256, 4095, 4096, 4097, 65535, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1]
U64 = U32 + [2 ** 32, 2 ** 40, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]
# (offset, format) of every frame header field (ring.h: ei_frame_ring_header) and result header field.
FRAME_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<I"), (28, "<I"), (32, "<Q"), (40, "<Q"), (48, "<I"),
                (52, "<I"), (56, "<I"), (60, "<I"), (64, "<I"), (128, "<Q"), (136, "<I"), (140, "<I"), (148, "<I"),
                (152, "<Q"), (192, "<I")]
RESULT_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<I"), (28, "<I"), (32, "<Q"), (40, "<Q"), (128, "<Q"),
                 (136, "<I"), (140, "<I"), (148, "<I")]
LATEST, PUBLISHED, HEAD = 128, 152, 128
F_ADD_SEALS = 1033
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_FUTURE_WRITE = 1, 2, 4, 16
FRAME_SEALS = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW
RESULT_SEALS = FRAME_SEALS | F_SEAL_FUTURE_WRITE


def templates() -> tuple[bytes, bytes]:
    """A valid frame ring with published frames, and a valid result ring with records, from the real writers."""
    with ring.FrameWriter.create(16, 8, "bgr24", slots=4) as w:
        for i in range(6):
            w.begin_flat()[:] = i
            w.publish(frame_id=i)
        frame = os.pread(w.fd, os.fstat(w.fd).st_size, 0)
    with ring.ResultWriter.create(64, records=4) as rw:
        for i in range(6):
            rw.write(frame_seq=i, frame_id=i, capture_ns=i + 1, payload=b"x" * (i * 8), item_count=i)
        result = os.pread(rw.fd, os.fstat(rw.fd).st_size, 0)
    return frame, result


def mutate(rng: random.Random, b: bytearray, fields, unit_size: int) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0:  # a header field to a boundary value
            off, fmt = rng.choice(fields)
            if off + struct.calcsize(fmt) <= len(b):
                struct.pack_into(fmt, b, off, rng.choice(U64 if fmt == "<Q" else U32))
        elif kind == 1:  # a slot/record word or its metadata
            i = rng.randrange(6)
            off = 4096 + i * unit_size + 8 * rng.randrange(6)
            if off + 8 <= len(b):
                struct.pack_into("<Q", b, off, rng.choice(U64) if rng.random() < 0.7 else rng.getrandbits(64))
        elif kind == 2 and len(b) >= 160:  # latest / head: seq << 8 | slot (frames), a record number (results)
            struct.pack_into("<Q", b, 128, (rng.randrange(16) << 8) | rng.choice([0, 1, 3, 4, 5, 255]))
            if rng.random() < 0.5:  # and `published` (frames)
                struct.pack_into("<Q", b, PUBLISHED, rng.choice([0, rng.randrange(16), 2 ** 63, 2 ** 64 - 1]))
        elif kind == 3 and b:  # random bytes anywhere in the header page and first unit
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(min(len(b), 4096 + unit_size))] = rng.getrandbits(8)
        elif kind == 4:  # truncated
            del b[rng.randrange(len(b) + 1):]
        elif kind == 5:  # extended
            b.extend(bytes(rng.choice([1, 64, 4096])))
    return b


def sealed_memfd(b: bytes, seals: int, keep_mapping: bool):
    """(fd, mapping or None): a memfd holding `b`, sealed; the mapping (read-write, made before sealing,
    as a writer's is) stays writable even under F_SEAL_FUTURE_WRITE."""
    fd = os.memfd_create("fuzz-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    if b:
        os.write(fd, b)
    m = mmap.mmap(fd, len(b)) if keep_mapping and b else None
    fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd, m


def exercise_frames(rng: random.Random, b: bytes, unit: int, counts) -> None:
    live = rng.random() < 0.5 and len(b) >= 4096
    fd, m = sealed_memfd(b, FRAME_SEALS, live)
    try:
        try:
            r = ring.FrameReader(fd, "fuzz frames")
        except ring.RingError as e:
            counts["refused:" + type(e).__name__] += 1
            return
        with r:
            for step in range(3):
                if live and step:  # the producer rewrites `latest`, `published` and a slot word under the consumer
                    struct.pack_into("<Q", m, LATEST, (rng.randrange(16) << 8) | rng.randrange(6))
                    if rng.random() < 0.5:
                        struct.pack_into("<Q", m, PUBLISHED, rng.choice([rng.randrange(16), 2 ** 64 - 1]))
                    off = 4096 + rng.randrange(4) * unit + 8 * rng.randrange(5)
                    if off + 8 <= len(m):
                        struct.pack_into("<Q", m, off, rng.choice(U64))
                try:
                    f = r.take()
                except ring.RingError as e:
                    counts["frame:" + type(e).__name__] += 1
                    continue
                if f is None:
                    counts["frame:" + {0: "none", ring.TAKE_SHORT: "short", ring.TAKE_CORRUPT: "CorruptFrame"}
                           .get(r.status, f"status {r.status}")] += 1
                    continue
                with f:
                    int(f.array.sum())  # touch every byte the reader says is ours
                    int(f.flat[:f.payload_len].sum())
                    counts["frame:delivered"] += 1
    finally:
        if m is not None:
            m.close()
        os.close(fd)


def exercise_results(rng: random.Random, b: bytes, counts) -> None:
    live = rng.random() < 0.5 and len(b) >= 4096
    fd, m = sealed_memfd(b, RESULT_SEALS, live)
    declared = struct.unpack_from("<Q", b, 40)[0] if len(b) >= 48 else 0
    try:
        try:
            r = ring.ResultReader.from_fd(fd, "fuzz results", from_oldest=rng.random() < 0.5)
        except ring.RingError as e:
            counts["refused:" + type(e).__name__] += 1
            return
        with r:
            for step in range(3):
                if live and step:  # the writer moves `head` (to anything) between reads
                    struct.pack_into("<Q", m, HEAD, rng.choice(U64) if rng.random() < 0.5 else rng.randrange(16))
                try:
                    rec = r.read(0)
                except ring.RingError as e:
                    counts["record:" + type(e).__name__] += 1
                    continue
                counts["record:" + ("none" if rec is None else "read")] += 1
                if rec is not None:
                    assert len(rec.payload) <= max(64, declared), (len(rec.payload), declared)
    finally:
        if m is not None:
            m.close()
        os.close(fd)


def main(n: int, seed: int) -> None:
    rng = random.Random(seed)
    frame_t, result_t = templates()
    frame_unit = struct.unpack_from("<Q", frame_t, 32)[0]
    result_unit = struct.unpack_from("<Q", result_t, 32)[0]
    counts: collections.Counter = collections.Counter()
    uncaught: collections.Counter = collections.Counter()
    for i in range(n):
        frames = i % 3 != 2  # two frame rings for every result ring
        try:
            if frames:
                exercise_frames(rng, bytes(mutate(rng, bytearray(frame_t), FRAME_FIELDS, frame_unit)), frame_unit,
                                counts)
            else:
                exercise_results(rng, bytes(mutate(rng, bytearray(result_t), RESULT_FIELDS, result_unit)), counts)
        except Exception as e:  # anything but a RingError is a fault in our validation
            uncaught[f"{type(e).__name__}: {str(e)[:80]}"] += 1
    print(json.dumps({"inputs": n, "counts": dict(counts), "uncaught": dict(uncaught)}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
