"""The control plane's record of the rollouts' trials in its lanes (lanes/trial.py is a lane's side): what each
model's trial is, so that a restarted lane gets it again, the lanes' reports of it, and why a lane could not take
it. control/rollout.py reads the reports and decides; lanes/supervisor.py sends the messages."""
from __future__ import annotations

from edgeinfer.lanes.protocol import ProtocolError, StartTrial, TrialReport
from edgeinfer.lanes.trial import BUCKETS, RATIO_BUCKETS


class TrialBook:
    def __init__(self):
        self.trials: dict[str, tuple] = {}  # model → (candidate ModelRuntime, its geometries, StartTrial)
        # model → the latest report of each lane process holding it, by (lane, pid): a lane restarted meanwhile
        # reports from zero again, and what its predecessor measured still counts.
        self.reports: dict[str, dict[tuple, TrialReport]] = {}
        self.problems: dict[str, str] = {}  # model → why a lane could not take the candidate (rolled back then)

    def begin(self, name: str, model, geometries, msg: StartTrial) -> None:
        self.trials[name] = (model, list(geometries), msg)
        self.reports[name] = {}
        self.problems.pop(name, None)

    def end(self, name: str) -> None:
        for d in (self.trials, self.reports, self.problems):
            d.pop(name, None)

    def keep(self, lane: int, pid: int, models, msg: TrialReport) -> None:
        """A lane's report, kept if it is of a trial under way on a model the lane holds (a report that crossed
        the trial's end is dropped). Figures that cannot be true (counts below zero, more agreed than compared,
        more errors than runs, a histogram bucket out of range) raise ProtocolError: the lane is not trusted."""
        if msg.name not in models:
            raise ProtocolError(f"TrialReport.name {msg.name[:40]!r}: not one of the lane's models")
        counts = (msg.frames, msg.agreed, msg.answers, msg.runs, msg.errors, msg.skipped)
        hists = ((msg.candidate_us, BUCKETS), (msg.serving_us, BUCKETS), (msg.ratios, RATIO_BUCKETS))
        if (min(counts) < 0 or msg.agreed > msg.answers or msg.errors > msg.runs
                or any(len(h) % 2 or len(h) > 2 * n or not all(isinstance(v, int) and v >= 0 for v in h)
                       or not all(h[i] < n for i in range(0, len(h), 2)) for h, n in hists)):
            raise ProtocolError(f"TrialReport for {msg.name[:40]!r}: figures out of range")
        reports = self.reports.get(msg.name)
        if reports is not None:
            reports[(lane, pid)] = msg
