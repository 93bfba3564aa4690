"""The Makefile: `make demo` installs only the Debian packages the demo needs; `make test` all of them."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from conftest import ROOT

# What only the test suite needs (the model checker, Prometheus, the container, the fuzzers): a demo host
# should not get them.
TEST_ONLY = {"spin", "prometheus", "debootstrap", "systemd-container", "clang", "libclang-rt-14-dev", "llvm"}
DEMO_NEEDS = {"gcc", "libc6-dev", "make", "python3-venv", "python3-dev"}


def requested(target: str) -> set[str]:
    """The Debian packages `make TARGET` asks scripts/ensure-system-packages for, from scratch: a dry run
    (-n) with every target out of date (-B), so stamps already here hide nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not the outer make's
    out = subprocess.run(["make", "-n", "-B", "--no-print-directory", "-C", str(ROOT), target], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    calls = [shlex.split(line) for line in out.splitlines() if "ensure-system-packages" in line]
    assert calls, f"make -n {target} installs no Debian package at all:\n{out}"
    return {pkg for call in calls for pkg in call[call.index("scripts/ensure-system-packages") + 1:]}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_demo_installs_only_what_the_demo_needs():
    demo, test = requested("demo"), requested("test")
    assert demo & TEST_ONLY == set(), f"make demo would install test-only packages {sorted(demo & TEST_ONLY)}"
    assert DEMO_NEEDS <= demo
    assert DEMO_NEEDS | TEST_ONLY <= test  # make test still gets everything


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_the_venv_is_built_on_debians_python_whatever_comes_first_in_path(tmp_path):
    """The .venv is made by /usr/bin/python3, the interpreter the package runs on, even where another
    python3 (a pyenv under a 0700 home, which other users cannot execute) comes first in PATH."""
    shadow = tmp_path / "python3"
    shadow.write_text("#!/bin/sh\nexit 99\n")
    shadow.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON")}
    env["PATH"] = f"{tmp_path}:{env.get('PATH', '')}"
    out = subprocess.run(["make", "-n", "-B", "--no-print-directory", "-C", str(ROOT), "VENV=" + str(tmp_path / "v"),
                          "venv"], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    made = [line for line in out.splitlines() if "-m venv" in line]
    assert made and all("/usr/bin/python3 -m venv" in line for line in made), out
