"""The lane protocol: typed messages on the SOCK_SEQPACKET socketpair between the control plane and a lane.

A message is one datagram of JSON, `[type, field, ...]`, with fds alongside (SCM_RIGHTS); each type below is a
NamedTuple and is decoded back into one, every field checked against its annotation. Never pickle from a lane:
a lane parses camera bytes and runs as an unprivileged, sandboxed user (support/sandbox.py), so what it says is checked
like any client's input; a compromised lane must not be able to run code in the control plane. The control
plane's bulky objects (a model's sessions, fused graphs) go the other way only, in sealed memfds
(`to_memfd`/`from_memfd`).

Control plane → lane:
  Stage(name, on_cpu) + [memfd: SessionSet + fused graphs]   build the sessions (on the SessionSet's provider, or
                                                     the CPU one, on_cpu saying why), warm → Staged(name, version,
                                                     error, serving, fallback)
  Commit(name) / Discard(name)                       serve the staged model / drop it
  StartTrial(name, mode, sample, canary)             the staged model is a rollout's candidate (lanes/trial.py):
                                                     shadow, or canary on the stream indices `canary`
  Promote(name) / Abort(name)                        the candidate serves every stream / is dropped
  Attach(index, epoch, geometry) + [ring, memfd: fused graph]   serve a ring → Attached(index, epoch, error)
  Detach(index, epoch)                               stop serving that producer's ring
  Stall(seconds)                                     fault injection (runtime.fault_injection only)
  Stop()
Lane → control plane: the replies above, Ready(pid), Log(level, message), Dropped(index, epoch, why),
  TrialReport(name, version, ...)                    a trial's cumulative figures, about once a second
  ProviderFallback(name, serving, fallback, restart)  a model moved to the CPU provider after it was staged
                                                     (restart: its provider's run would not end; the lane exits)
  CandidateHung(name, why)                           a canary stream's run on the rollout's candidate would not end
                                                     when cancelled; the lane exits (restarted without the candidate)
  Short(stream, seq, received, expected, geometry)   a frame counted short (said by the control plane,
                                                     rate-limited per stream across its lanes)
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import pickle
import select
import socket
import time
import types
import typing
from typing import NamedTuple

MAX_MESSAGE = 64 * 1024  # one datagram (a bundle travels in a memfd)
MAX_FDS = 8
F_SEAL_FUTURE_WRITE = 0x10  # linux/fcntl.h (Linux >= 5.1); Python's fcntl module lacks it
LOG_LEVELS = ("debug", "info", "warning", "error")


class ProtocolError(ValueError):
    """A datagram that is not a message of the protocol (from a lane: it is not trusted further)."""


# ------------------------------------------------------------------ control plane → lane

class Stage(NamedTuple):
    name: str
    on_cpu: str = ""  # why the model's provider is not to be tried: its run would not end in a lane before


class Commit(NamedTuple):
    name: str


class Discard(NamedTuple):
    name: str


class StartTrial(NamedTuple):
    name: str
    mode: str          # "shadow" or "canary"
    sample: float      # share of frames compared
    canary: tuple      # canary: the stream indices the candidate serves


class Promote(NamedTuple):
    name: str


class Abort(NamedTuple):
    name: str


class Attach(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index(): read as .index only
    epoch: int
    geometry: tuple


class Detach(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index(): read as .index only
    epoch: int


class Stall(NamedTuple):
    seconds: float


class Stop(NamedTuple):
    pass


# ------------------------------------------------------------------ lane → control plane

class Ready(NamedTuple):
    pid: int
    gc_frozen: int = 0  # objects in its collector's permanent generation (the zygote's heap: never walked)


class Log(NamedTuple):
    level: str
    message: str


class Staged(NamedTuple):
    name: str
    version: str | None
    error: str | None
    serving: str = "cpu"         # the provider its sessions run on (models/providers.py's label)
    fallback: str | None = None  # why that is the CPU provider and not the configured one


class ProviderFallback(NamedTuple):
    """The serving version of model `name` moved to the CPU provider after it was staged (`fallback` says why): a
    geometry attached later was one its provider could not compile or warm up, or its provider failed a run.
    restart: a provider's run would not end; the lane exits after this, to be restarted with `name` on the CPU."""
    name: str
    serving: str
    fallback: str
    restart: bool = False


class CandidateHung(NamedTuple):
    """A run of model `name`'s rollout candidate (a canary stream's, on the loop) did not end when cancelled; the
    lane exits after this. The control plane restarts it without the candidate, and the rollout rolls it back."""
    name: str
    why: str


class Attached(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index(): read as .index only
    epoch: int
    error: str | None


class Dropped(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index(): read as .index only
    epoch: int
    why: str


class TrialReport(NamedTuple):
    name: str
    version: str       # the candidate's
    frames: int        # frames compared
    agreed: int        # answers agreed (models/agreement.py)
    answers: int       # answers compared
    runs: int          # candidate runs
    errors: int        # of those, failed, cancelled or not decodable
    skipped: int       # samples not taken (the trial thread still busy)
    candidate_us: tuple  # run-time histograms (lanes/trial.py buckets), flat (bucket, count) pairs
    serving_us: tuple
    problem: str | None  # the trial thread's trouble, if any
    ratios: tuple = ()   # paired run-time ratios candidate ÷ serving (lanes/trial.py ratio buckets), flat pairs


class Short(NamedTuple):
    stream: str
    seq: int
    received: int
    expected: int
    geometry: tuple | None


TO_LANE = {c.__name__: c for c in (Stage, Commit, Discard, StartTrial, Promote, Abort, Attach, Detach, Stall, Stop)}
FROM_LANE = {c.__name__: c for c in (Ready, Log, Staged, Attached, Dropped, Short, TrialReport, ProviderFallback,
                                            CandidateHung)}
_FIELDS = {name: tuple(typing.get_type_hints(c).items()) for name, c in {**TO_LANE, **FROM_LANE}.items()}


def encode(msg: NamedTuple) -> bytes:
    return json.dumps([type(msg).__name__, *msg], separators=(",", ":")).encode()


def _field(value, kind, where: str):
    options = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    for t in options:
        if t is type(None) and value is None:
            return None
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is bool and isinstance(value, bool):
            return value
        if t is str and isinstance(value, str):
            return value
        if t is tuple and isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                          for v in value):
            return tuple(value)
    raise ProtocolError(f"{where}: {type(value).__name__} where {kind} belongs")


def decode(data: bytes, kinds: dict) -> NamedTuple:
    """One message of `kinds` (TO_LANE or FROM_LANE), every field checked; ProtocolError otherwise."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str) or raw[0] not in kinds:
        raise ProtocolError(f"not a message: {str(raw)[:80]}")
    fields = _FIELDS[raw[0]]
    if len(raw) - 1 != len(fields):
        raise ProtocolError(f"{raw[0]}: {len(raw) - 1} fields, {len(fields)} expected")
    return kinds[raw[0]](*(_field(v, t, f"{raw[0]}.{n}") for v, (n, t) in zip(raw[1:], fields)))


def send(sock: socket.socket, msg: NamedTuple, fds=(), wait_s: float = 0.0) -> bool:
    """One message; False if the peer is gone, or cannot take it within wait_s (0: now; log lines may be
    dropped, a command or a reply waits for room)."""
    data = [encode(msg)]
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.send_fds(sock, data, list(fds), socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [sock], [], left)[1]:
                return False
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False


def receive(sock: socket.socket, kinds: dict) -> tuple[NamedTuple | None, list[int]]:
    """One message of `kinds` and its fds; (None, []) when the peer hung up. A datagram that is not a message
    (or was cut short) raises ProtocolError, its fds closed."""
    data, fds, flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError(f"a message over {MAX_MESSAGE} bytes or {MAX_FDS} fds")
        return decode(data, kinds), fds
    except ProtocolError:
        for fd in fds:
            os.close(fd)
        raise


def to_memfd(obj, label: str) -> int:
    """`obj` pickled into a sealed memfd: the control plane's own objects (a model's SessionSet and fused
    graphs, too large for a message), for a lane. Never the other way."""
    data = memoryview(pickle.dumps(obj))
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])
    # FUTURE_WRITE, not WRITE: F_SEAL_WRITE first waits for the pages' extra references to go, and pages just
    # written can still sit in another CPU's LRU batch: under load it failed with EBUSY and the daemon did
    # not start (seen once in a fresh-clone `make test`). FUTURE_WRITE forbids the same (write(), writable
    # mappings) from now on, and nothing else holds this memfd.
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL)
    return fd


def from_memfd(fd: int):
    """What `to_memfd` wrote (in a lane: from its own control plane)."""
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        return pickle.loads(m)
