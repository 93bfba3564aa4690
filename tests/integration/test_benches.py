"""The benchmarks still run (smoke, not timing).

bench/ measures; tests never assert its figures. But a bench that no longer
starts records nothing: a cleanup once removed an attribute both benches used
and nobody noticed until the next measurement. Each runs here in its smallest
shape, and what is asserted is what does not depend on the machine: it ran to
its JSON summary, and its accounting of frames was exact.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from test_rtsp import _gst_rtsp_missing


def _summary(args: list[str], timeout: float) -> dict:
    """Runs a bench (its models come from `make models`, a prerequisite of `make test`); its JSON summary."""
    assert (ROOT / "models/bundles/orientation/model.onnx").exists(), "run `make models` first"
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_scale_bench_runs_lanes_and_batched_rows_with_exact_accounting():
    s = _summary(["bench/scale.py", "--quick", "--rows", "lanes,batched", "--warmup", "1", "--window", "2",
                  "--bare-runs", "50"], timeout=300)
    assert set(s["rows"]) == {"lanes", "batched"}, s.get("skipped")
    for key, row in s["rows"].items():
        assert row["throughput_fps"] > 0, key
        assert all(phase["exact"] for rnd in row["accounting"] for phase in rnd.values()), (key, row["accounting"])


def test_e2e_bench_runs_to_its_summary():
    s = _summary(["bench/e2e.py", "--quick", "--no-abi1", "--frames", "40", "--rss-results", "200"], timeout=300)
    rows = s["rows"]
    assert rows["edgeinferd (40 fps offered)"]["n"] >= 30, rows
    assert rows["floor: fused graph, bare run"]["n"] == 40


def test_quantize_bench_runs_both_models_to_its_summary():
    s = _summary(["bench/quantize.py", "--quick"], timeout=300)
    assert set(s["rows"]) == {"orientation", "detector"}
    for name, row in s["rows"].items():
        assert row["fp32"]["p99_ms"] > 0 and row["int8"]["p99_ms"] > 0 and 0 <= row["agreement"] <= 1, name


def test_yuv_bench_runs_each_format_to_its_summary():
    s = _summary(["bench/yuv.py", "--quick"], timeout=600)
    assert [r["format"] for r in s["rows"]] == ["bgr24", "i420", "nv12"]
    for row in s["rows"]:
        assert row["served"] > 0 and row["errors"] == 0 and row["producer_ms"] > 0 and row["daemon_ms"] > 0, row


def test_rtsp_clock_bench_runs_both_decoders_to_its_summary():
    missing = _gst_rtsp_missing()
    if missing:
        pytest.skip(missing)
    s = _summary(["bench/rtsp_clock.py", "--quick"], timeout=300)
    assert set(s["cpu_ms_per_frame"]) == {"sender", "stream"} and all(v > 0 for v in s["cpu_ms_per_frame"].values())
