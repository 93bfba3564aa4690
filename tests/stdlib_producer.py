"""A camera producer in Python's standard library alone, written from docs/abi.md (no edgeinfer, no numpy):
what a vendor without a C compiler writes. Run with `python3 -I -S` to prove it needs nothing else.

    stdlib_producer.py SOCKET STREAM WIDTH HEIGHT

Makes an nv12 frame ring (a sealed memfd), hands it to edgeinferd over SOCKET as STREAM (SOCK_SEQPACKET,
hello + SCM_RIGHTS), keeps the connection, then reads commands from stdin, one a line:
    frame N      publish frame_id N, payload_len = width x height x 3/2 (docs/abi.md, "Frame length")
    short N      publish frame_id N with payload_len = width x height (the old, wrong table): counted `short`
    quit         set CLOSED (the daemon sees the end at once), then exit
and answers each with "PUBLISHED seq=S slot=I len=L". Prints "CONNECTED" or "REFUSED status why" first.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import socket
import struct
import sys
import time

# docs/abi.md: the frame ring's layout (ABI 2)
HEADER_SIZE, SLOT_HEADER_SIZE, ALIGN = 4096, 64, 64
NV12, BT601 = 6, 0
OFF_LATEST, OFF_DOORBELL, OFF_FLAGS, OFF_PID, OFF_GENERATION, OFF_PUBLISHED = 128, 136, 140, 144, 148, 152
OFF_CLAIMED, OFF_WAITERS = 192, 196
NO_SLOT, WRITING, READY, CLOSED = 0xFFFFFFFF, 1, 2, 1
# docs/abi.md: the numbers Python's fcntl module lacks, and the futex calls
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4
F_ADD_SEALS = 1033
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
FUTEX_WAKE, FUTEX_PRIVATE_FLAG, INT_MAX = 1, 128, 0x7FFFFFFF

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def futex_wake(address: int, private: bool = False) -> None:
    if libc.syscall(SYS_FUTEX, ctypes.c_void_p(address), FUTEX_WAKE | (FUTEX_PRIVATE_FLAG if private else 0),
                    INT_MAX, None, None, 0) < 0:
        raise OSError(ctypes.get_errno(), "futex(FUTEX_WAKE)")


_fence_word = ctypes.c_uint32(0)


def full_fence() -> None:
    """A full memory barrier between a store and a later load (the seq_cst steps): docs/abi.md, "Without C11
    atomics": Linux's FUTEX_WAKE runs smp_mb() before it looks for waiters; here on a word nobody waits on."""
    futex_wake(ctypes.addressof(_fence_word), private=True)


class Ring:
    def __init__(self, width: int, height: int, slots: int = 4):
        self.width, self.height, self.slots = width, height, slots
        self.frame_len = width * height * 3 // 2                    # nv12: height x 3/2 rows of width bytes
        self.capacity = (self.frame_len + ALIGN - 1) // ALIGN * ALIGN
        self.stride = (SLOT_HEADER_SIZE + self.capacity + ALIGN - 1) // ALIGN * ALIGN
        self.size = HEADER_SIZE + slots * self.stride
        self.fd = os.memfd_create("stdlib-producer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.posix_fallocate(self.fd, 0, self.size)                   # every page now: no SIGBUS later
        self.mem = mmap.mmap(self.fd, self.size)
        struct.pack_into("=8sIIQIIQQIIIIII", self.mem, 0, b"EIFRAME2", 2, HEADER_SIZE, self.size, slots,
                         SLOT_HEADER_SIZE, self.stride, self.capacity, width, height, 1, NV12, width, BT601)
        # Aligned single stores and loads of the shared words: one 8- or 4-byte copy per element in CPython.
        self.q = memoryview(self.mem).cast("Q")
        self.i = memoryview(self.mem).cast("I")
        self.i[OFF_CLAIMED // 4] = NO_SLOT                            # the producer initialises `claimed`
        self.i[OFF_PID // 4] = os.getpid()
        self.i[OFF_GENERATION // 4] = 1                              # our first ring
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        self.doorbell_address = ctypes.addressof(ctypes.c_uint32.from_buffer(self.mem, OFF_DOORBELL))
        self.seq, self.last_slot, self.cursor = 0, NO_SLOT, 0

    def publish(self, frame_id: int, payload_len: int) -> tuple[int, int]:
        # 1-2: a slot neither claimed nor our last; announce WRITING, fence, re-check the claim
        while True:
            claimed = self.i[OFF_CLAIMED // 4]
            s = self.cursor
            while s == claimed or s == self.last_slot:
                s = (s + 1) % self.slots
            word_at = (HEADER_SIZE + s * self.stride) // 8
            old = self.q[word_at]
            self.q[word_at] = (old & ~0xFF) | WRITING
            full_fence()
            if self.i[OFF_CLAIMED // 4] != s:
                break
            self.q[word_at] = old                                     # the daemon holds it: give it back
        self.cursor = (s + 1) % self.slots
        # 3: the payload (Y plane, then interleaved U,V), the slot's metadata, then READY, published, latest
        base = HEADER_SIZE + s * self.stride + SLOT_HEADER_SIZE
        y = self.width * self.height
        self.mem[base:base + y] = bytes([(frame_id * 7) & 0xFF]) * y
        self.mem[base + y:base + self.frame_len] = b"\x80" * (self.frame_len - y)
        self.seq += 1
        self.q[word_at + 1] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)   # capture_mono_ns
        self.q[word_at + 2] = time.clock_gettime_ns(time.CLOCK_REALTIME)    # capture_real_ns
        self.q[word_at + 3] = frame_id
        self.q[word_at + 4] = payload_len
        self.q[word_at] = self.seq << 8 | READY
        self.q[OFF_PUBLISHED // 8] = self.seq
        self.q[OFF_LATEST // 8] = self.seq << 8 | s
        self.last_slot = s
        # 4: ring the doorbell, fence, wake the daemon if it sleeps (left out, frames wait for its timeout)
        self.ring_doorbell()
        return self.seq, s

    def ring_doorbell(self) -> None:
        self.i[OFF_DOORBELL // 4] = (self.i[OFF_DOORBELL // 4] + 1) & 0xFFFFFFFF  # the producer's word alone
        full_fence()
        if self.i[OFF_WAITERS // 4]:
            futex_wake(self.doorbell_address)

    def close(self) -> None:
        self.i[OFF_FLAGS // 4] = self.i[OFF_FLAGS // 4] | CLOSED            # before exit: a clean end
        self.ring_doorbell()


def hand_over(path: str, stream: str, fd: int) -> tuple[socket.socket, int, str]:
    """docs/abi.md, Messages: hello (128 bytes) with the ring's fd; the reply (256 bytes): status, why."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    hello = struct.pack("=8sII64s48x", b"EIHELLO2", 2, 1, stream.encode())
    socket.send_fds(sock, [hello], [fd])
    sock.settimeout(30.0)                                             # ring.h's client waits 30 s
    reply = sock.recv(256)
    sock.settimeout(None)
    magic, _abi, status, msg = struct.unpack("=8sIi240s", reply)
    assert magic == b"EIREPLY2", magic
    return sock, status, msg.split(b"\0", 1)[0].decode()


def main() -> int:
    path, stream, width, height = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ring = Ring(width, height)
    sock, status, why = hand_over(path, stream, ring.fd)
    if status:
        print(f"REFUSED {status} {why}", flush=True)
        return 1
    print("CONNECTED", flush=True)
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        if verb == "quit":
            break
        length = ring.frame_len if verb == "frame" else width * height
        seq, slot = ring.publish(int(arg), length)
        print(f"PUBLISHED seq={seq} slot={slot} len={length}", flush=True)
    ring.close()
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
