"""The native per-stage latency histograms (native/hist.pyx), as lanes/stats.py and telemetry use them: abi/
is the only importer of the native core (tests/unit/test_layers.py)."""
from edgeinfer._hist import HIST_BYTES, STAGES, StageHistograms, cumulative_at  # noqa: F401  (re-exported)
