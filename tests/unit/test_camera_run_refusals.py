"""`edgeinferctl camera run NAME` (a camera unit's ExecStart=) refuses what a restart cannot mend with exit 2, which
the unit's RestartPreventExitStatus=2 keeps from a restart loop (issue 35, item 3): a camera file that is not there
or does not load. (That its user cannot read it is the same refusal; as this test may run as root, it is shown in
the booted container: tests/system/inside.sh, start_file_camera.)"""
from __future__ import annotations

import argparse

from edgeinfer.cli.commands.camera import cmd_camera_run
from conftest import ROOT


def run(tmp_path, name="porch") -> int:
    return cmd_camera_run(argparse.Namespace(name=name, dir=str(tmp_path)))


def test_a_missing_camera_file_is_refused_with_exit_2_naming_it_and_what_it_needs(tmp_path, capsys):
    assert run(tmp_path) == 2
    err = capsys.readouterr().err
    assert f"camera porch: cannot start: the camera file: {tmp_path}/porch.yaml: no such file" in err, err
    assert "edgeinfer-cam-porch: 0644 root:root" in err, err


def test_a_camera_file_that_does_not_load_is_refused_with_exit_2_and_its_line(tmp_path, capsys):
    (tmp_path / "porch.yaml").write_text("source: synthetic\nfps: many\n")
    assert run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "camera porch:" in err and "porch.yaml:2: fps:" in err, err


def test_the_camera_unit_does_not_restart_on_exit_2():
    unit = (ROOT / "systemd/edgeinfer-camera@.service").read_text()
    assert "\nRestartPreventExitStatus=2\n" in unit and "\nRestart=always\n" in unit


def test_an_error_while_the_camera_runs_is_not_exit_2(tmp_path, monkeypatch):
    """Exit 2 is for what the start reads. A ValueError raised while the camera runs (a decoder child that died,
    a malformed ffprobe answer) propagates as before, exit 1 from the command's caller, so systemd restarts it."""
    import pytest
    from edgeinfer.cameras import units
    (tmp_path / "porch.yaml").write_text("source: synthetic\nwidth: 64\nheight: 64\nfps: 5\n")

    def running(*a, **kw):
        raise ValueError("I/O operation on closed file")
    monkeypatch.setattr(units, "run", running)
    with pytest.raises(ValueError, match="closed file"):
        run(tmp_path)
