#!/usr/bin/env python3
"""One-way frame hand-off latency: producer publishes → consumer holds the frame.

Producer and consumer are separate processes pinned to different CPUs. The
producer fills a frame, takes CLOCK_MONOTONIC, hands the frame over and waits
for an acknowledgement, then sleeps a random 0.5-1.5 ms so that every sample
starts with an idle consumer (blocking modes measure a real wake-up). The
consumer takes CLOCK_MONOTONIC once it holds the frame (a view for the rings,
all bytes received for the copying transports).

Everything is measured side by side in one run, for 640x480x3 and 1920x1080x3:
  edgeinfer blocking  FrameReader.next_frame(): futex wait + acquire_latest() in one native call
  edgeinfer spin      the same, spinning instead of sleeping
  eventfd bare        8-byte timestamp in shared memory + eventfd wake, nothing else
  eventfd floor       the same after writing the frame into shared memory, as the
                      camera does into our ring: the like-for-like floor of the targets
  unix socket         the frame sent over a SOCK_STREAM socketpair
  pyzmq ipc://        PUSH/PULL, send copy=False
  mp.Queue            multiprocessing.Queue (pickle + pipe)
  iceoryx2 (polled)   iceoryx2's Python binding, loaned sample, subscriber polled
                      (where it installs; measured with `pip install iceoryx2`)

Usage: bench/ingress.py [--quick] [--samples N] [--json]
Prints a table (p50/p99/p99.9 in µs and each ratio to edgeinfer blocking), the
targets, and as its last line a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import random
import socket
import struct
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon", ".."))
from edgeinfer import ring  # noqa: E402

SIZES = {"640x480x3": (480, 640), "1920x1080x3": (1080, 1920)}
PRODUCER_CPU, CONSUMER_CPU = 0, 1
now_ns = time.monotonic_ns


# ------------------------------------------------------------------ transports
# Each transport: setup() in the parent (before fork) → state; producer(state, frame)
# returns send(ts_ns, frame); consumer(state) returns recv() -> ts_ns.


class Ours:
    def __init__(self, spin: bool):
        self.spin = spin
        self.name = f"edgeinfer.bench-{uuid.uuid4().hex[:8]}"

    def setup(self, shape):
        self.shape = shape
        return None

    def producer(self, frame):
        self.w = ring.FrameWriter.create(self.name, self.shape[1], self.shape[0])

        def send(frame):
            self.w.begin()[...] = frame  # the camera writes its frame into the slot...
            ts = now_ns()                # ...then the clock starts
            self.w.publish(capture_ns=ts)
        return send

    def consumer(self):
        r = ring.FrameReader.watch(self.name)
        spin = 0.01 if self.spin else 0.0

        def recv():
            while True:
                f = r.next_frame(1.0, spin)
                if f is not None:
                    t = now_ns()
                    ts = f.capture_ns
                    f.release()
                    return t, ts
        return recv

    def close(self):
        if hasattr(self, "w"):
            self.w.close()


class EventfdFloor:
    """The floor of a blocking wake-up on this machine. With write_frame, the
    producer first writes its frame into shared memory, as a camera writing
    into our ring does, so the only difference to ours is the hand-off."""

    def __init__(self, write_frame: bool):
        self.write_frame = write_frame

    def setup(self, shape):
        self.mem = mmap.mmap(-1, 8)
        self.efd = os.eventfd(0)
        self.shm = mmap.mmap(-1, shape[0] * shape[1] * 3) if self.write_frame else None

    def producer(self, frame):
        dest = np.frombuffer(self.shm, np.uint8).reshape(frame.shape) if self.shm is not None else None

        def send(frame):
            if dest is not None:
                dest[...] = frame
            ts = now_ns()
            struct.pack_into("<Q", self.mem, 0, ts)
            os.eventfd_write(self.efd, 1)
        return send

    def consumer(self):
        def recv():
            os.eventfd_read(self.efd)
            t = now_ns()
            return t, struct.unpack_from("<Q", self.mem, 0)[0]
        return recv


class UnixSocket:
    def setup(self, shape):
        self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (self.a, self.b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.nbytes = shape[0] * shape[1] * 3

    def producer(self, frame):
        def send(frame):
            ts = now_ns()
            self.a.sendall(struct.pack("<Q", ts))
            self.a.sendall(memoryview(frame).cast("B"))
        return send

    def consumer(self):
        buf = bytearray(8 + self.nbytes)
        view = memoryview(buf)

        def recv():
            got = 0
            while got < len(buf):
                got += self.b.recv_into(view[got:])
            t = now_ns()
            return t, struct.unpack_from("<Q", buf, 0)[0]
        return recv


class Zmq:
    def setup(self, shape):
        import zmq  # noqa: F401  (fail early if missing)
        self.addr = f"ipc:///tmp/edgeinfer-bench-{uuid.uuid4().hex[:8]}"

    def producer(self, frame):
        import zmq
        self.ctx = zmq.Context()
        self.s = self.ctx.socket(zmq.PUSH)
        self.s.bind(self.addr)

        def send(frame):
            ts = now_ns()
            self.s.send_multipart([struct.pack("<Q", ts), frame], copy=False)
        return send

    def consumer(self):
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.PULL)
        s.connect(self.addr)

        def recv():
            parts = s.recv_multipart(copy=False)
            t = now_ns()
            return t, struct.unpack("<Q", parts[0].bytes)[0]
        return recv


class MpQueue:
    def setup(self, shape):
        self.q = mp.Queue(maxsize=2)

    def producer(self, frame):
        def send(frame):
            ts = now_ns()
            self.q.put((ts, frame))
        return send

    def consumer(self):
        def recv():
            ts, _frame = self.q.get()
            return now_ns(), ts
        return recv


class Iceoryx2:
    """iceoryx2's Python binding (publish-subscribe, loaned sample, polled subscriber)."""

    def setup(self, shape):
        import ctypes
        import iceoryx2  # noqa: F401  (raises ImportError where it does not install)
        n = shape[0] * shape[1] * 3

        class Payload(ctypes.Structure):
            _fields_ = [("ts", ctypes.c_uint64), ("data", ctypes.c_uint8 * n)]
        self.Payload = Payload
        self.n = n
        self.service = f"edgeinfer/bench/{uuid.uuid4().hex[:8]}"

    def _svc(self):
        import iceoryx2 as iox2
        iox2.set_log_level(iox2.LogLevel.Error) if hasattr(iox2, "set_log_level") else None
        node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
        svc = (node.service_builder(iox2.ServiceName.new(self.service)).publish_subscribe(self.Payload)
               .subscriber_max_buffer_size(1).history_size(0).open_or_create())
        return node, svc

    def producer(self, frame):
        import ctypes
        self.node, svc = self._svc()
        self.pub = svc.publisher_builder().create()

        def send(frame):
            s = self.pub.loan_uninit()
            p = ctypes.cast(s.payload_ptr, ctypes.POINTER(self.Payload)).contents
            ctypes.memmove(ctypes.addressof(p.data), frame.ctypes.data, self.n)
            ts = now_ns()
            p.ts = ts
            s.assume_init().send()
        return send

    def consumer(self):
        self.node, svc = self._svc()
        sub = svc.subscriber_builder().create()

        def recv():
            while True:
                s = sub.receive()
                if s is not None:
                    t = now_ns()
                    return t, s.payload().contents.ts
        return recv


TRANSPORTS = {
    "edgeinfer blocking": lambda: Ours(spin=False),
    "edgeinfer spin": lambda: Ours(spin=True),
    "eventfd bare": lambda: EventfdFloor(write_frame=False),
    "eventfd floor": lambda: EventfdFloor(write_frame=True),
    "unix socket": UnixSocket,
    "pyzmq ipc://": Zmq,
    "mp.Queue": MpQueue,
    "iceoryx2 (polled)": Iceoryx2,
}


# ------------------------------------------------------------------ harness


def _pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


def _producer_main(t, shape, n, ack_r, ready_r):
    _pin(PRODUCER_CPU)
    frame = np.full((shape[0], shape[1], 3), 128, np.uint8)
    send = t.producer(frame)
    os.read(ready_r, 1)  # the consumer is attached
    rnd = random.Random(7)
    try:
        for _ in range(n):
            send(frame)
            os.read(ack_r, 1)
            time.sleep(rnd.uniform(0.0005, 0.0015))
    finally:
        if hasattr(t, "close"):
            t.close()


def _consumer_main(t, n, warmup, ack_w, ready_w, out):
    _pin(CONSUMER_CPU)
    recv = t.consumer()
    os.write(ready_w, b"r")
    lat = np.empty(n, np.int64)
    for i in range(n):
        t_recv, ts = recv()
        lat[i] = t_recv - ts
        os.write(ack_w, b"a")
    out.send(lat[warmup:].tolist())


def measure(name: str, shape, samples: int, warmup: int = 50):
    t = TRANSPORTS[name]()
    try:
        t.setup(shape)
    except ImportError as e:
        return None, f"not installed ({e.name})"
    n = samples + warmup
    ack_r, ack_w = os.pipe()
    ready_r, ready_w = os.pipe()
    parent, child = mp.Pipe(duplex=False)
    # The producer first: the rings' consumer attaches to what the producer created.
    prod = mp.Process(target=_producer_main, args=(t, shape, n, ack_r, ready_r), daemon=True)
    prod.start()
    if isinstance(t, Ours):
        deadline = time.monotonic() + 10
        while not os.path.exists(f"/dev/shm/{t.name}") and time.monotonic() < deadline:
            time.sleep(0.005)
    cons = mp.Process(target=_consumer_main, args=(t, n, warmup, ack_w, ready_w, child), daemon=True)
    cons.start()
    result = None
    try:
        if parent.poll(timeout=300):
            result = np.array(parent.recv(), np.int64)
    finally:
        for p in (prod, cons):
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        for fd in (ack_r, ack_w, ready_r, ready_w):
            os.close(fd)
    if result is None:
        return None, "timed out"
    return result, None


def stats(lat_ns: np.ndarray) -> dict:
    us = lat_ns / 1000.0
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p99.9": float(np.percentile(us, 99.9)), "n": int(len(us))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 samples per cell (under 30 s)")
    ap.add_argument("--samples", type=int, default=None)
    args = ap.parse_args()
    samples = args.samples or (300 if args.quick else 3000)
    if len(os.sched_getaffinity(0)) < 2:
        print("note: fewer than 2 CPUs available; producer and consumer share one", file=sys.stderr)

    summary = {"samples": samples, "machine": f"{os.cpu_count()} CPUs, {os.uname().release}", "results": {}}
    for size, shape in SIZES.items():
        print(f"\n{size} ({shape[0] * shape[1] * 3:,} B), {samples} samples, "
              f"producer CPU {PRODUCER_CPU}, consumer CPU {CONSUMER_CPU}")
        print(f"{'transport':<20}{'p50 µs':>10}{'p99 µs':>10}{'p99.9 µs':>10}{'p50 ÷ ours':>12}")
        rows = {}
        for name in TRANSPORTS:
            lat, why = measure(name, shape, samples)
            rows[name] = stats(lat) if lat is not None else {"skipped": why}
        ours = rows["edgeinfer blocking"]["p50"]
        for name, s in rows.items():
            if "skipped" in s:
                print(f"{name:<20}{s['skipped']:>42}")
                continue
            s["ratio_to_ours_p50"] = s["p50"] / ours
            print(f"{name:<20}{s['p50']:>10.1f}{s['p99']:>10.1f}{s['p99.9']:>10.1f}{s['ratio_to_ours_p50']:>11.2f}×")
        floor = rows["eventfd floor"]["p50"]
        spin = rows["edgeinfer spin"]["p50"]
        targets = {"blocking_p50_over_eventfd": ours / floor, "blocking_target_met": ours <= 1.2 * floor,
                   "spin_p50_us": spin, "spin_target_met": spin <= 3.0}
        print(f"targets: blocking p50 = {targets['blocking_p50_over_eventfd']:.2f}× eventfd floor (≤ 1.2×: "
              f"{'met' if targets['blocking_target_met'] else 'NOT met'}); spin p50 = {spin:.1f} µs (≤ 3 µs: "
              f"{'met' if targets['spin_target_met'] else 'NOT met'})")
        summary["results"][size] = {"transports": rows, "targets": targets}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
