"""Events from rules: pure logic, no I/O (the bridge feeds it decoded records and publishes what it returns).

A rule (settings.Rule) matches an item of a decoded result when its label is in `labels` (any label when
unset; a label the bundle does not name is matched by its class id as text), its score is at or above
`threshold`, and, for a detection, its box (frame pixels) has at least `min_area` and its centre lies inside
`region` ([x1, y1, x2, y2], frame pixels, edges included). A frame matches when one of its items does; the
best-scoring matching item is the frame's match.

An episode, per stream and rule:
- it starts after `min_frames` consecutive matching frames: `new`, once. Its start is the first frame of that
  run (start_frame_id, start_ns: the camera's wall clock at capture);
- `update` when the peak score rose by at least UPDATE_MIN_RISE since the last message, at most once every
  UPDATE_MIN_INTERVAL_NS of capture time;
- it ends after `end_after_frames` frames without a match, or once a frame captured `end_after_ms` or more after
  the last match does not match: `end`, once. Its end is the last matching frame (end_frame_id, end_ns), and
  `frames` counts the matching frames of the episode. A stream that goes silent (no record at all) is ended by
  `expire(now)` for `end_after_ms` rules once the wall clock is SILENCE_GRACE_NS past their bound
  (`ended_by: "silence"`); an `end_after_frames` rule waits for frames.
- A record whose status is not OK is neither a match nor a miss: skipped.

Every message of an episode carries the same id: `<stream>-<rule>-<start frame id>-<start capture ns>` (unique
while frame ids or capture times move forward; a restarted camera starts its frame ids again but not its
clock). `model` is the model (name, version, digest) of the record that produced the message.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from edgeinfer.bridges.messages import iso
from edgeinfer.bridges.mqttconfig import Rule

UPDATE_MIN_RISE = 0.05
UPDATE_MIN_INTERVAL_NS = 1_000_000_000
SILENCE_GRACE_NS = 1_000_000_000
NEW, UPDATE, END = "new", "update", "end"


@dataclass(frozen=True)
class Item:
    label: str | None
    score: float
    class_id: int = -1
    box: tuple[float, float, float, float] | None = None   # detections: x1, y1, x2, y2 in frame pixels


@dataclass(frozen=True)
class Observation:
    """What the engine needs of one record."""
    frame_id: int
    capture_ns: int               # the camera's CLOCK_REALTIME at capture
    model: dict                   # {"name", "version", "digest"}
    items: tuple[Item, ...] = ()
    ok: bool = True


def observation(decoded: dict, frame_id: int, capture_ns: int, model: dict, ok: bool = True) -> Observation:
    """From messages.result_message's decoded part ({"classes": ...} or {"detections": ...})."""
    items = [Item(c["label"], c["score"], c["class_id"]) for c in decoded.get("classes", ())]
    items += [Item(d["label"], d["score"], d["class_id"], tuple(d["box_px"])) for d in decoded.get("detections", ())]
    return Observation(frame_id, capture_ns, model, tuple(items), ok)


def best_match(rule: Rule, items) -> Item | None:
    best = None
    for it in items:
        if it.score < rule.threshold:
            continue
        if rule.labels is not None and (it.label if it.label is not None else str(it.class_id)) not in rule.labels:
            continue
        if it.box is not None:
            x1, y1, x2, y2 = it.box
            if max(0.0, x2 - x1) * max(0.0, y2 - y1) < rule.min_area:
                continue
            if rule.region is not None:
                cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
                rx1, ry1, rx2, ry2 = rule.region
                if not (rx1 <= cx <= rx2 and ry1 <= cy <= ry2):
                    continue
        elif rule.min_area > 0 or rule.region is not None:
            continue  # a box condition on an item without a box: no match
        if best is None or it.score > best.score:
            best = it
    return best


@dataclass
class _Episode:
    id: str
    start: Observation
    label: str | None
    peak: float
    last_match: Observation
    frames: int
    sent_peak: float
    sent_ns: int
    misses: int = 0


@dataclass
class RuleState:
    name: str
    rule: Rule
    run: int = 0                           # consecutive matching frames while idle
    run_start: Observation | None = None
    run_best: tuple[float, str | None] = (0.0, None)
    episode: _Episode | None = None
    last: dict | None = None               # the last message (for the retained state)
    fired: dict = field(default_factory=dict)  # type -> count (tests, metrics)


class StreamRules:
    """The rules of one stream. feed() and expire() return the event messages to publish, in order."""

    def __init__(self, stream: str, node: str, rules: dict[str, Rule]):
        self.stream, self.node = stream, node
        self.rules = [RuleState(n, r) for n, r in rules.items()]

    def feed(self, obs: Observation) -> list[dict]:
        if not obs.ok:
            return []
        out = []
        for st in self.rules:
            m = best_match(st.rule, obs.items)
            ev = self._active(st, obs, m) if st.episode is not None else self._idle(st, obs, m)
            if ev is not None:
                out.append(ev)
        return out

    def _idle(self, st: RuleState, obs: Observation, m: Item | None) -> dict | None:
        if m is None:
            st.run, st.run_start = 0, None
            return None
        if st.run == 0:
            st.run_start, st.run_best = obs, (m.score, m.label)
        elif m.score > st.run_best[0]:
            st.run_best = (m.score, m.label)
        st.run += 1
        if st.run < st.rule.min_frames:
            return None
        start = st.run_start
        peak, label = st.run_best
        st.episode = _Episode(f"{self.stream}-{st.name}-{start.frame_id}-{start.capture_ns}", start, label, peak,
                              obs, st.run, peak, obs.capture_ns)
        st.run, st.run_start = 0, None
        return self._message(st, NEW, obs)

    def _active(self, st: RuleState, obs: Observation, m: Item | None) -> dict | None:
        ep, rule = st.episode, st.rule
        if m is not None:
            ep.last_match, ep.misses = obs, 0
            ep.frames += 1
            if m.score > ep.peak:
                ep.peak, ep.label = m.score, m.label
            if ep.peak >= ep.sent_peak + UPDATE_MIN_RISE and obs.capture_ns - ep.sent_ns >= UPDATE_MIN_INTERVAL_NS:
                ep.sent_peak, ep.sent_ns = ep.peak, obs.capture_ns
                return self._message(st, UPDATE, obs)
            return None
        ep.misses += 1
        if rule.end_after_frames is not None and ep.misses >= rule.end_after_frames:
            return self._end(st, obs, "frames")
        if rule.end_after_ms is not None and obs.capture_ns - ep.last_match.capture_ns >= rule.end_after_ms * 1e6:
            return self._end(st, obs, "time")
        return None

    def expire(self, now_ns: int) -> list[dict]:
        """Ends the episodes of end_after_ms rules whose stream fell silent (wall clock past bound + grace)."""
        out = []
        for st in self.rules:
            ep = st.episode
            if ep is None or st.rule.end_after_ms is None:
                continue
            if now_ns - ep.last_match.capture_ns >= st.rule.end_after_ms * 1e6 + SILENCE_GRACE_NS:
                out.append(self._end(st, ep.last_match, "silence"))
        return out

    def _end(self, st: RuleState, obs: Observation, why: str) -> dict:
        msg = self._message(st, END, obs, ended_by=why)
        st.episode = None
        st.run, st.run_start = 0, None
        return msg

    def _message(self, st: RuleState, kind: str, obs: Observation, ended_by: str | None = None) -> dict:
        ep = st.episode
        end = ep.last_match if kind == END else None
        msg = {"id": ep.id, "type": kind, "stream": self.stream, "node": self.node, "rule": st.name,
               "label": ep.label, "peak_score": round(float(ep.peak), 6),
               "start_frame_id": ep.start.frame_id, "start_ns": ep.start.capture_ns,
               "start_time": iso(ep.start.capture_ns),
               "end_frame_id": end.frame_id if end else None, "end_ns": end.capture_ns if end else None,
               "end_time": iso(end.capture_ns) if end else None, "frames": ep.frames, "ended_by": ended_by,
               "frame_id": obs.frame_id, "capture_ns": obs.capture_ns, "capture_time": iso(obs.capture_ns),
               "model": dict(obs.model)}
        st.last = msg
        st.fired[kind] = st.fired.get(kind, 0) + 1
        return msg

    def state(self) -> dict:
        """The retained state of the stream: per rule, active or not, and its last event (a copy)."""
        return {"stream": self.stream, "node": self.node,
                "rules": {st.name: {"active": st.episode is not None,
                                    "event": copy.deepcopy(st.last) if st.last is not None else None}
                          for st in self.rules}}
