"""edgeinfer-gateway: the network fronts' process (edgeinfer-gateway.service, or `edgeinferctl gateway`).

It runs as its own unprivileged user, which the daemon's pools name as the only
producer and reader of their streams: to edgeinferd it is a camera and a
reader, nothing more (shared/ARCHITECTURE.md §8). Start order: read both
configurations (plan.py) → open the pools' rings (served.py; they connect
whenever edgeinferd is there) → start the fronts → READY=1. The main thread
then keeps: reconnects rings, warms models, pings the watchdog while the fronts
serve, and stops on SIGTERM/SIGINT. A crash here stops no camera.
"""
from __future__ import annotations

import logging
import signal
import time

from edgeinfer.config.labels import LabelSource
from edgeinfer.config.schema import load_config
from edgeinfer.fronts.frontmetrics import FrontMetrics
from edgeinfer.fronts.oip import InferenceService, start_server
from edgeinfer.fronts.plan import make_plan
from edgeinfer.fronts.served import ServedModels
from edgeinfer.fronts.gatewayconfig import GatewayConfig, load_gateway_config
from edgeinfer.support.liveness import Liveness
from edgeinfer.support.startfiles import StartFile, StartFileError, check_start_files
from edgeinfer.support.signals import STOP, Signals
from edgeinfer.support.sockets import raise_fd_limit
from edgeinfer.support.systemd import Notifier, Watchdog
from edgeinfer.telemetry.probes import ProbeListener

log = logging.getLogger("edgeinfer-gateway")

KEEP_INTERVAL_S = 0.1
STATUS_INTERVAL_S = 5.0


class Gateway:
    def __init__(self, gw: GatewayConfig, version: str, signals: Signals | None = None):
        self.gw = gw
        self.version = version
        self.signals = signals if signals is not None else Signals()
        self.notifier = Notifier()
        self.metrics = FrontMetrics()
        self.live = Liveness("the keeper")  # the watchdog's and /healthz's evidence
        self.models: ServedModels | None = None
        self.grpc = None
        self.frigate = None
        self.listener: ProbeListener | None = None

    def start(self) -> None:
        gw = self.gw
        raise_fd_limit()  # every network connection costs an fd
        daemon = load_config(gw.daemon_config)
        plans = make_plan(gw, daemon)
        if gw.grpc.enabled and not gw.grpc.loopback() and gw.grpc.tls is None:
            log.warning("grpc.listen %s is not loopback and has no TLS: frames and results cross the network in "
                        "the clear, and anyone who reaches it may use the models (set grpc.tls)", gw.grpc.listen)
        labels = LabelSource(config=gw.daemon_config, warn=lambda m: log.warning("%s", m))
        try:
            self.models = ServedModels(plans, ingress_socket=daemon.ingress.socket,
                                 results_socket=daemon.ingress.results_socket, labels=labels)
            largest = self.models.largest_frame_bytes()
            if gw.grpc.enabled:
                self.grpc = start_server(InferenceService(self.models, gw.grpc, self.metrics, self.version), gw.grpc,
                                         self.metrics, largest)
            if gw.frigate.enabled:
                from edgeinfer.fronts.frigate import FrigateFront
                self.frigate = FrigateFront(self.models, gw.frigate, self.metrics)
                self.frigate.start()
                self.live.watch("frigate front stopped", self.frigate.thread.is_alive)
            if gw.metrics.enabled:
                self.listener = ProbeListener(self.metrics.registry, gw.metrics.listen,
                                              {"/healthz": self.live.problems, "/readyz": self.not_ready})
                self.listener.start()
                log.info("gateway metrics and health on http://%s", self.listener.address)
        except BaseException:
            self.close()
            raise
        for name, plan in plans.items():
            log.info("model %s: pool %s, %s, sizes %s", name, plan.pool,
                     ", ".join(f"{w}x{h}: {len(s)} ring(s)" for (w, h), s in plan.streams.items()),
                     plan.pixel_format)

    def not_ready(self) -> list[str]:
        """/readyz: the models not ready yet (no warm-up frame came back through the daemon), and any problem."""
        models = self.models.served.items() if self.models is not None else ()
        return [f"model {name}: " + (m.warm_error or "waiting for edgeinferd" if not m.warm else
                                     "edgeinferd not reachable") for name, m in models if not m.ready] + \
            self.live.problems()

    def status_line(self) -> str:
        parts = [f"{name}: {'ready' if m.ready else 'waiting for edgeinferd'}" + (f" ({m.version})" if m.version else "")
                 for name, m in self.models.served.items()]
        return "; ".join(parts)

    def serve(self) -> int:
        self.notifier.send("READY=1", "STATUS=" + self.status_line())
        watchdog = Watchdog(self.notifier, self.live, 0.0)
        next_status = time.monotonic() + STATUS_INTERVAL_S
        while not self.signals.requested(*STOP):
            self.models.keep()
            for name, m in self.models.served.items():
                self.metrics.ready.labels(name).set(1.0 if m.ready else 0.0)
            self.live.turned()
            watchdog.tick()
            if self.notifier.enabled and time.monotonic() >= next_status:
                next_status += STATUS_INTERVAL_S
                self.notifier.send("STATUS=" + self.status_line())
            time.sleep(KEEP_INTERVAL_S)
        return 0

    def close(self) -> None:
        self.notifier.stopping()  # a stop goes on whether systemd hears it or not
        if self.grpc is not None:
            self.grpc.stop(grace=1.0)
            self.grpc = None
        if self.frigate is not None:
            self.frigate.stop()
            self.frigate = None
        if self.models is not None:
            self.models.close()
            self.models = None
        if self.listener is not None:
            self.listener.stop()
            self.listener = None


# The owner and mode of each file the gateway (user edgeinfer-gw, group edgeinfer) reads at start
# (docs/operations/install-and-upgrade.md, "Files each service reads at start").
CONFIG_NEED = "readable by user edgeinfer-gw: 0644 root:root, as the package ships it"
KEY_NEED = "0640 root:edgeinfer-gw (install -m 0640 -o root -g edgeinfer-gw KEY PATH)"
CERT_NEED = "readable by user edgeinfer-gw: 0644 root:root (or 0640 root:edgeinfer-gw)"


def gateway_start_files(gw: GatewayConfig) -> list[StartFile]:
    """What the gateway reads at start besides gateway.yaml: edgeinferd.yaml, and grpc.tls's files."""
    files = [StartFile(gw.daemon_config, "daemon_config", CONFIG_NEED)]
    tls = gw.grpc.tls if gw.grpc.enabled else None
    if tls is not None:
        files += [StartFile(tls.cert, "grpc.tls.cert", CERT_NEED), StartFile(tls.key, "grpc.tls.key", KEY_NEED)]
        if tls.client_ca:
            files.append(StartFile(tls.client_ca, "grpc.tls.client_ca", CERT_NEED))
    return files


def run(config_path: str, version: str) -> int:
    """`edgeinferctl gateway`: runs until SIGTERM or SIGINT. Exit 2: a configuration that cannot serve."""
    from edgeinfer.fronts.plan import PlanError
    from edgeinfer.support.yamlconf import ConfigError
    signals = Signals(signal.SIGTERM, signal.SIGINT)
    try:
        check_start_files([StartFile(config_path, "--config", CONFIG_NEED)])
        gw = load_gateway_config(config_path)
        check_start_files(gateway_start_files(gw))
        gateway = Gateway(gw, version, signals)
        gateway.start()
    except StartFileError as e:
        for line in e.problems:
            log.error("cannot start: %s", line)
        return 2
    except (ConfigError, PlanError) as e:
        log.error("%s", e)
        return 2
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1
    try:
        return gateway.serve()
    finally:
        gateway.close()


