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


def test_an_rtsp_camera_without_pyav_is_refused_with_exit_2_naming_the_package(tmp_path, capsys, monkeypatch):
    """PyAV ships in edgeinfer-rtsp (decision record 0036). Here its absence is played by find_spec answering None
    for `av` (this .venv has it); the booted container removes the real package (inside.sh, camera_rtsp_package)."""
    import importlib.util
    real = importlib.util.find_spec
    (tmp_path / "porch.yaml").write_text("source: rtsp://127.0.0.1:1/cam\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "av" else real(name, *a))
    assert run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "camera porch: cannot start: an RTSP source with rtsp_clock sender is decoded by PyAV, which is not " \
           "installed (Debian: apt install edgeinfer-rtsp;" in err, err


def test_an_rtsp_camera_with_the_stream_clock_needs_only_the_ffmpeg_program(tmp_path, monkeypatch):
    """rtsp_clock: stream is decoded by the ffmpeg program: PyAV's absence does not matter to it."""
    import importlib.util
    from edgeinfer.cameras import units
    real = importlib.util.find_spec
    (tmp_path / "porch.yaml").write_text("source: rtsp://127.0.0.1:1/cam\nrtsp_clock: stream\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "av" else real(name, *a))
    from edgeinfer.cameras import ffmpeg
    asked = []
    monkeypatch.setattr(ffmpeg, "find_ffmpeg", lambda: asked.append("ffmpeg") or "/usr/bin/ffmpeg")  # (make check
    monkeypatch.setattr(units, "run", lambda *a, **kw: 0)  # has no ffmpeg) the start's checks passed: it would run
    assert run(tmp_path) == 0 and asked == ["ffmpeg"]
