"""Drift: how far each model's decoded outputs have moved from a reference, per stream (control plane).

Nothing here runs on a lane. A chore of the serve loop (`Drift.tick`, every `drift.interval_s`) reads each
stream's result ring through a read-only mapping of its memfd, as any reader would (`ResultReader.from_fd` on the
control plane's own fd of the ring, `Stream.writer.fd`), so the lanes neither know nor wait. A ring holds
`shm.result_records` records (64 by default): a stream that publishes more than that per interval is sampled
(its newest records are read, the overwritten ones counted as missed), which leaves the distributions unbiased.

What is measured, the bins, the reference and the PSI are models/psi.py's (docs/operations/metrics-and-alerts.md, "Drift").

References are per stream: real cameras see different scenes, so a stream's figure is taken against that
stream's own reference of the (model, version), the first `drift.reference_frames` frames the version serves on
that stream (recorded in `<state_dir>/drift/<model>@<version>@<stream>.json`). The pooled figure
(`stream="*"`: the windows of every stream on that version) is taken against the pooled reference: the bundle's
own `drift_reference.json` if it carries one (a signed file, like every file of a bundle), else the one this host
recorded (`<state_dir>/drift/<model>@<version>.json`), else the first `drift.reference_frames` frames the version
serves over all its streams. Delete a file to take a new reference (the daemon keeps the one in memory until it
restarts). A rollout's candidate that is rolled back has its references discarded (memory and files: its frames
were of a version that no longer serves); one promoted after a canary keeps its streams' own references but its
pooled one, taken over the canary's streams only, is discarded and taken again over all of them.

The figure is the population stability index of each feature against the reference; a stream's figure is the
largest of its features'. The window is the last `drift.window_s` seconds of the stream's frames. A
figure is published once its window holds `drift.min_window_frames` frames. Drift only alerts: it never
changes what serves.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import re
import time

import numpy as np

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import KIND_DETECTION, RESULT_OK
from edgeinfer.models.psi import BUNDLE_FILE, FEATURES, STATE_SUBDIR, Reference, frame_features
from edgeinfer.support.statefile import read_json, write_json
from edgeinfer.telemetry.snapshot import DriftFigure, DriftReferenceView, DriftView

log = logging.getLogger("edgeinferd")

MAX_READS = 4096                        # records read from one ring per tick, at most
SAVE_RETRY_S = 30.0


class _Builder:
    """The first frames of a version without a reference, over all its streams."""

    def __init__(self, kind: int):
        self.kind, self.frames = kind, 0
        self.classes, self.scores, self.boxes = [], [], []

    def add(self, classes, scores, boxes) -> None:
        self.frames += 1
        self.classes.extend(classes.tolist())
        self.scores.extend(scores.tolist())
        if boxes is not None:
            self.boxes.append(boxes)


class _Tick:
    """The frames of one version read from a ring in one tick."""

    def __init__(self, ref: Reference):
        self.ref, self.frames = ref, 0
        self.classes, self.scores, self.boxes = [], [], []

    def add(self, classes, scores, boxes) -> None:
        self.frames += 1
        self.classes.append(classes)
        self.scores.append(scores)
        if boxes is not None:
            self.boxes.append(boxes)

    def counts(self) -> dict[str, np.ndarray]:
        return self.ref.bin(np.concatenate(self.classes), np.concatenate(self.scores),
                            np.asarray(self.boxes) if self.ref.kind == KIND_DETECTION else None)


class _Window:
    """A stream's last window_s seconds of frames of one (model, version), as counts per tick."""

    def __init__(self, version: str):
        self.version = version
        self.ticks: collections.deque = collections.deque()  # (time, frames, counts)
        self.frames = 0
        self.counts: dict[str, np.ndarray] | None = None

    def add(self, now: float, frames: int, counts: dict[str, np.ndarray]) -> None:
        self.ticks.append((now, frames, counts))
        self.frames += frames
        self.counts = {f: c.copy() for f, c in counts.items()} if self.counts is None else \
            {f: self.counts[f] + c for f, c in counts.items()}

    def expire(self, before: float) -> None:
        while self.ticks and self.ticks[0][0] <= before:
            _, frames, counts = self.ticks.popleft()
            self.frames -= frames
            self.counts = {f: self.counts[f] - c for f, c in counts.items()}


class _StreamDrift:
    def __init__(self, stream):
        self.stream = stream
        # The ring's records from the start on (a record overwritten before it is read is counted as missed).
        self.reader = ring.ResultReader.from_fd(stream.writer.fd, f"{stream.name} drift", from_oldest=True)
        self.window: _Window | None = None   # binned on the stream's own reference
        self.pooled: _Window | None = None   # the same frames binned on the pooled reference (for "*")
        self.read = 0
        self.bad = 0


def state_path(state_dir: str, model: str, version: str, stream: str | None = None) -> str:
    """Where this host keeps the reference of (model, version), pooled, or of one stream: one file each, to
    delete for a new one."""
    safe = lambda t: re.sub(r"[^A-Za-z0-9._+-]", "_", t)  # noqa: E731
    return os.path.join(state_dir, STATE_SUBDIR, f"{model}@{safe(version)}"
                        + (f"@{safe(stream)}" if stream is not None else "") + ".json")


class Drift:
    """The drift chore: reads the result rings, keeps references and windows, publishes `view` (one immutable
    DriftView, replaced whole each tick: the metrics thread reads it without a lock)."""

    def __init__(self, cfg, streams, models):
        """cfg: the configuration (drift, model.state_dir); streams: the lanes' Streams (their result rings);
        models: the registry (a served version's bundle files: its own reference)."""
        self.cfg, self.dc, self.models = cfg, cfg.drift, models
        self.state_dir = cfg.model.state_dir
        self.streams = [_StreamDrift(s) for s in streams]
        self.references: dict[tuple[str, str], Reference] = {}
        self.builders: dict[tuple[str, str], _Builder] = {}
        self.names: dict[tuple[str, str], str] = {}     # the bundle's own name of (model, version)
        self.unsaved: dict[tuple[str, str], float] = {}  # (model, version) → when to try writing it again
        self.next_tick = 0.0
        self.cpu_s = 0.0                                 # this chore's CPU time (thread time), all ticks
        self.view = DriftView((), (), {})

    def run_due(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now >= self.next_tick:
            self.next_tick = now + self.dc.interval_s
            t0 = time.thread_time()
            self.tick(now)
            self.cpu_s += time.thread_time() - t0

    def tick(self, now: float) -> None:
        for sd in self.streams:
            self._read(sd, now)
        for key, when in list(self.unsaved.items()):
            if now >= when:
                self._save(key, self.references[key], now)
        self._publish(now)

    # ------------------------------------------------------------ reading

    def _read(self, sd: _StreamDrift, now: float) -> None:
        tick: dict[str, _Tick] = {}  # this tick's frames by version
        for _ in range(MAX_READS):
            rec = sd.reader.read(0.0)
            if rec is None:
                break
            sd.read += 1
            if rec.status != RESULT_OK or rec.kind not in FEATURES:
                continue
            try:
                classes, scores, boxes = frame_features(rec.kind, rec.payload, rec.item_count)
            except ValueError:
                sd.bad += 1
                continue
            key = (sd.stream.model, rec.model_version)
            self.names.setdefault(key, rec.model_name)
            for attr in ("window", "pooled"):
                w = getattr(sd, attr)
                if w is not None and w.version != rec.model_version:
                    setattr(sd, attr, None)  # another version serves the stream: the old one's window is moot
            for which, k in (("window", (*key, sd.stream.name)), ("pooled", key)):
                ref = self._reference(k, rec.kind)
                if ref is None:  # still building it: this frame is part of it
                    self._build(k, rec.kind, classes, scores, boxes)
                elif ref.kind == rec.kind:
                    tick.setdefault((which, rec.model_version), _Tick(ref)).add(classes, scores, boxes)
        for (which, version), t in tick.items():
            w = getattr(sd, which)
            if w is None or w.version != version:  # a new version starts from its own reference
                w = _Window(version)
                setattr(sd, which, w)
            w.add(now, t.frames, t.counts())
        for w in (sd.window, sd.pooled):
            if w is not None:
                w.expire(now - self.dc.window_s)

    # ------------------------------------------------------------ references

    def _reference(self, key: tuple[str, str], kind: int) -> Reference | None:
        ref = self.references.get(key)
        if ref is None and key not in self.builders:
            ref = self._load(key)
            if ref is not None:
                self.references[key] = ref
            else:
                self.builders[key] = _Builder(kind)
        return ref

    def _load(self, key: tuple) -> Reference | None:
        """Pooled (model, version): the bundle's own reference, else the one this host recorded; a stream's
        (model, version, stream): the one this host recorded. None: one is to be built."""
        model, version = key[:2]
        served = self.models.served.get(model)
        runtime = served.runtime if served is not None else None
        if len(key) == 2 and runtime is not None and runtime.version == version and BUNDLE_FILE in runtime.bundle.files:
            where = os.path.join(runtime.bundle.path, BUNDLE_FILE)
            try:
                ref = Reference.from_json(json.loads(runtime.bundle.files[BUNDLE_FILE]), "bundle")
                log.info("drift: model %s %s: the bundle's reference (%d frames)", model, version, ref.frames)
                return ref
            except ValueError as e:
                log.error("drift: %s: not a drift reference (%s); this host takes its own", where, e)
        path = state_path(self.state_dir, *key)
        try:
            data = read_json(path)
            if data is not None:
                ref = Reference.from_json(data, "state")
                log.info("drift: model %s %s: the reference recorded in %s (%d frames)", model, version, path,
                         ref.frames)
                return ref
        except (OSError, ValueError) as e:
            log.error("drift: %s: unreadable drift reference (%s); taking a new one, which replaces it", path, e)
        log.info("drift: model %s %s has no reference yet%s: its first %d frames become it", model, version,
                 f" on stream {key[2]}" if len(key) == 3 else " (pooled)", self.dc.reference_frames)
        return None

    def _build(self, key: tuple[str, str], kind: int, classes, scores, boxes) -> None:
        b = self.builders[key]
        if b.kind != kind:
            return
        b.add(classes, scores, boxes)
        if b.frames >= self.dc.reference_frames:
            ref = Reference.build(kind, b.frames, b.classes, b.scores, b.boxes, self.dc.score_bins)
            del self.builders[key]
            self.references[key] = ref
            log.info("drift: model %s %s: reference%s taken from its first %d frames", *key[:2],
                     f" of stream {key[2]}" if len(key) == 3 else " (pooled)", ref.frames)
            self._save(key, ref, time.monotonic())

    def _save(self, key: tuple[str, str], ref: Reference, now: float) -> None:
        path = state_path(self.state_dir, *key)
        try:
            write_json(path, ref.to_json(self.names.get(key[:2], ""), key[1]))
        except OSError as e:
            if key not in self.unsaved:
                log.error("drift: cannot write %s (%s): the reference is kept in memory until a restart; tried "
                          "again every %g s", path, e.strerror or e, SAVE_RETRY_S)
            self.unsaved[key] = now + SAVE_RETRY_S
            return
        if self.unsaved.pop(key, None) is not None:
            log.info("drift: %s written", path)

    def discard(self, model: str, version: str, pooled_only: bool = False) -> None:
        """Forgets the references of (model, version) and removes their files: every one (a rolled-back
        candidate's: taken on frames of a version that no longer serves) or the pooled one only (a candidate
        promoted after a canary: taken over the canary's streams only). Its windows go too."""
        keys = [(model, version)] + ([] if pooled_only else
                                     [(model, version, sd.stream.name) for sd in self.streams])
        for key in keys:
            self.references.pop(key, None)
            self.builders.pop(key, None)
            self.unsaved.pop(key, None)
            path = state_path(self.state_dir, *key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.error("drift: cannot remove %s (%s): delete it, or it is read again at the next start", path,
                          e.strerror or e)
        for sd in self.streams:
            if sd.stream.model != model:
                continue
            if sd.pooled is not None and sd.pooled.version == version:
                sd.pooled = None
            if not pooled_only and sd.window is not None and sd.window.version == version:
                sd.window = None
        log.info("drift: model %s %s: %s discarded", model, version,
                 "the pooled reference (taken over the canary's streams) is" if pooled_only else "its references are")

    # ------------------------------------------------------------ the view

    def _publish(self, now: float) -> None:
        figures = []
        pooled: dict[tuple[str, str], tuple[int, dict]] = {}
        for sd in self.streams:
            w = sd.window
            if w is not None:
                key = (sd.stream.model, w.version)
                figures.append(self._figure(key, sd.stream.name, self.references[(*key, sd.stream.name)],
                                            w.frames, w.counts))
            p = sd.pooled
            if p is not None:
                key = (sd.stream.model, p.version)
                frames, counts = pooled.get(key, (0, self.references[key].zeros()))
                pooled[key] = (frames + p.frames, {f: counts[f] + p.counts[f] for f in counts})
        for key, (frames, counts) in pooled.items():
            figures.append(self._figure(key, "*", self.references[key], frames, counts))
        # The pooled references (a stream's own shows as its figure's frames until it is taken).
        refs = [DriftReferenceView(k[0], k[1], r.frames, True, r.source) for k, r in self.references.items()
                if len(k) == 2]
        refs += [DriftReferenceView(k[0], k[1], b.frames, False, "building") for k, b in self.builders.items()
                 if len(k) == 2]
        self.view = DriftView(tuple(figures), tuple(refs),
                              {sd.stream.name: (sd.read, sd.reader.missed) for sd in self.streams},
                              self.cpu_s)

    def _figure(self, key, stream: str, ref: Reference, frames: int, counts) -> DriftFigure:
        if frames < self.dc.min_window_frames:
            return DriftFigure(*key, stream, frames, None, {})
        features = ref.psi(counts)
        return DriftFigure(*key, stream, frames, max(features.values()), features)

    def close(self) -> None:
        for sd in self.streams:
            sd.reader.close()
