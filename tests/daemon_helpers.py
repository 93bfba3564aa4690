"""Running the real edgeinferd in tests: config files, start, ready, stats."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, read_line

BUNDLES = ROOT / "models" / "bundles"
TRUST_DIR = None  # set by the `bundles` fixture: the trust store that verifies the signed test bundles


def bundle(name: str) -> str:
    """The fetched, unsigned bundle (for reference runs that bypass the daemon)."""
    path = BUNDLES / name
    if not (path / "model.onnx").exists():
        pytest.fail(f"{path} is missing: make test fetches the models (scripts/fetch-models models)")
    return str(path)


def sign_copy(name: str, dest: Path, key: str, edit=None) -> str:
    """A signed copy of a fetched bundle; `edit(dir)` changes it before signing."""
    from edgeinfer.models.verify import sign_bundle
    shutil.copytree(bundle(name), dest)
    if edit:
        edit(dest)
    sign_bundle(str(dest), key)
    return str(dest)


def write_config(tmp_path: Path, bundle_path: str, streams: list[dict], runtime: dict | None = None,
                 trust_dir: str | None = None, metrics: dict | None = None, shm: dict | None = None,
                 state_dir: str | None = None, ingress: dict | None = None, models: dict | None = None,
                 lanes: list | None = None, pools: dict | None = None) -> str:
    """An edgeinferd.yaml for a test. Streams name their producer and readers (default: this process's
    user); the sockets live in `tmp_path` unless `ingress` says otherwise (a value None leaves a key out).
    models: {name: bundle path or {bundle: ..., ort_threads: ...}} instead of the one `bundle_path`;
    lanes: [{cpus: [...], models: [...]}]; pools: {name: {model, user, streams, ...}} (the gateway's streams)."""
    uid = os.getuid()
    lines = ["model:\n" + (f"  bundle: {bundle_path}\n" if bundle_path else "") +
             f"  warmup_runs: 1\n  trust_dir: {trust_dir or TRUST_DIR}\n  state_dir: {state_dir or tmp_path / 'state'}"]
    if models:
        lines.append("models:\n" + "\n".join(
            f"  {name}: " + (json.dumps(m) if isinstance(m, dict) else json.dumps({"bundle": m}))
            for name, m in models.items()))
    if lanes is not None:
        lines.append("lanes: " + json.dumps(lanes))
    if pools:
        lines.append("pools:\n" + "\n".join(f"  {name}: {json.dumps(pool)}" for name, pool in pools.items()))
    lines.append("streams:" if streams else "streams: []")
    for s in streams:
        s = {"producer": f"{{user: {uid}}}", "readers": f"{{users: [{uid}]}}", **s}
        lines.append("  - " + "\n    ".join(f"{k}: {v}" for k, v in s.items() if v is not None))
    rt = {"scheduling": "fifo", **(runtime or {})}
    lines.append("runtime:\n" + "\n".join(f"  {k}: {v}" for k, v in rt.items()))
    # metrics={"listen": None}: the key left out (the default applies).
    m = {k: v for k, v in {"listen": "127.0.0.1:0", "enabled": "true", **(metrics or {})}.items() if v is not None}
    lines.append("metrics:\n" + "\n".join(f"  {k}: {v}" for k, v in m.items()))
    ing = {k: v for k, v in {"socket": tmp_path / "ingress.sock", "results_socket": tmp_path / "results.sock",
                             **(ingress or {})}.items() if v is not None}
    lines.append("ingress:\n" + "\n".join(f"  {k}: {v}" for k, v in ing.items()))
    if shm:
        lines.append("shm:\n" + "\n".join(f"  {k}: {v}" for k, v in shm.items()))
    path = tmp_path / "edgeinferd.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def sockets(config: str) -> tuple[str, str]:
    """(ingress socket, results socket) of a config file."""
    import yaml
    with open(config) as f:
        ing = (yaml.safe_load(f) or {}).get("ingress") or {}
    from edgeinfer.abi import ring
    return ing.get("socket", ring.INGRESS_SOCKET), ing.get("results_socket", ring.RESULTS_SOCKET)


def edgeinferd_args(config: str, *extra: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from edgeinfer.cli import edgeinferd_main as m; sys.exit(m())",
            "--config", config, *extra]


def start_daemon(children, config: str, stats_file: str | None = None, wait_ready: bool = True,
                 log_file: str | None = None, run_as: list[str] = (), env: dict | None = None):
    """log_file: the daemon's stderr (its log) goes there instead of a pipe — for
    long runs, where a pipe nobody reads would fill up and block the daemon.
    run_as: a command prefix (UserSet.run_as) that runs it as another user; env: its environment."""
    extra = ["--stats-file", stats_file] if stats_file else []
    args = [*run_as, *edgeinferd_args(config, *extra)]
    if log_file:
        with open(log_file, "a") as log:
            proc = children.spawn(args, stderr=log, env=env)
    else:
        proc = children.spawn(args, env=env)
    proc.log_file = log_file
    proc.metrics_url = None
    proc.ingress, proc.results = sockets(config)
    if wait_ready:
        while True:
            line = read_line(proc, timeout=60)
            if line.startswith("edgeinferd: metrics "):
                proc.metrics_url = line.split()[-1]
                continue
            assert line == "edgeinferd: ready", line
            break
    return proc


def daemon_log(proc) -> str:
    """Everything the daemon logged (its stderr), from the log file or the pipe."""
    if getattr(proc, "log_file", None):
        with open(proc.log_file, errors="replace") as f:
            return f.read()
    return proc.stderr.read()


def stop_daemon(proc, timeout: float = 10.0) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def read_stats(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def poll(predicate, timeout: float, interval: float = 0.05):
    """predicate() until it is truthy or `timeout` seconds pass; returns its last
    value either way (for tests that must record what happened before asserting)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    value = poll(predicate, timeout, interval)
    if not value:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")
    return value


def camera(proc, stream: str, width: int, height: int, pixel_format: str = "bgr24", **kw):
    """A FrameWriter handed to the daemon `proc` as `stream` (waits for the acceptance; raises a refusal)."""
    from edgeinfer.abi import ring
    return ring.FrameWriter.connect(stream, width, height, pixel_format, socket=proc.ingress, **kw)


def results(proc, stream: str, **kw):
    """A ResultReader of `stream` on the daemon `proc` (follows it across restarts)."""
    from edgeinfer.abi import ring
    return ring.ResultReader.watch(stream, socket=proc.results, **kw)


def measured(cmd: list[str], out_dir: str, tag: str, timeout: float = 60.0):
    """Starts `cmd` (stdout and stderr to files); returns a function that waits for it (bounded) and gives
    (exit code, stdout, stderr, rchar, peak RSS bytes): rchar (bytes read by system calls; -1 if /proc could not
    say) and the peak RSS are the command's own, taken by a small launcher (tests/measure_child.py: forked from
    this test process, the command would report the test's RSS high-water mark as its own). Killed, with the
    launcher, after `timeout` seconds."""
    out, err = open(os.path.join(out_dir, f"{tag}.out"), "w+"), open(os.path.join(out_dir, f"{tag}.err"), "w+")
    report = os.path.join(out_dir, f"{tag}.measured.json")
    if os.path.exists(report):
        os.unlink(report)
    p = subprocess.Popen([sys.executable, str(ROOT / "tests/measure_child.py"), report, *cmd], stdout=out,
                         stderr=err, start_new_session=True)

    def finish():
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        try:
            with open(report) as f:
                got = json.load(f)
        except (OSError, ValueError):
            got = {"rc": p.returncode, "rchar": -1, "maxrss": 0}
        p.returncode = got["rc"]
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read())
            f.close()
        return got["rc"], texts[0], texts[1], got["rchar"], got["maxrss"]
    return finish
