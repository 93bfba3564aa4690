"""A rollout's parts without a daemon: the agreement measure (labels compared by name), the run-time histogram and
its p99, the gates' verdict, a lane's report checked like any lane input, the configuration, and how status and
/metrics show a rollout."""
from __future__ import annotations

import json
import time
import types

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeinfer.config.sections import ModelEntry
from edgeinfer.control.rollout import Rollouts
from edgeinfer.lanes.protocol import ProtocolError, TrialReport
from edgeinfer.lanes.trials import TrialBook
from edgeinfer.lanes.trial import BUCKETS, bucket, bucket_floor_us, quantile_us
from edgeinfer.models.agreement import AgreementMeter, NotComparable
from edgeinfer.models.decoders import make_decoder


def _classifier(labels):
    return make_decoder({"type": "classification", "top_k": 4}, labels, 8, 8, [[1, 4]])


def _scores(i: int) -> list[np.ndarray]:
    s = np.zeros((1, 4), np.float32)
    s[0, i] = 1.0
    return [s]


def test_agreement_compares_classes_by_label_so_a_label_swap_disagrees():
    same = AgreementMeter(_classifier(["0", "90", "180", "270"]), _classifier(["0", "90", "180", "270"]))
    swapped = AgreementMeter(_classifier(["0", "90", "180", "270"]), _classifier(["0", "270", "180", "90"]))
    for i in range(4):
        same.add(_scores(i), _scores(i), 8, 8)
        swapped.add(_scores(i), _scores(i), 8, 8)
    assert same.agreement == 1.0 and same.result().metric == "top1"
    assert swapped.agreement == 0.5 and swapped.agreed == 2 and swapped.total == 4  # 90 and 270 now disagree
    # A reordered label list with the outputs reordered to match agrees: the same answers by name.
    reordered = AgreementMeter(_classifier(["0", "90", "180", "270"]), _classifier(["90", "0", "180", "270"]))
    reordered.add(_scores(1), _scores(0), 8, 8)
    assert reordered.agreement == 1.0


def test_agreement_matches_detector_boxes_by_label_and_refuses_a_raw_model():
    def detector(labels):
        return make_decoder({"type": "detection", "strides": [32], "score_threshold": 0.5}, labels, 64, 64,
                            [[1, 4, 7]])
    out = np.zeros((1, 4, 7), np.float32)
    out[0, 0] = [0.5, 0.5, 0.0, 0.0, 1.0, 0.9, 0.1]  # class 0 ("cat")
    out[0, 3] = [0.5, 0.5, 0.0, 0.0, 1.0, 0.1, 0.8]  # class 1 ("dog")
    same = AgreementMeter(detector(["cat", "dog"]), detector(["cat", "dog"]))
    same.add([out], [out], 64, 64)
    swapped = AgreementMeter(detector(["cat", "dog"]), detector(["dog", "cat"]))
    swapped.add([out], [out], 64, 64)
    assert same.agreement == 1.0 and same.result().pairs == 2
    assert swapped.agreement == 0.0 and swapped.total == 4
    raw = make_decoder({"type": "raw"}, [], 8, 8, [[1, 4]])
    with pytest.raises(NotComparable, match="raw model"):
        AgreementMeter(raw, raw)
    with pytest.raises(NotComparable, match="nothing to compare"):
        AgreementMeter(detector([]), detector([])).result()


def test_run_time_buckets_are_monotonic_about_nine_percent_wide_and_give_p99():
    ns = [int(1.024 * us * 1000) for us in range(1, 200_000, 7)]
    buckets = [bucket(n) for n in ns]
    assert buckets == sorted(buckets) and max(buckets) < BUCKETS
    for i in range(16, 200):
        assert bucket_floor_us(i + 1) / bucket_floor_us(i) <= 1.126  # 8 a doubling: at most 12.5 % apart
        assert bucket(int(bucket_floor_us(i) * 1024)) == i
    hist = [0] * BUCKETS
    for _ in range(990):
        hist[bucket(5_000_000)] += 1  # 5 ms
    for _ in range(10):
        hist[bucket(20_000_000)] += 1  # 20 ms: the slowest 1 %
    p99 = quantile_us(hist, 0.99)
    assert 5_000 <= p99 <= 5_000 * 1.13  # the 99th run is a 5 ms one: its bucket's upper bound
    assert quantile_us(hist, 0.999) >= 20_000
    assert quantile_us([0] * BUCKETS, 0.99) is None


def _report(**kw) -> TrialReport:
    base = dict(name="orient", version="0.0.12", frames=10, agreed=10, answers=10, runs=10, errors=0, skipped=0,
                candidate_us=(100, 10), serving_us=(100, 10), problem=None)
    return TrialReport(**{**base, **kw})


def test_a_lane_report_that_cannot_be_true_is_a_protocol_violation():
    """A lane is not trusted further than the protocol: a report on a model it does not hold, or with figures
    that cannot be true, gets the lane killed (supervisor.poll); a plausible one is kept by lane and pid."""
    book = TrialBook()
    book.begin("orient", None, [], None)
    book.keep(0, 1234, ["orient"], _report())
    assert list(book.reports["orient"]) == [(0, 1234)]
    for bad in (dict(name="other"), dict(agreed=11), dict(errors=11), dict(frames=-1),
                dict(candidate_us=(BUCKETS, 1)), dict(candidate_us=(1,)), dict(serving_us=(1, -5)),
                dict(candidate_us=tuple(range(2 * BUCKETS + 2)))):
        with pytest.raises(ProtocolError):
            book.keep(0, 1234, ["orient"], _report(**bad))


class _Lanes:
    def __init__(self, reports, problem=None):
        self.trials = types.SimpleNamespace(reports={"orient": {(0, 1): r for r in reports}},
                                            problems={"orient": problem} if problem else {})


def _rollouts(tmp_path, rollout: dict, reports, problem=None, elapsed: float = 10.0) -> Rollouts:
    entry = ModelEntry(bundle="/b", rollout=rollout)
    served = {"orient": types.SimpleNamespace(entry=entry, runtime=None, version="0.0.11")}
    cfg = types.SimpleNamespace(model=types.SimpleNamespace(state_dir=str(tmp_path)),
                                runtime=types.SimpleNamespace(max_sessions=8))
    r = Rollouts(cfg, models=types.SimpleNamespace(served=served), lanes=_Lanes(reports, problem), streams=[],
                 trim=None)
    model = types.SimpleNamespace(version="0.0.12", decoder=types.SimpleNamespace(kind=1))
    from edgeinfer.control.rollout import Candidate
    r.active["orient"] = Candidate("orient", "shadow", model, ("o", "0.0.11"), (), started=time.monotonic() - elapsed,
                                   started_wall=0.0, min_agreement=0.98)
    return r


def _hist(us: float, n: int) -> tuple:
    return (bucket(int(us * 1024)), n)


@pytest.mark.parametrize("report, decision, why", [
    (dict(frames=50, agreed=50, answers=50, runs=50), None, None),  # the window is not full yet
    (dict(frames=300, agreed=300, answers=300, runs=300), "promote", "every gate passed"),
    (dict(frames=300, agreed=250, answers=300, runs=300), "rollback", "agreement 0.8333 < 0.98"),
    (dict(frames=300, agreed=300, answers=300, runs=300, candidate_us=_hist(10_000, 300)), "rollback",
     "p99 run time 2.00x"),
    (dict(frames=300, agreed=300, answers=300, runs=310, errors=10), "rollback", "error rate 0.0323 > 0.01"),
    (dict(problem="the trial could not start: boom"), "rollback", "the trial could not start: boom"),
])
def test_the_gates_decide_only_over_a_full_window(tmp_path, report, decision, why):
    r = _rollouts(tmp_path, {"policy": "shadow", "window": {"min_frames": 200, "min_seconds": 1}},
                  [_report(**{"candidate_us": _hist(5_000, 300), "serving_us": _hist(5_000, 300), **report})])
    verdict = r.verdict("orient", r.figures("orient"))
    if decision is None:
        assert verdict is None
    else:
        assert verdict[0] == decision and why in verdict[1], verdict


def test_a_window_that_does_not_fill_or_a_lane_that_cannot_take_the_candidate_rolls_back(tmp_path):
    window = {"policy": "shadow", "window": {"min_frames": 200, "min_seconds": 1, "max_seconds": 30}}
    slow = _rollouts(tmp_path, window, [_report(frames=20, agreed=20, answers=20, runs=20, skipped=400)], elapsed=31)
    decision, why = slow.verdict("orient", slow.figures("orient"))
    assert decision == "rollback" and why.startswith("the window did not fill in 30 s: 20 of 200 frames compared, "
                                                     "400 samples skipped"), why
    waiting = _rollouts(tmp_path, window, [_report(frames=20, agreed=20, answers=20, runs=20)], elapsed=29)
    assert waiting.verdict("orient", waiting.figures("orient")) is None
    lost = _rollouts(tmp_path, window, [_report()], problem="lane1 was restarted and could not take the candidate")
    assert lost.verdict("orient", lost.figures("orient")) == ("rollback",
                                                              "lane1 was restarted and could not take the candidate")


def test_a_malformed_rollouts_record_is_read_for_what_is_well_formed(tmp_path, caplog):
    from edgeinfer.control.rollout import read_state
    path = tmp_path / "rollouts.json"
    path.write_text(json.dumps({"active": ["not", "a", "mapping"], "refused": {"orient": [{"digest": "ab"}, 7],
                                                                               "other": "x"}}))
    state = read_state(str(path))
    assert state == {"active": {}, "refused": {"orient": [{"digest": "ab"}]}}
    assert "malformed" in caplog.text
    path.write_text("{not json")
    assert read_state(str(path)) == {"active": {}, "refused": {}}


def test_a_trial_never_reports_more_errors_than_runs_or_more_agreed_than_compared():
    """The loop and the trial thread write the counters without a lock; a failure is counted a run first, and the
    report reads what may not exceed another before it (checked by lanes/trials.py TrialBook.keep)."""
    from edgeinfer.lanes.trial import Trial
    serving = types.SimpleNamespace(decoder=_classifier(["a", "b", "c", "d"]), geometries=[], get=lambda g: None)
    t = Trial("orient", "canary", serving, serving, 0.5, frozenset({1}))
    t.start()
    t.failed()
    t.failed()
    r = t.report()
    assert r["runs"] == 2 and r["errors"] == 2
    t.meter.add(_scores(0), _scores(1), 8, 8)
    r = t.report()
    assert r["answers"] == 1 and r["agreed"] == 0 and r["frames"] == 1
    t.stop()  # the thread ends and closes its eventfd
    deadline = time.monotonic() + 10
    while t.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not t.alive


def test_rollout_configuration_is_validated_like_every_key():
    e = ModelEntry(bundle="/b")
    assert e.rollout.policy == "immediate" and e.rollout.gates.max_p99_ratio == 1.25
    assert e.rollout.gates.min_agreement is None and e.rollout.window.min_frames == 200
    for bad in ({"policy": "blue-green"}, {"sample": 0}, {"sample": 1.5}, {"share": 1.0},
                {"window": {"min_frames": 1}}, {"gates": {"max_p99_ratio": 0.5}}, {"gates": {"typo": 1}},
                {"window": {"min_seconds": 60, "max_seconds": 30}}):
        with pytest.raises(ValueError):
            ModelEntry(bundle="/b", rollout=bad)


def test_status_and_metrics_show_a_rollout_under_way_and_its_decisions():
    from edgeinfer.control.status import status, status_line
    from edgeinfer.telemetry.metrics import DaemonCollector
    from edgeinfer.telemetry.metrics import Health
    from edgeinfer.telemetry.snapshot import Figures, RolloutView
    from test_status_snapshot import _Lanes as NoLanes, _Models, _snapshot
    import dataclasses
    f = Figures(frames=120, agreement=0.995, runs=121, errors=1, skipped=3, p99_candidate_us=5100.0,
                p99_serving_us=5000.0, elapsed_s=30.0)
    view = RolloutView("shadow", "1.2.0", "1.3.0", (), f, {"min_agreement": 0.98, "max_p99_ratio": 1.25,
                                                         "max_error_rate": 0.01, "min_frames": 200,
                                                         "min_seconds": 60},
                       {("1.1.0", "1.2.0", "promote"): 1}, None)
    snap = _snapshot()
    snap = dataclasses.replace(snap, models=tuple(dataclasses.replace(m, rollout=view) for m in snap.models))
    st = status(snap)
    assert st["models"]["orient"]["rollout"]["candidate"] == "1.3.0"
    assert "(shadow rollout of 1.3.0: 120/200 frames, agreement 0.995)" in status_line(st)
    reg = CollectorRegistry()
    reg.register(DaemonCollector(lambda: snap, Health(NoLanes([]), _Models(), [], deadline_s=3.0,
                                                      requires_stream=False)))
    text = generate_latest(reg).decode()
    labels = 'candidate="1.3.0",model="orient",serving="1.2.0"'
    assert 'edgeinfer_rollout_active{candidate="1.3.0",model="orient",policy="shadow",serving="1.2.0"} 1.0' in text
    assert f"edgeinfer_rollout_compared_frames{{{labels}}} 120.0" in text
    assert f"edgeinfer_rollout_p99_ratio{{{labels}}} 1.02" in text
    assert 'edgeinfer_rollout_decisions_total{candidate="1.2.0",decision="promote",model="orient",serving="1.1.0"} 1.0' \
        in text
    assert 'edgeinfer_rollout_gate{gate="min_frames",model="orient"} 200.0' in text
