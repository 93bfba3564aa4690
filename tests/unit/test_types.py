"""The type check of the seams (as pyzmq's tests/test_mypy.py checks its stubs): mypy over lanes/, control/ and
abi/, configured in pyproject.toml ([tool.mypy]), must find nothing. The lane's mailbox and outboxes, the rings
handed to the lanes and the control plane's collaborators are typed records and annotated signatures: a change
that hands one the wrong thing fails here, not in a lane at run time."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/unit/ -> the repository


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed in this interpreter (requirements/dev.txt pins it: make venv)")
def test_lanes_control_and_abi_type_check_clean(tmp_path):
    # Its cache goes to build/ (pyproject.toml) where this user may write there, else to the test's own directory
    # (make check runs as any user; mypy fails outright on a cache it cannot write).
    build = ROOT / "build"
    cache = [] if os.access(build if build.exists() else ROOT, os.W_OK) else ["--cache-dir", str(tmp_path)]
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *cache], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout, r.stdout
