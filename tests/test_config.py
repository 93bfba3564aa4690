"""Configuration: validation errors name the key and the YAML line; the CLI check."""
from __future__ import annotations

import subprocess

import pytest

from edgeinfer.config import ConfigError, load_config
from daemon_helpers import edgeinferd_args

GOOD = """\
model:
  bundle: /tmp/bundle
streams:
  - name: cam0
    max_age_ms: 100
runtime:
  scheduling: fifo
"""


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_good_config_loads_with_defaults(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    s = cfg.streams[0]
    assert (s.segment_name, s.results_name, s.max_age_ms) == ("edgeinfer.cam0", "edgeinfer.cam0.results", 100)
    assert cfg.runtime.duty_ceiling == 0.9 and cfg.metrics.listen == "127.0.0.1:9464"


@pytest.mark.parametrize("text, expect", [
    (GOOD.replace("    max_age_ms: 100", "    max_age_ms: 100\n    colour: red"), ":6: streams[0].colour: unknown key"),
    (GOOD.replace("max_age_ms: 100", "max_age_ms: -1"), ":5: streams[0].max_age_ms: Input should be greater than 0"),
    (GOOD.replace("scheduling: fifo", "scheduling: fast"), ":7: runtime.scheduling: Input should be 'fifo'"),
    (GOOD.replace("  bundle: /tmp/bundle", "  warmup_runs: 3"), ":1: model.bundle: Field required"),
    (GOOD.replace("name: cam0", "name: 'bad name!'"), ":4: streams[0].name: Value error"),
    (GOOD + "  loop_cpus: [99]\n", ":8: runtime.loop_cpus: Value error, CPUs [99] are not available"),
    (GOOD.replace("streams:", "streams: [").replace("runtime:", "runtime:"), "not valid YAML"),
])
def test_each_error_names_the_key_and_line(tmp_path, text, expect):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert expect in str(info.value), str(info.value)


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace("max_age_ms: 100", "max_age_ms: 0\n    priority: 500")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert len(info.value.problems) == 2


def test_shipped_default_config_is_valid():
    from conftest import ROOT
    cfg = load_config(str(ROOT / "etc/edgeinfer/edgeinferd.yaml"))
    assert cfg.streams and cfg.model.bundle


def test_check_config_cli(tmp_path):
    ok = subprocess.run(edgeinferd_args(write(tmp_path, GOOD), "--check-config"), capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = subprocess.run(edgeinferd_args(write(tmp_path, GOOD.replace("fifo", "fast")), "--check-config"),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "runtime.scheduling" in bad.stderr and ":7:" in bad.stderr


def test_repeated_key_is_an_error_with_both_lines(tmp_path):
    from edgeinfer.yamlconf import ConfigError, load_yaml_model
    from edgeinfer.config import Config
    text = "model:\n  bundle: /a\n  warmup_runs: 1\n  warmup_runs: 5\nstreams:\n  - name: cam0\n"
    with pytest.raises(ConfigError) as e:
        load_yaml_model(Config, text, "c.yaml")
    assert e.value.problems == ["c.yaml:4: model.warmup_runs: repeated key (first given at line 3)"]
