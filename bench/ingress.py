#!/usr/bin/env python3
"""One-way frame hand-off latency: producer publishes → consumer holds the frame.

Producer and consumer are separate processes pinned to different CPUs. The
producer fills a frame, takes CLOCK_MONOTONIC, hands the frame over and waits
for an acknowledgement, then sleeps a random 0.5-1.5 ms so that every sample
starts with an idle consumer (blocking modes measure a real wake-up). The
consumer takes CLOCK_MONOTONIC once it holds the frame (a view for the rings,
all bytes received for the copying transports).

Everything is measured side by side in one run, for 640x480x3 and 1920x1080x3:
  edgeinfer blocking  FrameReader.next_frame() on a sealed memfd ring (ABI 2): futex wait + take
  edgeinfer spin      the same, spinning instead of sleeping
  ABI 1 blocking/spin the same on 0.1's named /dev/shm segments, measured by this script run as a child on
                      the 0.1 package built from its commit (bench/abi1.py): today's figures beside ABI 2's
  results wake        a result record from the writer to a reader sleeping on its read-only mapping
                      (ABI 2: the writer wakes on every record while readers are connected), and
                      ABI 1's (readers counted themselves as waiters in the ring)
  eventfd bare        8-byte timestamp in shared memory + eventfd wake, nothing else
  eventfd floor       the same after writing the frame into shared memory, as the
                      camera does into our ring: the like-for-like floor of the targets
  unix socket         the frame sent over a SOCK_STREAM socketpair
  pyzmq ipc://        PUSH/PULL, send copy=False
  mp.Queue            multiprocessing.Queue (pickle + pipe)
  iceoryx2 (polled)   iceoryx2's Python binding, loaned sample, subscriber polled
                      (where it installs; measured with `pip install iceoryx2`)

Then the writer's cost per result record, with the wake-up on and off (ABI 2) and ABI 1's (no reader).

Usage: bench/ingress.py [--quick] [--samples N] [--no-abi1]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abi1 as abi1_mod  # noqa: E402
from edgeinfer import ring  # noqa: E402  (in the --abi1-child run: 0.1's, see bench/abi1.py)

SIZES = {"640x480x3": (480, 640), "1920x1080x3": (1080, 1920)}
PRODUCER_CPU, CONSUMER_CPU = 0, 1
now_ns = time.monotonic_ns


# ------------------------------------------------------------------ transports
# Each transport: setup() in the parent (before fork) → state; producer(state, frame)
# returns send(ts_ns, frame); consumer(state) returns recv() -> ts_ns.


def frame_sender(w):
    """send() for our FrameWriter (either ABI): the camera writes its frame into the slot, then the clock
    starts, then it publishes."""
    def send(frame):
        w.begin()[...] = frame
        ts = now_ns()
        w.publish(capture_ns=ts)
    return send


def frame_receiver(r, spin: bool):
    """recv() for our FrameReader (either ABI): blocks for the next frame; its arrival and capture times."""
    spin_s = 0.01 if spin else 0.0

    def recv():
        while True:
            f = r.next_frame(1.0, spin_s)
            if f is not None:
                t = now_ns()
                ts = f.capture_ns
                f.release()
                return t, ts
    return recv


def result_sender(w):
    """send() for a ResultWriter (either ABI): one record stamped now."""
    def send(frame):
        w.write(capture_ns=now_ns())
    return send


def result_receiver(r):
    """recv() for a ResultReader (either ABI): blocks for the next record; its arrival and capture times."""
    def recv():
        while (rec := r.read(1.0)) is None:
            pass
        return now_ns(), rec.capture_ns
    return recv


class Ours:
    """ABI 2: the ring is a sealed memfd, created before the fork; the consumer maps the inherited fd (the
    daemon gets it over the ingress socket: a one-off cost per camera, measured in bench/e2e.py)."""

    def __init__(self, spin: bool):
        self.spin = spin

    def setup(self, shape):
        self.w = ring.FrameWriter.create(shape[1], shape[0])

    def producer(self, frame):
        return frame_sender(self.w)

    def consumer(self):
        r = ring.FrameReader(self.w.fd, "bench")
        return frame_receiver(r, self.spin)


class OursAbi1:
    """ABI 1 (0.1): a named /dev/shm segment. Only in the child run on the 0.1 package (bench/abi1.py)."""

    def __init__(self, spin: bool):
        self.spin = spin
        self.name = f"edgeinfer.bench-{uuid.uuid4().hex[:8]}"

    def setup(self, shape):
        self.shape = shape

    def producer(self, frame):
        self.w = ring.FrameWriter.create(self.name, self.shape[1], self.shape[0])
        return frame_sender(self.w)

    def wait_ready(self):
        deadline = time.monotonic() + 10
        while not os.path.exists(f"/dev/shm/{self.name}") and time.monotonic() < deadline:
            time.sleep(0.005)

    def consumer(self):
        r = ring.FrameReader.watch(self.name)
        return frame_receiver(r, self.spin)

    def close(self):
        if hasattr(self, "w"):
            self.w.close()


class ResultWake:
    """A result record from the writer to a reader asleep on the ring (the frame is not part of it).
    ABI 2: the reader maps the ring read-only and cannot count itself; the writer wakes on every record."""

    def setup(self, shape):
        self.w = ring.ResultWriter.create(64, records=64)
        self.w.set_wake(True)  # what the daemon does while a reader is connected

    def producer(self, frame):
        return result_sender(self.w)

    def consumer(self):
        return result_receiver(ring.ResultReader.from_fd(self.w.fd))


class ResultWakeAbi1:
    """The same on ABI 1: a named result segment whose readers counted themselves as waiters."""

    def setup(self, shape):
        self.name = f"edgeinfer.bench-{uuid.uuid4().hex[:8]}.results"
        self.w = ring.ResultWriter.create(self.name, 64, records=64)

    def producer(self, frame):
        return result_sender(self.w)

    def consumer(self):
        return result_receiver(ring.ResultReader.attach(self.name))

    def close(self):
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


ABI1_TRANSPORTS = {  # measured in the child run on the 0.1 package
    "ABI 1 blocking (0.1)": lambda: OursAbi1(spin=False),
    "ABI 1 spin (0.1)": lambda: OursAbi1(spin=True),
    "ABI 1 results wake (0.1)": ResultWakeAbi1,
}

TRANSPORTS = {
    "edgeinfer blocking": lambda: Ours(spin=False),
    "edgeinfer spin": lambda: Ours(spin=True),
    "results wake": ResultWake,
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
    t = {**TRANSPORTS, **ABI1_TRANSPORTS}[name]()
    try:
        t.setup(shape)
    except ImportError as e:
        return None, f"not installed ({e.name})"
    n = samples + warmup
    ack_r, ack_w = os.pipe()
    ready_r, ready_w = os.pipe()
    parent, child = mp.Pipe(duplex=False)
    # The producer first: an ABI 1 ring's consumer attaches to what the producer created.
    prod = mp.Process(target=_producer_main, args=(t, shape, n, ack_r, ready_r), daemon=True)
    prod.start()
    if hasattr(t, "wait_ready"):
        t.wait_ready()
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


def writer_cost_ns(writer, records: int = 200_000) -> float:
    """ns per result record written in a tight loop (no reader asleep: a wake-up finds nobody)."""
    t = time.perf_counter_ns()
    for _ in range(records):
        writer.write(capture_ns=1)
    return (time.perf_counter_ns() - t) / records


def abi1_child(samples: int) -> int:
    """Run on the 0.1 package (bench/abi1.py): the ABI 1 cells, as JSON."""
    out = {"results": {}}
    for size, shape in SIZES.items():
        out["results"][size] = {name: (stats(lat) if lat is not None else {"skipped": why})
                                for name in ABI1_TRANSPORTS for lat, why in [measure(name, shape, samples)]}
    w = ring.ResultWriter.create(f"edgeinfer.bench-{uuid.uuid4().hex[:8]}.results", 64, records=64)
    out["writer_ns"] = writer_cost_ns(w)
    w.close()
    print(json.dumps(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 samples per cell (under a minute)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--no-abi1", action="store_true", help="skip the ABI 1 cells (no 0.1 build)")
    ap.add_argument("--abi1-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    samples = args.samples or (300 if args.quick else 3000)
    if args.abi1_child:
        return abi1_child(samples)
    if len(os.sched_getaffinity(0)) < 2:
        print("note: fewer than 2 CPUs available; producer and consumer share one", file=sys.stderr)

    abi1 = None if args.no_abi1 else abi1_mod.run_child(os.path.abspath(__file__), "--samples", str(samples))
    summary = {"samples": samples, "machine": f"{os.cpu_count()} CPUs, {os.uname().release}", "results": {}}
    for size, shape in SIZES.items():
        print(f"\n{size} ({shape[0] * shape[1] * 3:,} B), {samples} samples, "
              f"producer CPU {PRODUCER_CPU}, consumer CPU {CONSUMER_CPU}")
        print(f"{'transport':<26}{'p50 µs':>10}{'p99 µs':>10}{'p99.9 µs':>10}{'p50 ÷ ours':>12}")
        rows = {}
        for name in TRANSPORTS:
            lat, why = measure(name, shape, samples)
            rows[name] = stats(lat) if lat is not None else {"skipped": why}
        rows.update((abi1 or {}).get("results", {}).get(size, {}))
        ours = rows["edgeinfer blocking"]["p50"]
        for name, s in rows.items():
            if "skipped" in s:
                print(f"{name:<26}{s['skipped']:>42}")
                continue
            s["ratio_to_ours_p50"] = s["p50"] / ours
            print(f"{name:<26}{s['p50']:>10.1f}{s['p99']:>10.1f}{s['p99.9']:>10.1f}{s['ratio_to_ours_p50']:>11.2f}×")
        floor = rows["eventfd floor"]["p50"]
        spin = rows["edgeinfer spin"]["p50"]
        targets = {"blocking_p50_over_eventfd": ours / floor, "blocking_target_met": ours <= 1.2 * floor,
                   "spin_p50_us": spin, "spin_target_met": spin <= 3.0}
        line = (f"targets: blocking p50 = {targets['blocking_p50_over_eventfd']:.2f}× eventfd floor (≤ 1.2×: "
                f"{'met' if targets['blocking_target_met'] else 'NOT met'}); spin p50 = {spin:.1f} µs (≤ 3 µs: "
                f"{'met' if targets['spin_target_met'] else 'NOT met'})")
        old = rows.get("ABI 1 blocking (0.1)", {}).get("p50")
        if old:
            targets.update(abi2_over_abi1_blocking_p50=ours / old, abi2_vs_abi1_met=ours <= 1.1 * old)
            line += (f"; ABI 2 blocking p50 = {ours / old:.2f}× ABI 1's (≤ 1.1×: "
                     f"{'met' if targets['abi2_vs_abi1_met'] else 'NOT met'})")
        print(line)
        summary["results"][size] = {"transports": rows, "targets": targets}

    on = ring.ResultWriter.create(64, records=64)
    on.set_wake(True)
    off = ring.ResultWriter.create(64, records=64)
    cost = {"abi2_wake_on_ns": writer_cost_ns(on), "abi2_wake_off_ns": writer_cost_ns(off),
            "abi1_no_reader_ns": (abi1 or {}).get("writer_ns")}
    print(f"\nwriter cost per result record (200,000 in a tight loop, nobody asleep): ABI 2 waking "
          f"{cost['abi2_wake_on_ns']:.0f} ns, ABI 2 no reader connected {cost['abi2_wake_off_ns']:.0f} ns"
          + (f", ABI 1 {cost['abi1_no_reader_ns']:.0f} ns" if cost["abi1_no_reader_ns"] else ""))
    summary["result_writer_ns"] = cost
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
