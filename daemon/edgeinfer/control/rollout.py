"""Rollouts: a new version of a model proves itself on the host before it serves (models.NAME.rollout).

With `policy: shadow` or `canary`, a verified new bundle (reload.py: signature, limits, the anti-rollback check;
the floor is not raised) is staged in every lane holding the model and becomes the model's *candidate*
(lanes/trial.py): in shadow it runs on a sample of the serving frames on idle lane time and is never published;
in canary it serves a share of the model's streams (whole streams). The lanes report what they measure about
once a second (TrialReport); this module keeps the rollout and decides, once the window holds enough (at least
`window.min_frames` frames compared and `window.min_seconds`), on the evidence's strength, not on a point figure:

- agreement with the serving version (models/agreement.py, the quantize gate's measure) against
  gates.min_agreement: its Wilson score interval at gates.confidence (models/agreement.wilson) decides: the lower
  bound ≥ the gate passes, the upper bound < the gate fails, an interval across the gate is undecided;
- run time: the median of the paired ratios candidate ÷ serving (both versions on the same frame, on the trial
  thread, back to back, alternating which goes first: lanes/trial.py) against gates.max_time_ratio, with its
  distribution-free interval at gates.confidence (lanes/trial.median_bounds): the upper bound ≤ the gate passes,
  the lower bound > the gate fails, else undecided;
- the candidate's failed, cancelled or undecodable runs ÷ its runs ≤ gates.max_error_rate.

A gate that fails rolls back at once; while one is undecided the window stays open (the lanes keep measuring),
up to window.max_seconds, where a candidate still undecided is rolled back (it never serves on weak evidence).

Every gate passes: **promote** (the lanes serve the candidate from their next frame; only now the anti-rollback
floor moves and the known-good record names it). One fails: **roll back** (the candidate is dropped, the
serving version never stopped, the floor is untouched, and the same bundle — the same files, signature aside
(Bundle.digest) — is not tried again until the configured bundle changes). The operator may decide early (`edgeinferctl model
rollout NAME promote|abort`: a request file in the state directory, read here within a second).

State (rollouts.json in model.state_dir, statefile.py): the candidate under way, and the bundles rolled back.
A restart never serves an unproven candidate: the start serves the last known-good version (registry.py) and
the rollout starts again from an empty window (said in the log); a bundle rolled back stays refused.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

from edgeinfer.lanes.trial import BUCKETS, RATIO_BUCKETS, median_bounds, quantile_us
from edgeinfer.models.agreement import DEFAULT_MIN_AGREEMENT, AgreementMeter, NotComparable, wilson
from edgeinfer.models import providers
from edgeinfer.models.bundle import BundleError
from edgeinfer.support.statefile import read_json, write_json
from edgeinfer.telemetry.snapshot import Figures, RolloutView

log = logging.getLogger("edgeinferd")

STATE_FILE = "rollouts.json"
REQUEST_FILE = "rollout-request-{model}.json"  # edgeinferctl model rollout NAME promote|abort writes it
EVALUATE_S = 1.0
REFUSED_KEEP = 32  # bundles remembered as rolled back, per model (the oldest forgotten first)


@dataclasses.dataclass
class Candidate:
    name: str                      # the model's name under `models:`
    policy: str
    model: object                  # its verified ModelRuntime
    serving: tuple                 # (name, version) of the serving version
    canary: tuple                  # stream names the candidate serves (canary)
    started: float                 # monotonic
    started_wall: float
    min_agreement: float


class Rollouts:
    def __init__(self, cfg, *, models, lanes, streams, trim):
        """models: the registry (registry.py); lanes: the Supervisor; streams: every Stream (canary picks among a
        model's); trim: scheduled after a candidate is dropped or promoted."""
        self.cfg, self.models, self.lanes, self.streams, self.trim = cfg, models, lanes, streams, trim
        # drift.discard (control/drift.py) when drift is on: a rolled-back candidate's references are dropped, a
        # canary-promoted one's pooled reference (taken over the canary's streams only) is taken again.
        self.discard_references = None
        self.path = os.path.join(cfg.model.state_dir, STATE_FILE)
        self.active: dict[str, Candidate] = {}
        self.decisions: dict[str, dict[tuple, int]] = {}
        self.last: dict[str, dict] = {}
        self.next_evaluation = 0.0
        state = read_state(self.path)
        self.refused: dict[str, list[dict]] = state["refused"]
        self.interrupted: dict[str, dict] = state["active"]  # under way when the last daemon stopped

    # ---------------------------------------------------------------- state

    def _write(self) -> None:
        data = {"active": {n: {"bundle": c.model.target, "digest": c.model.bundle.digest,
                               "sha256": c.model.bundle.sha256, "version": c.model.version,
                               "policy": c.policy, "serving": c.serving[1], "started": c.started_wall,
                               **providers.to_record(c.model.provider)}
                           for n, c in self.active.items()},
                "refused": self.refused}
        try:
            write_json(self.path, data)
        except OSError as e:  # serving goes on; what it means is said
            log.error("%s: cannot write the rollouts' record (%s): a restart would not know what was rolled back",
                      self.path, e.strerror or e)

    def rolled_back(self, name: str, model) -> dict | None:
        """The record of `model` (a ModelRuntime) if it was rolled back: the same files, signature aside, on the
        same provider (a record from before providers were rolled out names none: the CPU one)."""
        return next((r for r in self.refused.get(name, ()) if r.get("digest") == model.bundle.digest
                     and r.get("provider", "cpu") == model.provider.said), None)

    # ---------------------------------------------------------------- starting one

    def policy(self, name: str):
        return self.models.served[name].entry.rollout

    def under_way(self, name: str) -> Candidate | None:
        return self.active.get(name)

    def check(self, name: str, new, serving, geometries: list) -> None:
        """Refuses (BundleError) a candidate that cannot be rolled out, with the reason."""
        rollout = self.policy(name)
        before = self.rolled_back(name, new)
        if before is not None:
            raise BundleError(f"{new.bundle.path}: {new.name} {new.version} on {new.provider.said} was rolled back "
                              f"({before.get('why')}); it is not tried again until the bundle or its provider "
                              "changes")
        try:
            AgreementMeter(serving.decoder, new.decoder)
        except NotComparable as e:
            raise BundleError(f"{new.bundle.path}: rollout policy {rollout.policy} needs an agreement gate: {e}; "
                              "use rollout policy immediate for this model") from None
        cap = self.cfg.runtime.max_sessions
        if 2 * len(geometries) > cap:
            raise BundleError(f"{new.bundle.path}: a rollout holds two versions of the model in every lane, "
                              f"{2 * len(geometries)} sessions for its {len(geometries)} frame geometries, more than "
                              f"runtime.max_sessions ({cap}); raise it or use rollout policy immediate")
        if rollout.policy == "canary" and len(self._canary(name)) == 0:
            raise BundleError(f"{new.bundle.path}: a canary needs at least two streams of model {name} (one for "
                              "each version)")

    def _canary(self, name: str) -> tuple:
        """The streams the candidate serves: share × the model's streams, rounded, at least one, never all; the
        first ones by name (the same streams at every rollout, said in the log)."""
        mine = sorted((s for s in self.streams if s.model == name), key=lambda s: s.name)
        if len(mine) < 2:
            return ()
        k = min(len(mine) - 1, max(1, round(self.policy(name).share * len(mine))))
        return tuple(mine[:k])

    def begin(self, name: str, new, serving, geometries: list) -> None:
        """`new` (verified, staged in the lanes for `geometries`) becomes the candidate of `name` beside
        `serving`."""
        rollout = self.policy(name)
        canary = self._canary(name) if rollout.policy == "canary" else ()
        gate = rollout.gates.min_agreement
        self.active[name] = Candidate(name, rollout.policy, new, (serving.name, serving.version),
                                      tuple(s.name for s in canary), time.monotonic(), time.time(),
                                      gate if gate is not None else DEFAULT_MIN_AGREEMENT[new.decoder.kind])
        self._drop_request(name)  # a request left for an earlier candidate never applies to this one
        self.lanes.start_trial(name, new, geometries, rollout.policy, rollout.sample, tuple(s.index for s in canary))
        resumed = self.interrupted.pop(name, None)
        again = resumed is not None and resumed.get("digest") == new.bundle.digest
        self._write()
        w = rollout.window
        log.warning("model %s: rollout %s: candidate %s %s on %s beside the serving %s %s on %s%s; %s; decided after "
                    "%d frames and %g s", name, "started again (the daemon restarted mid-rollout; the window starts "
                    "empty)" if again else "started", new.name, new.version, new.provider.said, serving.name,
                    serving.version, serving.provider.said,
                    f" (sha256 {new.bundle.sha256[:16]}…)", f"shadow on {rollout.sample:.0%} of the frames"
                    if rollout.policy == "shadow" else f"canary on {', '.join(s.name for s in canary)}",
                    w.min_frames, w.min_seconds)

    # ---------------------------------------------------------------- measuring

    def figures(self, name: str) -> Figures | None:
        c = self.active.get(name)
        if c is None:
            return None
        reports = list(self.lanes.trials.reports.get(name, {}).values())
        cand, serv, ratios = [0] * BUCKETS, [0] * BUCKETS, [0] * RATIO_BUCKETS
        for r in reports:
            for hist, flat in ((cand, r.candidate_us), (serv, r.serving_us), (ratios, r.ratios)):
                for i in range(0, len(flat), 2):
                    hist[flat[i]] += flat[i + 1]
        answers, agreed = sum(r.answers for r in reports), sum(r.agreed for r in reports)
        confidence = self.policy(name).gates.confidence
        low, high = wilson(agreed, answers, confidence) if answers else (None, None)
        median = median_bounds(ratios, confidence) or (None, None, None)
        return Figures(frames=sum(r.frames for r in reports),
                       agreement=agreed / answers if answers else None,
                       runs=sum(r.runs for r in reports), errors=sum(r.errors for r in reports),
                       skipped=sum(r.skipped for r in reports), p99_candidate_us=quantile_us(cand, 0.99),
                       p99_serving_us=quantile_us(serv, 0.99), elapsed_s=time.monotonic() - c.started,
                       agreement_low=low, agreement_high=high, time_ratio=median[0], time_ratio_low=median[1],
                       time_ratio_high=median[2], pairs=sum(ratios), confidence=confidence)

    def verdict(self, name: str, f: Figures) -> tuple[str, str] | None:
        """("promote" | "rollback", why) once the window is full (or a lane could not run the trial); else None."""
        c, rollout = self.active[name], self.policy(name)
        problem = self._problem(name)
        if problem:
            return problem
        w, g = rollout.window, rollout.gates
        if f.frames < w.min_frames or f.elapsed_s < w.min_seconds or f.runs < w.min_frames:
            if f.elapsed_s > w.max_seconds:
                return "rollback", (f"the window did not fill in {w.max_seconds:g} s: {f.frames} of {w.min_frames} "
                                    f"frames compared, {f.skipped} samples skipped (lanes busy, or frame "
                                    "geometries the candidate was not staged for)")
            return None
        return judge(f, c.min_agreement, g.max_time_ratio, g.max_error_rate, w.max_seconds)

    def _problem(self, name: str) -> tuple[str, str] | None:
        """("rollback", why) if a lane could not take or run the candidate (lanes/trialbook.py)."""
        problem = self.lanes.trials.problems.get(name) or next(
            (r.problem for r in self.lanes.trials.reports.get(name, {}).values() if r.problem), None)
        return ("rollback", problem) if problem else None

    def evaluate(self, now: float) -> None:
        """Control plane chore: operators' requests, then every rollout's gates (about once a second)."""
        if not self.active or now < self.next_evaluation:
            return
        self.next_evaluation = now + EVALUATE_S
        for name in list(self.active):
            f = self.figures(name)
            # A lane's problem first: an operator's promote never serves a candidate a lane could not run
            decided = self._problem(name) or self._request(name) or self.verdict(name, f)
            if decided is not None:
                self.decide(name, *decided, figures=f)

    def _request_path(self, name: str) -> str:
        return os.path.join(self.cfg.model.state_dir, REQUEST_FILE.format(model=name))

    def _drop_request(self, name: str) -> None:
        try:
            os.unlink(self._request_path(name))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("model %s: cannot remove %s: %s", name, self._request_path(name), e.strerror or e)

    def _request(self, name: str) -> tuple[str, str] | None:
        """An operator's `edgeinferctl model rollout NAME promote|abort` for this candidate (its version named in
        the request), taken once; a request for another candidate is dropped with a line."""
        path = self._request_path(name)
        try:
            with open(path) as fh:
                req = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            req = {"error": str(e)}
        try:
            os.unlink(path)
        except OSError:
            pass
        c = self.active[name]
        action = req.get("action") if isinstance(req, dict) else None
        if action not in ("promote", "abort") or req.get("candidate") != c.model.version:
            log.error("model %s: rollout request %s ignored: %s", name, path,
                      req.get("error") if isinstance(req, dict) and "error" in req else
                      f"it names {str(req)[:120]}, the candidate is {c.model.version}")
            return None
        who = req.get("by") or "an operator"
        return ("promote" if action == "promote" else "rollback"), f"{action} requested by {who}"

    # ---------------------------------------------------------------- deciding

    def decide(self, name: str, decision: str, why: str, figures: Figures | None = None) -> None:
        f = figures if figures is not None else self.figures(name)
        c = self.active.pop(name)
        serving = c.serving
        if decision == "promote":
            self.lanes.end_trial(name, promote_to=c.model)
            served = self.models.served[name]
            self.models.accept(name, c.model)  # the anti-rollback floor and the known-good record move now
            served.reloads += 1
            log.warning("model %s: rollout PROMOTED %s %s on %s (was %s %s): %s; %s", name, c.model.name,
                        c.model.version, c.model.provider.said, *serving, why, f.said() if f else "no figures")
            if c.canary and self.discard_references is not None:
                self.discard_references(name, c.model.version, pooled_only=True)
        else:
            self.lanes.end_trial(name)
            self.refused.setdefault(name, []).append({
                "digest": c.model.bundle.digest, "sha256": c.model.bundle.sha256, "version": c.model.version,
                "provider": c.model.provider.said, "bundle": c.model.target, "why": why, "at": time.time()})
            self.refused[name] = self.refused[name][-REFUSED_KEEP:]
            log.error("model %s: rollout ROLLED BACK %s %s on %s, still serving %s %s: %s; %s; this bundle is not "
                      "tried again on this provider until one of them changes", name, c.model.name, c.model.version,
                      c.model.provider.said, *serving, why, f.said() if f else "no figures")
            if self.discard_references is not None and c.model.version != serving[1]:  # (a provider change's
                self.discard_references(name, c.model.version)  # candidate has the serving version's references)
        self._write()
        self._drop_request(name)
        self.trim.schedule()
        key = (serving[1], c.model.version, decision)
        counts = self.decisions.setdefault(name, {})
        counts[key] = counts.get(key, 0) + 1
        self.last[name] = {"decision": decision, "serving": serving[1], "candidate": c.model.version, "why": why,
                           "figures": dataclasses.asdict(f) if f else None, "at": time.time()}

    def abort(self, name: str, why: str) -> None:
        """Drops the candidate without refusing its bundle (it was superseded, or the configuration moved back)."""
        c = self.active.pop(name, None)
        if c is None:
            return
        self.lanes.end_trial(name)
        self._write()
        self._drop_request(name)
        self.trim.schedule()
        log.warning("model %s: rollout of %s %s stopped: %s; serving %s %s", name, c.model.name, c.model.version, why,
                    *c.serving)

    # ---------------------------------------------------------------- reporting

    def view(self, name: str) -> RolloutView:
        rollout = self.policy(name)
        c = self.active.get(name)
        m = self.models.served[name]
        g, w = rollout.gates, rollout.window
        kind = getattr(getattr(m.runtime, "decoder", None), "kind", None)
        gates = {"min_agreement": c.min_agreement if c else (g.min_agreement if g.min_agreement is not None
                                                            else DEFAULT_MIN_AGREEMENT.get(kind)),
                 "max_time_ratio": g.max_time_ratio, "max_error_rate": g.max_error_rate,
                 "confidence": g.confidence, "min_frames": w.min_frames, "min_seconds": w.min_seconds,
                 "max_seconds": w.max_seconds}
        return RolloutView(rollout.policy, m.version or "-", c.model.version if c else None, c.canary if c else (),
                           self.figures(name) if c else None, gates, dict(self.decisions.get(name, {})),
                           self.last.get(name))


def judge(f: Figures, min_agreement: float, max_time_ratio: float, max_error_rate: float,
          max_seconds: float) -> tuple[str, str] | None:
    """The gates over a full window (figures with their bounds): ("promote" | "rollback", why), or None while a
    gate is undecided and the window may still grow (until max_seconds: then undecided rolls back)."""
    failed, undecided = [], []
    conf = f"{f.confidence:.0%}" if f.confidence is not None else "the gates' confidence"
    if f.agreement is None:
        failed.append("agreement: nothing to compare (neither version answered)")
    elif f.agreement_high < min_agreement:
        failed.append(f"agreement {f.agreement:.4f} < {min_agreement} (upper bound {f.agreement_high:.4f} at {conf}, "
                      f"{f.frames} frames)")
    elif f.agreement_low < min_agreement:
        undecided.append(f"agreement {f.agreement:.4f}: its bounds {f.agreement_low:.4f}–{f.agreement_high:.4f} at "
                         f"{conf} straddle {min_agreement}")
    if f.time_ratio is None:
        failed.append("run time: no pair of runs measured")
    elif f.time_ratio_low > max_time_ratio:
        failed.append(f"run time {f.time_ratio:.2f}x the serving version's (median of {f.pairs} paired ratios, lower "
                      f"bound {f.time_ratio_low:.2f} at {conf}) > {max_time_ratio}x")
    elif f.time_ratio_high > max_time_ratio:
        undecided.append(f"run time {f.time_ratio:.2f}x: its bounds {f.time_ratio_low:.2f}–{f.time_ratio_high:.2f} "
                         f"at {conf} straddle {max_time_ratio}x")
    if f.error_rate is not None and f.error_rate > max_error_rate:
        failed.append(f"error rate {f.error_rate:.4f} > {max_error_rate}")
    if failed:
        return "rollback", "; ".join(failed)
    if undecided:
        if f.elapsed_s > max_seconds:
            return "rollback", (f"still undecided after {max_seconds:g} s (window.max_seconds): "
                                + "; ".join(undecided))
        return None
    return "promote", (f"every gate passed: agreement {f.agreement:.4f} (lower bound {f.agreement_low:.4f} at {conf}) "
                       f">= {min_agreement}, run time {f.time_ratio:.2f}x (median of {f.pairs} paired ratios, upper "
                       f"bound {f.time_ratio_high:.2f}) <= {max_time_ratio}x, error rate {f.error_rate or 0:.4f} <= "
                       f"{max_error_rate}")


def read_state(path: str) -> dict:
    """rollouts.json: {"active": {model: {...}}, "refused": {model: [{...}, ...]}}, whatever of it is well formed
    (a part that is not is said and left out: a rolled-back bundle may then be tried again, never the reverse)."""
    out: dict = {"active": {}, "refused": {}}
    try:
        data = read_json(path)
    except (OSError, ValueError) as e:
        log.error("%s: cannot read the rollouts' record (%s): rolled-back bundles may be tried again", path, e)
        return out
    if data is None:
        return out
    if not isinstance(data, dict):
        log.error("%s: the rollouts' record is not a JSON object: ignored", path)
        return out
    active, refused = data.get("active") or {}, data.get("refused") or {}
    if not isinstance(active, dict) or not isinstance(refused, dict):
        log.error("%s: parts of the rollouts' record are malformed: ignored", path)
    for model, entry in (active.items() if isinstance(active, dict) else ()):
        if isinstance(entry, dict):
            out["active"][model] = entry
    for model, entries in (refused.items() if isinstance(refused, dict) else ()):
        if isinstance(entries, list):
            out["refused"][model] = [e for e in entries if isinstance(e, dict)]
    return out


def interrupted(state_dir: str, name: str) -> dict | None:
    """The rollout of model `name` the last daemon left under way, if any (registry.py, at start)."""
    return read_state(os.path.join(state_dir, STATE_FILE))["active"].get(name)
