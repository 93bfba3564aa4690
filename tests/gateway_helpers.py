"""Running the real edgeinfer-gateway (`edgeinferctl gateway`) in tests, beside the real daemon."""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_gateway_config(tmp_path: Path, daemon_config: str, models: dict | None = None, grpc: dict | None = None,
                         frigate: dict | None = None, metrics: dict | None = None) -> tuple[str, str]:
    """A gateway.yaml for a test: (path, the gRPC front's address)."""
    address = f"127.0.0.1:{free_port()}"
    doc = {"daemon_config": daemon_config, "grpc": {"listen": address, **(grpc or {})},
           "metrics": {"listen": "127.0.0.1:0", **(metrics or {})}}
    if models:
        doc["models"] = models
    if frigate:
        doc["frigate"] = frigate
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return str(path), doc["grpc"]["listen"]


def gateway_args(config: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from edgeinfer.cli.ctl import edgeinferctl_main as m; sys.exit(m())",
            "gateway", "--config", config, "--log-level", "debug"]


def start_gateway(children, config: str, address: str, run_as: list[str] = (), log_file: str | None = None,
                  wait_ready: float = 90.0):
    """The gateway as a child process; waits (bounded) until tritonclient says the server is ready."""
    if log_file:
        with open(log_file, "a") as log:
            proc = children.spawn([*run_as, *gateway_args(config)], stderr=log, stdout=log)
    else:
        proc = children.spawn([*run_as, *gateway_args(config)])
    proc.log_file = log_file
    if wait_ready:
        import tritonclient.grpc as tc
        client = tc.InferenceServerClient(address)
        deadline = time.monotonic() + wait_ready
        try:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"the gateway exited ({proc.returncode}): {gateway_log(proc)}")
                try:
                    if client.is_server_ready(client_timeout=2.0):
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"the gateway was not ready within {wait_ready} s")
                time.sleep(0.2)
        finally:
            client.close()
    return proc


def gateway_log(proc) -> str:
    if getattr(proc, "log_file", None):
        with open(proc.log_file, errors="replace") as f:
            return f.read()
    if proc.poll() is None:
        return "(running)"
    return (proc.stderr.read() if proc.stderr else "")


def gateway_metrics_url(proc, timeout: float = 10.0) -> str:
    """http://HOST:PORT of the gateway's /metrics, from its log."""
    import re
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"metrics and health on (http://\S+)", gateway_log(proc))
        if m:
            return m.group(1)
        time.sleep(0.1)
    pytest.fail("the gateway did not say where its metrics are")


def metric(url: str, name: str, **labels) -> float:
    """One sample of a Prometheus exposition at url + /metrics (0 when absent)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items()):
                total += s.value
    return total
