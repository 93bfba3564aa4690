"""ABI 1 beside ABI 2, in one run: the 0.1 package, built from its commit, for the benchmarks' child runs.

ABI 1 is no longer in the tree. A benchmark that compares against it builds the 0.1 package once from its
commit (a git worktree with the native core built in place, cached outside the clone, like the 0.1 .deb of
the upgrade test) and re-runs itself as a child process with that package first on PYTHONPATH and
`--abi1-child`, measuring the ABI 1 cells with the same harness; the parent reads the child's JSON.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMIT = "f68a388"  # the last commit of 0.1.0 (ABI 1)
CACHE = os.environ.get("EDGEINFER_ROOTFS_CACHE", os.path.expanduser("~/.cache/edgeinfer"))


def package_path(commit: str = COMMIT) -> str:
    """A directory holding `edgeinfer` = the 0.1 package with its native core built (cached)."""
    base = os.path.join(CACHE, f"abi1-{commit}")
    py = os.path.join(base, "py")
    src = os.path.join(base, "src")
    if os.path.exists(os.path.join(py, "edgeinfer")):
        return py
    os.makedirs(base, exist_ok=True)
    if not os.path.isdir(src):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", src, commit], check=True,
                       capture_output=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src, check=True,
                   capture_output=True)
    os.makedirs(py, exist_ok=True)
    os.symlink(os.path.join(src, "daemon"), os.path.join(py, "edgeinfer.part"))
    os.replace(os.path.join(py, "edgeinfer.part"), os.path.join(py, "edgeinfer"))
    return py


def run_child(script: str, *args: str, timeout: float = 1800) -> dict | None:
    """Runs `script --abi1-child ARGS` on the 0.1 package; its last line's JSON, or None (printed why)."""
    try:
        path = package_path()
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"ABI 1 cells skipped: cannot build 0.1 from {COMMIT}: {e}", file=sys.stderr)
        return None
    env = {**os.environ, "PYTHONPATH": path}
    r = subprocess.run([sys.executable, script, "--abi1-child", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        print(f"ABI 1 cells failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])
