"""A helper process's metrics and probes on one bounded listener (httplistener.py): /metrics from a
prometheus-client registry, and each probe path answering 200 with no problem, 503 with the problems named
({"ok": bool, "problems": [...]}). The gateway and the MQTT bridge serve theirs through it."""
from __future__ import annotations

import json
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgeinfer.telemetry.httplistener import HttpListener


class ProbeListener:
    def __init__(self, registry: CollectorRegistry, listen: str, probes: dict[str, Callable[[], list[str]]]):
        """probes: path → the problems now (none: healthy, or ready)."""
        host, _, port = listen.rpartition(":")

        def render():
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

        def probe(problems: Callable[[], list[str]]):
            def answer():
                why = problems()
                return (503 if why else 200), "application/json", \
                    json.dumps({"ok": not why, "problems": why}).encode() + b"\n"
            return answer

        routes = {"/metrics": render, **{path: probe(p) for path, p in probes.items()}}
        self.listener = HttpListener(host.strip("[]"), int(port), routes)
        self.address = self.listener.address

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()
