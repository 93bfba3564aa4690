"""A verified bundle turned into runnable ONNX Runtime sessions.

One session per stream geometry (pixel format, height, width): each is the
model with that geometry's preprocessing fused in front (fusion.py, on the
control plane), built from those bytes in memory (in a lane), and warmed up
before use. At most
`max_sessions` are kept (least recently used first out), never evicting one a
stream is being served with: a camera that cycles frame sizes cannot grow the
daemon without bound.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import os
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort

from edgeinfer.models import providers
from edgeinfer.models.bundle import Bundle, BundleError
from edgeinfer.models.decoders import Decoder, DecoderError, make_decoder
from edgeinfer.models.fusion import FRAME_INPUT, check_sampling, fuse
from edgeinfer.models.outputprobe import dims_of, output_infos
from edgeinfer.models.providers import CPU_SPEC, ProviderSpec
from edgeinfer.abi.vocabulary import Geometry, channels, frame_shape
from edgeinfer.support.yamlconf import clip


@dataclasses.dataclass(frozen=True)
class ThreadPlan:
    """How ONNX Runtime's intra-op threads are sized and pinned.

    Pinned by inheritance, not by ORT's `session.intra_op_thread_affinities`: with that, each pool thread pins
    itself by its own tid, which a lane's seccomp filter refuses (a lane sets CPUs for pid 0 only, so that it
    can never re-pin another lane's loop: native/harden.h). A session is built (`building`) while the calling
    thread has the extra threads' CPUs, so the pool threads ORT starts then are born on them; the caller gets
    its own CPUs back afterwards. The extra threads share their CPUs (one each with ORT's option)."""

    threads: int = 1               # intra-op threads, the calling (loop) thread included
    extra_thread_cpus: tuple = ()  # CPU of each extra thread (0-based); empty: not pinned

    def session_options(self) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.threads > 1:
            # Idle pool threads must not spin: the loop's duty ceiling counts on idle CPUs being idle.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return so

    @contextlib.contextmanager
    def building(self):
        """Around an InferenceSession's creation: the pool threads it starts are born on the extra threads' CPUs
        (the calling thread's own, set for pid 0, are given back after)."""
        cpus = set(self.extra_thread_cpus[: self.threads - 1]) if self.threads > 1 else set()
        if not cpus:
            yield
            return
        own = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, own)

    def session(self, model, provider: ProviderSpec = CPU_SPEC) -> ort.InferenceSession:
        """An InferenceSession of `model` (bytes or path) on `provider` with these threads, its extra ones pinned
        (a provider's own threads too: born on them). ProviderError: the provider cannot take it (not here, or
        it left the graph to the CPU provider)."""
        so = self.session_options()
        kw = providers.session_options(provider, so, self.threads)
        with self.building():
            try:
                sess = ort.InferenceSession(model, sess_options=so, **kw)
            except Exception as e:
                if provider.is_cpu:
                    raise
                raise providers.ProviderError(f"{provider.label} could not compile the model: {e}") from None
        if not providers.serves_on(sess, provider):
            raise providers.ProviderError(f"{provider.label} took no part of the model (ONNX Runtime put it all on "
                                          f"the CPU provider: {sess.get_providers()})")
        return sess


class FusedSession:
    """The model with one geometry's preprocessing in front; input: the frame view."""

    def __init__(self, session: ort.InferenceSession, pixel_format: str, height: int, width: int, batch: int = 1,
                 model: str = "", provider: ProviderSpec = CPU_SPEC):
        self.session = session
        self.model, self.provider = model, provider  # whose session (the bundle's name), on which provider
        self.pixel_format, self.height, self.width = pixel_format, height, width
        self.output_names = [o.name for o in session.get_outputs()]
        self.frame_shape = frame_shape(pixel_format, height, width)  # a slot's view: YUV has its own
        # Micro-batching: the one tensor frames of this geometry are copied into (allocated here, not per frame).
        self.batch = np.empty((batch, *self.frame_shape), np.uint8) if batch > 1 else None
        # Its rows and its first k rows, as views made once: the loop indexes these, allocating nothing.
        self.rows = [self.batch[i] for i in range(batch)] if batch > 1 else []
        self.firsts = [self.batch[:k] for k in range(batch + 1)] if batch > 1 else []

    def run(self, frame: np.ndarray, run_options: ort.RunOptions | None = None) -> list[np.ndarray]:
        """frame: uint8 [1, H, W, C] (a view of the shared-memory slot; read in place), or [k, H, W, C]: the
        first k frames of `batch`.
        run_options.terminate = True (from another thread) cancels the run."""
        return self.session.run(self.output_names, {FRAME_INPUT: frame}, run_options)

    def warm_up(self, runs: int, deadline_s: float, where: str, decoder: Decoder | None = None) -> float:
        """Runs a synthetic frame `runs` times, and decodes its outputs once; returns the last run's seconds.
        A run that fails, or outlasts deadline_s (cancelled), or outputs the decoder's payload cannot hold,
        refuses the model."""
        frames = [np.full((1, *self.frame_shape), 127, np.uint8)]
        if self.batch is not None:  # the full batch too: its first run allocates as well
            frames.append(np.full_like(self.batch, 127))
        took = 0.0
        options = ort.RunOptions()
        timer = threading.Timer(deadline_s, setattr, (options, "terminate", True))
        timer.daemon = True
        timer.start()
        try:
            for _ in range(runs):
                for frame in frames:
                    t = time.perf_counter()
                    outputs = self.run(frame, options)
                    took = time.perf_counter() - t
                    if decoder is not None and frame is frames[0]:
                        decoder.decode(outputs, self.width, self.height)
        except DecoderError as e:
            raise BundleError(f"{where}: warm-up ({self.width}x{self.height} {self.pixel_format}): {e}") from None
        except Exception as e:
            if options.terminate:
                raise BundleError(f"{where}: warm-up inference ({self.width}x{self.height} {self.pixel_format}) did "
                                  f"not finish within {deadline_s:g} s and was cancelled: model refused") from None
            raise BundleError(f"{where}: warm-up inference ({self.width}x{self.height} {self.pixel_format}) "
                              f"failed: {e}") from None
        finally:
            timer.cancel()
        return took


class SessionCapReached(BundleError):
    """Every session slot holds a geometry some stream is being served with."""


class SessionSet:
    """A model as a lane runs it: its decoder, and warmed ORT sessions by stream geometry (LRU, capped, never
    evicting one in use), each built from a fused graph serialised elsewhere. Fusing and serialising a graph
    hold the GIL in C for tens of ms (57 ms for the detector here): done on the control plane, never in a
    lane's process, where the loop shares the lane's interpreter. Picklable without its sessions."""

    def __init__(self, name: str, version: str, sha256: str, decoder: Decoder, where: str,
                 threads: ThreadPlan = ThreadPlan(), warmup_runs: int = 3, warmup_deadline_s: float = 30.0,
                 max_sessions: int = 8, batch: int = 1, provider: ProviderSpec = CPU_SPEC):
        self.name, self.version, self.sha256 = name, version, sha256
        self.name_b, self.version_b = name.encode(), version.encode()  # as every result record carries them
        self.batch = batch  # frames of one geometry run together at most (models.NAME.batch)
        self.decoder = decoder
        self.where = where  # the bundle's model file, for messages
        self.threads = threads
        self.warmup_runs = warmup_runs
        self.warmup_deadline_s = warmup_deadline_s
        self.max_sessions = max_sessions
        self._sessions: collections.OrderedDict[tuple[str, int, int], FusedSession] = collections.OrderedDict()
        self.evictions = 0  # sessions dropped to stay within max_sessions
        self.provider = self.serving = provider  # the configured provider, and the one the sessions run on
        self.fallback: str | None = None  # why `serving` is the CPU provider and not `provider`
        self.fault = ""  # test only (runtime.fault_provider): how its provider's sessions fail once warmed
        # The fused graph of each geometry served on a provider other than the CPU one: what a run-time failure
        # rebuilds on the CPU provider from (on_cpu)
        self._fused: dict[tuple, bytes] = {}

    def use(self, provider: ProviderSpec, on_cpu: str = "") -> None:
        """The provider the next sessions are built on (models.NAME.provider), before the first; one this process
        cannot run (its package, its device, write+execute memory: providers.check), or one not to be tried
        (`on_cpu` says why), is left for the CPU provider at once, with `fallback` saying why, before any session is
        asked of it."""
        self.provider = self.serving = provider
        self.fallback = None
        why = (on_cpu if not provider.is_cpu else "") or providers.check(provider)
        if why:
            self.fallback = clip(why if why.startswith(f"{provider.label}: ") else f"{provider.label}: {why}", 2000)
            self.serving = CPU_SPEC

    def __getstate__(self):
        return {**self.__dict__, "_sessions": collections.OrderedDict(), "evictions": 0, "_fused": {}}

    def on_cpu(self, why: str) -> SessionSet:
        """A copy of this set serving on the CPU provider, its sessions rebuilt and warmed there for every geometry
        held (its provider failed a run: `why`); this set is left as it is (the loop may still be running it)."""
        twin = copy.copy(self)
        twin._sessions, twin._fused = collections.OrderedDict(), {}
        twin.serving, twin.fallback = CPU_SPEC, clip(" ".join(f"{self.provider.label}: {why}".split()), 2000)
        for key, s in self._sessions.items():  # a geometry its provider could not compile is on the CPU already
            if s.provider.is_cpu:
                twin._sessions[key] = s
            else:
                twin.add(key, self._fused[key])
        return twin

    @property
    def geometries(self) -> list[Geometry]:
        """(pixel format, height, width) of the sessions held, least recently used first."""
        return list(self._sessions)

    def holds(self, session: FusedSession) -> bool:
        return any(s is session for s in self._sessions.values())

    def get(self, key: tuple) -> FusedSession | None:
        s = self._sessions.get(key)
        if s is not None:
            self._sessions.move_to_end(key)
        return s

    def add(self, key: tuple, fused: bytes | None, pinned=()) -> FusedSession:
        """Builds and warms the session of geometry `key` from its fused graph (None: the session exists). To make
        room, the least recently used session whose geometry is not in `pinned` (in use) is dropped; if every one
        is, SessionCapReached."""
        s = self.get(key)
        if s is not None:
            return s
        if fused is None:
            raise BundleError(f"{self.where}: no session and no fused graph for {key[2]}x{key[1]} {key[0]}")
        if len(self._sessions) >= self.max_sessions:
            victim = next((k for k in self._sessions if k not in pinned), None)
            if victim is None:
                raise SessionCapReached(f"{self.where}: all {self.max_sessions} model sessions (runtime.max_sessions)"
                                        f" serve other frame geometries in use; cannot add {key[2]}x{key[1]} {key[0]}")
            del self._sessions[victim]
            self._fused.pop(victim, None)
            self.evictions += 1
        s = None
        if not self.serving.is_cpu:
            # A provider that cannot load, compile or warm up the model leaves it to the CPU provider, said by
            # `fallback` (the lane reports it: journal, STATUS=, /healthz, edgeinfer_model_provider_fallback)
            try:
                s = self._warmed(self.threads.session(fused, self.serving), key, self.serving)
                if self.fault:
                    s.session = InjectedFault(s.session, self.fault)
                self._fused[key] = fused
            except (providers.ProviderError, BundleError) as e:
                self.fallback = clip(" ".join(f"{self.serving.label}: {e}".split()), 2000)  # one journal line
                self.serving = CPU_SPEC
        if s is None:
            try:
                sess = self.threads.session(fused)
            except Exception as e:
                raise BundleError(f"{self.where}: ONNX Runtime refused the model: {e}") from None
            s = self._warmed(sess, key, CPU_SPEC)
        self._sessions[key] = s
        return s

    def _warmed(self, sess: ort.InferenceSession, key: tuple, provider: ProviderSpec) -> FusedSession:
        s = FusedSession(sess, *key, batch=self.batch, model=self.name, provider=provider)
        # Its own copy of the decoder: this runs on a lane's control thread, and the loop's payload is a view of
        # the shared decoder's buffer until it is written (a warm-up result must never reach a record).
        s.warm_up(self.warmup_runs, self.warmup_deadline_s, self.where, copy.deepcopy(self.decoder))
        return s


class InjectedFault:
    """Test only (runtime.fault_provider, with runtime.fault_injection): a provider's warmed session whose runs
    fail as a broken accelerator's do. raise: every run raises; hang: a run returns only when cancelled
    (RunOptions.terminate, as ONNX Runtime's own runs do); stuck: a run never returns (a driver that hangs);
    drift: it answers, wrongly (an operator the accelerator computes otherwise: its outputs reversed along their
    last axis)."""

    def __init__(self, session: ort.InferenceSession, kind: str):
        self.session, self.kind = session, kind

    def __getattr__(self, name):
        return getattr(self.session, name)

    def run(self, names, feeds, run_options=None):
        if self.kind == "drift":
            return [np.ascontiguousarray(o[..., ::-1]) for o in self.session.run(names, feeds, run_options)]
        if self.kind == "raise":
            raise RuntimeError("the execution provider failed the run (injected: runtime.fault_provider)")
        while self.kind == "stuck" or run_options is None or not run_options.terminate:
            time.sleep(0.001)
        raise RuntimeError("Exiting due to terminate flag being set to true (injected: runtime.fault_provider)")


class ModelRuntime:
    """A loaded bundle: metadata, decoder, the graph, and fused graphs by geometry (the control plane's side);
    session_for() builds runnable sessions in this process too (tools, tests, benches)."""

    def __init__(self, bundle: Bundle, threads: ThreadPlan = ThreadPlan(), warmup_runs: int = 3,
                 warmup_deadline_s: float = 30.0, max_sessions: int = 8, batch: int = 1,
                 provider: ProviderSpec = CPU_SPEC):
        self.bundle = bundle
        self.max_sessions = max_sessions
        self.batch = batch
        self.meta = bundle.meta
        try:
            self.graph = onnx.load_from_string(bundle.model_bytes)
        except Exception as e:
            raise BundleError(f"{bundle.path}/model.onnx: not a readable ONNX model: {e}") from None
        spec = self.meta.input
        inputs = {i.name: i for i in self.graph.graph.input}
        if spec.name not in inputs:
            raise BundleError(f"{bundle.path}/model.yaml: input.name {clip(repr(spec.name))} is not a graph input "
                              f"(inputs: {sorted(inputs)})")
        dims = dims_of(inputs[spec.name])
        ch = channels(spec.pixel_format)
        want = [None, ch, spec.height, spec.width] if spec.layout == "nchw" else [None, spec.height, spec.width, ch]
        if len(dims) != 4 or any(d is not None and w is not None and d != w for d, w in zip(dims, want)):
            raise BundleError(f"{bundle.path}/model.yaml: input {spec.width}x{spec.height}x{ch} {spec.layout} "
                              f"does not match the graph input '{spec.name}' {dims}")
        if batch > 1 and dims and dims[0] is not None:
            raise BundleError(f"{bundle.path}/model.onnx: the graph input '{spec.name}' has a fixed batch of "
                              f"{dims[0]}: this model cannot run {batch} frames at once (set its batch: 1)")
        check_sampling(self.graph, self.meta.preprocess, f"{bundle.path}/model.yaml")
        self.outputs = output_infos(self.graph, bundle.model_bytes, spec, self.meta.preprocess,
                                    f"{bundle.path}/model.onnx", warmup_deadline_s)
        try:
            self.decoder: Decoder = make_decoder(self.meta.decoder, list(self.meta.labels),
                                                 spec.width, spec.height, self.outputs, self.meta.preprocess.resize)
        except DecoderError as e:
            raise BundleError(f"{bundle.path}/model.yaml: decoder: {e}") from None
        self._fused: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()  # serialised, LRU
        # The provider its lanes' sessions are built on (models.NAME.provider, or a rollout's candidate provider):
        # named here, loaded by the lanes only (SessionSet.use there)
        self.provider = provider
        self.sessions = self.session_set(threads, warmup_runs, warmup_deadline_s)
        self.sessions.use(provider)  # session_for()'s, in this process (tools, tests, benches)
        self.signer = None  # who signed the bundle (set by the verified loader's caller)
        self.target = None  # the bundle directory the configured path resolved to

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def version(self) -> str:
        return self.meta.version

    def session_set(self, threads: ThreadPlan = ThreadPlan(), warmup_runs: int = 3,
                    warmup_deadline_s: float = 30.0) -> SessionSet:
        """An empty set of sessions of this model, for a lane (picklable)."""
        return SessionSet(self.name, self.version, self.bundle.sha256, self.decoder, f"{self.bundle.path}/model.onnx",
                          threads, warmup_runs, warmup_deadline_s, self.max_sessions, self.batch, self.provider)

    def fused_model(self, pixel_format: str, height: int, width: int) -> bytes:
        """The model with this geometry's preprocessing in front, serialised (kept for the last max_sessions
        geometries: a restarted lane or a reload asks again)."""
        key = Geometry(pixel_format, height, width)
        data = self._fused.get(key)
        if data is None:
            data = fuse(self.graph, pixel_format, height, width, self.meta.input, self.meta.preprocess,
                        batched=self.batch > 1).SerializeToString()
            self._fused[key] = data
            while len(self._fused) > self.max_sessions:
                self._fused.popitem(last=False)
        self._fused.move_to_end(key)
        return data

    @property
    def geometries(self) -> list[Geometry]:
        return self.sessions.geometries

    @property
    def evictions(self) -> int:
        return self.sessions.evictions

    def session_for(self, pixel_format: str, height: int, width: int, pinned=()) -> FusedSession:
        """The fused, warmed-up session for a stream geometry, built here on first use (see SessionSet.add)."""
        key = Geometry(pixel_format, height, width)
        return self.sessions.get(key) or self.sessions.add(key, self.fused_model(*key), pinned)
