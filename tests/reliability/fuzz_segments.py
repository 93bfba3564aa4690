"""Mutational fuzzer for what a producer controls: frame and result segment
headers, slot and record metadata, `latest`/`head`, the file length — before
the consumer attaches and while it is attached.

Run as a child process (a crash must not take pytest down with it):
    python fuzz_segments.py N SEED DIR
prints one JSON line: inputs run, outcome counts by exception class. Any
exception that is not a RingError is an uncaught fault: counted and named.
A SIGSEGV/SIGBUS ends the process; the caller sees the signal.

Mutations are structure-aware (header fields set to boundary values, slot
words, payload lengths, truncation, extension) plus random byte flips. It is
not coverage-guided; it covers the Python stack around the C readers (attach,
views, typed errors). The C readers themselves are fuzzed coverage-guided with
libFuzzer and sanitizers: fuzz_ring.c, test_native_fuzz.py.
"""
from __future__ import annotations

import collections
import json
import mmap
import os
import random
import struct
import sys

from edgeinfer import ring

U32 = [0, 1, 2, 3, 4, 63, 64, 65, 255, 256, 4095, 4096, 4097, 65535, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1]
U64 = U32 + [2 ** 32, 2 ** 40, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]
# (offset, format) of every frame header field (ring.h: ei_frame_ring_header) and result header field.
FRAME_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<I"), (28, "<I"), (32, "<Q"), (40, "<Q"), (48, "<I"),
                (52, "<I"), (56, "<I"), (60, "<I"), (64, "<I"), (128, "<Q"), (136, "<I"), (140, "<I"), (148, "<I"),
                (192, "<Q"), (200, "<I")]
RESULT_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<I"), (28, "<I"), (32, "<Q"), (40, "<Q"), (128, "<Q"),
                 (136, "<I"), (140, "<I"), (148, "<I"), (192, "<I")]


def templates(directory: str) -> tuple[bytes, bytes]:
    """A valid frame segment with published frames, and a valid result segment with records."""
    w = ring.FrameWriter.create("edgeinfer.fuzz-template", 16, 8, "bgr24", slots=4, shm_dir=directory)
    for i in range(6):
        w.begin_flat()[:] = i
        w.publish(frame_id=i)
    frame = open(os.path.join(directory, "edgeinfer.fuzz-template"), "rb").read()
    w.close()
    rw = ring.ResultWriter.create("edgeinfer.fuzz-results", 64, records=4, shm_dir=directory)
    for i in range(6):
        rw.write(frame_seq=i, frame_id=i, capture_ns=i + 1, payload=b"x" * (i * 8), item_count=i)
    result = open(os.path.join(directory, "edgeinfer.fuzz-results"), "rb").read()
    rw.close()
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
        elif kind == 2 and len(b) >= 136:  # latest / head: seq << 8 | slot
            struct.pack_into("<Q", b, 128, (rng.randrange(16) << 8) | rng.choice([0, 1, 3, 4, 5, 255]))
        elif kind == 3 and b:  # random bytes anywhere in the header page and first unit
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(min(len(b), 4096 + unit_size))] = rng.getrandbits(8)
        elif kind == 4:  # truncated
            del b[rng.randrange(len(b) + 1):]
        elif kind == 5:  # extended
            b.extend(bytes(rng.choice([1, 64, 4096])))
    return b


def exercise_frames(name: str, directory: str, rng: random.Random, b: bytes, counts) -> None:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b)
    live = rng.random() < 0.5 and len(b) >= 4096
    try:
        r = ring.FrameReader.attach(name, shm_dir=directory)
    except ring.RingError as e:
        counts["refused:" + type(e).__name__] += 1
        return
    try:
        if live:  # the producer changes slot metadata and `latest` after the consumer attached
            with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                struct.pack_into("<Q", m, 128, (rng.randrange(16) << 8) | rng.randrange(6))
                off = 4096 + rng.randrange(4) * 448 + 8 * rng.randrange(5)
                if off + 8 <= len(m):
                    struct.pack_into("<Q", m, off, rng.choice(U64))
        for _ in range(2):
            try:
                fr = r.acquire_latest()
            except ring.RingError as e:
                counts["frame:" + type(e).__name__] += 1
                continue
            if fr is None:
                counts["frame:none"] += 1
                continue
            with fr:
                int(fr.array.sum())  # touch every byte the reader says is ours
                counts["frame:delivered"] += 1
    finally:
        r.close()


def exercise_results(name: str, directory: str, rng: random.Random, b: bytes, counts) -> None:
    with open(os.path.join(directory, name), "wb") as f:
        f.write(b)
    try:
        r = ring.ResultReader.attach(name, shm_dir=directory, from_oldest=rng.random() < 0.5)
    except ring.RingError as e:
        counts["refused:" + type(e).__name__] += 1
        return
    try:
        for _ in range(3):
            try:
                rec = r.read(0)
            except ring.RingError as e:
                counts["record:" + type(e).__name__] += 1
                continue
            counts["record:" + ("none" if rec is None else "read")] += 1
            if rec is not None:
                assert len(rec.payload) <= 64
    finally:
        r.close()


def main(n: int, seed: int, directory: str) -> None:
    rng = random.Random(seed)
    frame_t, result_t = templates(directory)
    frame_unit = struct.unpack_from("<Q", frame_t, 32)[0]
    result_unit = struct.unpack_from("<Q", result_t, 32)[0]
    counts: collections.Counter = collections.Counter()
    uncaught: collections.Counter = collections.Counter()
    for i in range(n):
        frames = i % 3 != 2  # two frame segments for every result segment
        try:
            if frames:
                exercise_frames("edgeinfer.fuzz-f", directory, rng,
                                bytes(mutate(rng, bytearray(frame_t), FRAME_FIELDS, frame_unit)), counts)
            else:
                exercise_results("edgeinfer.fuzz-r", directory, rng,
                                 bytes(mutate(rng, bytearray(result_t), RESULT_FIELDS, result_unit)), counts)
        except Exception as e:  # anything but a RingError is a fault in our validation
            uncaught[f"{type(e).__name__}: {str(e)[:80]}"] += 1
    for name in ("edgeinfer.fuzz-f", "edgeinfer.fuzz-r"):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    print(json.dumps({"inputs": n, "counts": dict(counts), "uncaught": dict(uncaught)}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
