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
from edgeinfer.lanes.trialbook import TrialBook
from edgeinfer.lanes.trial import (BUCKETS, RATIO_BUCKETS, RATIO_ZERO, bucket, bucket_floor_us, median_bounds,
                                   quantile_us, ratio_bucket)
from edgeinfer.models.agreement import AgreementMeter, NotComparable, wilson
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
                candidate_us=(100, 10), serving_us=(100, 10), problem=None, ratios=(RATIO_ZERO, 10))
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
                dict(candidate_us=tuple(range(2 * BUCKETS + 2))), dict(ratios=(RATIO_BUCKETS, 1)),
                dict(ratios=(RATIO_ZERO, -1))):
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


def _ratios(*pairs) -> tuple:
    """Flat (bucket, count) pairs of paired ratios: _ratios((1.0, 290), (3.0, 10))."""
    out = {}
    for ratio, n in pairs:
        b = ratio_bucket(int(ratio * 1_000_000), 1_000_000)
        out[b] = out.get(b, 0) + n
    return tuple(v for item in sorted(out.items()) for v in item)


@pytest.mark.parametrize("report, decision, why", [
    (dict(frames=50, agreed=50, answers=50, runs=50), None, None),  # the window is not full yet
    (dict(frames=300, agreed=300, answers=300, runs=300), "promote", "every gate passed"),
    (dict(frames=300, agreed=250, answers=300, runs=300), "rollback", "agreement 0.8333 < 0.98"),
    (dict(frames=300, agreed=300, answers=300, runs=300, ratios=_ratios((2.0, 300))), "rollback",
     "run time 2.00x the serving version's (median of 300 paired ratios"),
    (dict(frames=300, agreed=300, answers=300, runs=310, errors=10), "rollback", "error rate 0.0323 > 0.01"),
    (dict(problem="the trial could not start: boom"), "rollback", "the trial could not start: boom"),
    # The figures: 202 of 203 agreed (0.9951) is not proof of >= 0.98 at 95 %: the window grows.
    (dict(frames=203, agreed=202, answers=203, runs=203), None, None),
    # A busy host: a few pairs hit by contention (ratio 9.45) do not move the median of the paired ratios.
    (dict(frames=300, agreed=300, answers=300, runs=300, ratios=_ratios((1.0, 270), (2.4, 20), (9.45, 10))),
     "promote", "every gate passed"),
    (dict(frames=300, agreed=300, answers=300, runs=300, ratios=(RATIO_ZERO, 0)), "rollback",
     "run time: no pair of runs measured"),
])
def test_the_gates_decide_only_over_a_full_window_on_the_evidence(tmp_path, report, decision, why):
    r = _rollouts(tmp_path, {"policy": "shadow", "window": {"min_frames": 200, "min_seconds": 1}},
                  [_report(**{"candidate_us": _hist(5_000, 300), "serving_us": _hist(5_000, 300),
                              "ratios": _ratios((1.0, report.get("frames", 300))), **report})])
    verdict = r.verdict("orient", r.figures("orient"))
    if decision is None:
        assert verdict is None
    else:
        assert verdict[0] == decision and why in verdict[1], verdict


def test_wilson_bounds_are_the_formula_and_decide_agreement_only_when_sure():
    """The Wilson score interval (models/agreement.wilson) against values worked by hand, and the issue's case:
    a 0.969 model measured 0.9951 on 203 frames is undecided; measured longer at its true rate it is rolled back."""
    low, high = wilson(202, 203, 0.95)
    assert abs(low - 0.97258) < 1e-4 and abs(high - 0.99913) < 1e-4, (low, high)
    low, high = wilson(203, 203, 0.95)
    assert abs(low - 0.98143) < 1e-4 and high == 1.0
    assert wilson(0, 0, 0.95) == (0.0, 1.0)
    assert wilson(50, 100, 0.99)[0] < wilson(50, 100, 0.95)[0] < 0.5 < wilson(50, 100, 0.95)[1]
    n = 2000
    low, high = wilson(round(0.969 * n), n, 0.95)
    assert high < 0.98  # its true agreement, measured on a window the undecided one grew to: refused


def test_median_bounds_of_paired_ratios_hold_the_median_and_narrow_with_pairs():
    assert median_bounds([0] * RATIO_BUCKETS, 0.95) is None
    assert ratio_bucket(1000, 1000) == RATIO_ZERO and ratio_bucket(2000, 1000) > RATIO_ZERO > ratio_bucket(500, 1000)
    assert ratio_bucket(10**12, 1) == RATIO_BUCKETS - 1 and ratio_bucket(1, 10**12) == 0
    rng = np.random.default_rng(7)
    for true, n in ((1.0, 50), (1.0, 2000), (2.0, 300)):
        hist = [0] * RATIO_BUCKETS
        # Contention: a tenth of the pairs has one run slowed, either one, by up to 10x.
        for r in true * np.exp(rng.normal(0, 0.05, n)) * np.where(rng.random(n) < 0.1, rng.uniform(0.1, 10, n), 1):
            hist[ratio_bucket(int(r * 1e6), 1_000_000)] += 1
        median, low, high = median_bounds(hist, 0.95)
        assert low <= median <= high and low < true * 1.05 and high > true / 1.05, (true, n, low, median, high)
    assert high - low < 0.2 * true  # 300 pairs: well within the 1.25 gate's reach either way
    few = [0] * RATIO_BUCKETS
    few[RATIO_ZERO] = 3
    assert median_bounds(few, 0.95)[1] < 1 < median_bounds(few, 0.95)[2]  # 3 pairs: the bucket's edges


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
    # Undecided past max_seconds: rolled back, never promoted on weak evidence.
    unsure = _rollouts(tmp_path, window, [_report(frames=203, agreed=202, answers=203, runs=203,
                                                  ratios=_ratios((1.0, 203)))], elapsed=31)
    decision, why = unsure.verdict("orient", unsure.figures("orient"))
    assert decision == "rollback" and why.startswith("still undecided after 30 s") and "straddle 0.98" in why, why


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
    report reads what may not exceed another before it (checked by lanes/trialbook.py TrialBook.keep)."""
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
    assert e.rollout.policy == "immediate" and e.rollout.gates.max_time_ratio == 1.25
    assert ModelEntry(bundle="/b", rollout={"gates": {"max_p99_ratio": 3}}).rollout.gates.max_time_ratio == 3  # old
    assert e.rollout.gates.confidence == 0.95
    assert e.rollout.gates.min_agreement is None and e.rollout.window.min_frames == 200
    for bad in ({"policy": "blue-green"}, {"sample": 0}, {"sample": 1.5}, {"share": 1.0},
                {"window": {"min_frames": 1}}, {"gates": {"max_p99_ratio": 0.5}}, {"gates": {"typo": 1}},
                {"gates": {"max_time_ratio": 0.9}}, {"gates": {"confidence": 1.0}}, {"gates": {"confidence": 0.2}},
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
                p99_serving_us=5000.0, elapsed_s=30.0, agreement_low=0.97, agreement_high=0.999, time_ratio=1.01,
                time_ratio_low=0.97, time_ratio_high=1.06, pairs=120, confidence=0.95)
    view = RolloutView("shadow", "1.2.0", "1.3.0", (), f, {"min_agreement": 0.98, "max_time_ratio": 1.25,
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
    assert f"edgeinfer_rollout_time_ratio_high{{{labels}}} 1.06" in text
    assert f"edgeinfer_rollout_agreement_low{{{labels}}} 0.97" in text
    from edgeinfer.cli import rolloutview
    from prometheus_client.parser import text_string_to_metric_families
    shown = rolloutview.empty()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.labels.get("model") == "orient":
                rolloutview.absorb(shown, sample)
    out = rolloutview.render("orient", shown)
    assert "agreement" in out and "undecided (bound 0.9700)" in out, out  # 0.995 passes, its bound not yet
    assert "time ratio" in out and "passing" in out, out
    assert 'edgeinfer_rollout_decisions_total{candidate="1.2.0",decision="promote",model="orient",serving="1.1.0"} 1.0' \
        in text
    assert 'edgeinfer_rollout_gate{gate="min_frames",model="orient"} 200.0' in text


def test_rollout_command_takes_the_state_dir_from_the_config_and_says_where_a_scrape_failed(tmp_path):
    """`model rollout NAME promote --config FILE` leaves its request in that configuration's model.state_dir (not
    /var/lib/edgeinfer), never makes a directory, and a daemon too busy to answer is said with the URL and the
    options that choose another (a listening socket nobody accepts on: the scrape times out)."""
    import socket
    from edgeinfer.cli import rolloutview
    from edgeinfer.cli.statusview import Endpoint
    state = tmp_path / "state"
    cfg = tmp_path / "edgeinferd.yaml"
    cfg.write_text(f"model:\n  state_dir: {state}\nmetrics:\n  listen: 127.0.0.1:9\n")
    assert rolloutview.state_dir_of(str(cfg)) == str(state)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
        with pytest.raises(OSError) as e:
            rolloutview.read(url, "orient", timeout=0.3, endpoint=Endpoint(url, str(cfg)))
    said = str(e.value)
    assert url in said and "(from --url)" in said and "another --url" in said and "too busy" in said, said
    assert "timed out" in said, said


def test_a_lane_problem_wins_over_an_operators_promote(tmp_path):
    """A lane said the candidate's run hung (or it could not take it) while an operator's promote request waits:
    the rollout rolls back with the lane's reason, and the request is never taken (a candidate known to hang is
    never promoted by hand in the second before the gates would have rolled it back)."""
    r = _rollouts(tmp_path, {"policy": "canary"}, [_report()], problem="lane1: the candidate's run did not end")
    requested, decided = [], []
    r._request = lambda name: requested.append(name) or ("promote", "promote requested by ops")
    r.decide = lambda name, decision, why, figures=None: decided.append((decision, why))
    r.evaluate(time.monotonic() + 10)
    assert decided == [("rollback", "lane1: the candidate's run did not end")] and requested == []
