"""The shipped systemd units, parsed (issue 35): what the booted-container checks exercise (tests/system), said
here where a slip shows at once."""
from __future__ import annotations

import configparser
import subprocess
import sys

import pytest

from conftest import ROOT

UNITS = ROOT / "systemd"


def directives(unit: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order, repeated keys kept (systemd's own order matters)."""
    out, section = [], None
    for line in (UNITS / unit).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        out.append((section, key, value))
    return out


def values(unit: str, key: str) -> list[str]:
    return [v for _, k, v in directives(unit) if k == key]


@pytest.mark.parametrize("unit", ["edgeinferd.service", "edgeinfer-gateway.service", "edgeinfer-mqtt.service"])
def test_a_refused_start_file_is_not_restarted(unit):
    assert values(unit, "RestartPreventExitStatus") == ["2"]
    assert values(unit, "Restart") == ["on-failure"]


def test_the_gateway_may_chown_its_frigate_socket_and_nothing_else_is_relaxed():
    """frigate.socket_group chowns the socket: the deny list holds @chown (in @privileged), so the allow must come
    after it (systemd applies SystemCallFilter= lines in order); no capability makes that chown more than a
    group the gateway is in."""
    filters = values("edgeinfer-gateway.service", "SystemCallFilter")
    assert filters == ["@system-service",
                       "~@privileged @mount @swap @reboot @module @raw-io @obsolete @debug @cpu-emulation",
                       "@chown"]
    assert values("edgeinfer-gateway.service", "CapabilityBoundingSet") == [""]


def test_the_daemons_condition_follows_the_configuration():
    """No fixed models/current: ExecCondition= asks edgeinferd about the configured bundles; the socket waits for
    any bundle under the models directory, either layout."""
    assert not values("edgeinferd.service", "ConditionPathExists")
    assert values("edgeinferd.service", "ExecCondition") == [
        "/usr/bin/edgeinferd --condition --config /etc/edgeinfer/edgeinferd.yaml"]
    assert values("edgeinferd.socket", "ConditionPathExistsGlob") == [
        "|/var/lib/edgeinfer/models/*/model.onnx", "|/var/lib/edgeinfer/models/*/*/model.onnx"]


STREAM = "streams:\n  - {name: cam0, model: a, producer: {user: root}}\n"


def _condition(tmp_path, text: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "edgeinferd.yaml"
    cfg.write_text(text + STREAM)
    return subprocess.run([sys.executable, "-c", "import sys; from edgeinfer.cli.main import edgeinferd_main as m; "
                           "sys.exit(m())", "--condition", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=120)


def test_condition_several_models_one_installed_passes(tmp_path):
    (tmp_path / "a" / "current").mkdir(parents=True)
    (tmp_path / "a" / "current" / "model.onnx").write_bytes(b"x")
    r = _condition(tmp_path, f"models:\n  a: {{bundle: {tmp_path}/a/current}}\n  b: {{bundle: {tmp_path}/b/current}}\n")
    assert r.returncode == 0, r.stdout + r.stderr


def test_condition_no_configured_bundle_installed_names_them(tmp_path):
    r = _condition(tmp_path, f"models:\n  a: {{bundle: {tmp_path}/a/current}}\n")
    assert r.returncode == 1
    assert f"no model bundle installed: {tmp_path}/a/current/model.onnx (models.a.bundle)" in r.stdout


def test_condition_passes_a_broken_configuration_to_the_start(tmp_path):
    """The start refuses it, exit 2, naming the line: the condition must not hide it as 'inactive'."""
    r = _condition(tmp_path, "models: [\n")
    assert r.returncode == 0 and not r.stdout, r.stdout


def test_a_missing_start_file_is_named_with_what_it_needs(tmp_path):
    from edgeinfer.support.startfiles import StartFile, StartFileError, check_start_files
    with pytest.raises(StartFileError) as e:
        check_start_files([StartFile(str(tmp_path / "k.pem"), "grpc.tls.key", "0640 root:edgeinfer-gw")])
    assert e.value.problems == [f"grpc.tls.key: {tmp_path}/k.pem: no such file; it must exist, 0640 root:edgeinfer-gw"]
