"""The kernel facts ABI 2 rests on, checked on this machine's kernel: sealed memfds cannot be resized, a
result ring sealed F_SEAL_FUTURE_WRITE cannot be written through any new mapping or call even by a reader of
another uid (also through a reopened /proc/self/fd), and FUTEX_WAIT / futex_waitv work on a read-only shared
mapping. tests/kernel/sealcheck.c prints one PASS/FAIL line per fact; the same program booted as /init of
Debian 12's stock 6.1 kernel under qemu (tests/kernel/run-on-debian-kernel.sh, run by hand: it downloads the
kernel) gave the same verdicts (docs/abi.md)."""
from __future__ import annotations

import subprocess

from conftest import ROOT, require_root, require_tool


def test_sealing_and_read_only_futex_facts_hold_on_this_kernel(tmp_path):
    require_root("the program drops a child to uid 65534 to play a reader of another user")
    cc = require_tool("cc")
    exe = tmp_path / "sealcheck"
    subprocess.run([cc, "-O2", "-Wall", "-o", str(exe), str(ROOT / "tests/kernel/sealcheck.c")], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    lines = out.splitlines()
    assert "=== SEALCHECK END ===" in lines, out[-2000:]
    failed = [x for x in lines if x.startswith("FAIL")]
    passed = [x for x in lines if x.startswith("PASS")]
    assert not failed and len(passed) >= 50, "\n".join(failed) or out[-2000:]
