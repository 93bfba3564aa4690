"""Command-line entry points: `edgeinferd` (the daemon, here) and `edgeinferctl` (the operator's tool: ctl.py,
its subcommands in commands/). Both are named from here: setup.py's console scripts, `edgeinfer.cli`."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from edgeinfer.support.signals import Signals
from edgeinfer.cli.logformat import setup_logging
# edgeinferctl by the name setup.py's console script gives it, and its socket defaults as named here before.
from edgeinfer.cli.ctl import _INGRESS_SOCKET, _RESULTS_SOCKET, edgeinferctl_main  # noqa: F401


def _print_status(st: dict) -> None:
    for name, s in st["streams"].items():
        e2e = s.get("e2e_ms") or {}
        from edgeinfer.abi.vocabulary import OUTCOMES
        drops = "  ".join(f"{o} {s[o]}" for o in OUTCOMES)
        print(f"{name}: {s['fps']:5.1f} fps  e2e p50 {e2e.get('p50', 0):6.2f} ms  p99 {e2e.get('p99', 0):6.2f} ms  "
              f"{drops}  {'connected' if s['connected'] else 'waiting for producer'}", flush=True)


def edgeinferd_main(argv=None) -> int:
    # From the first moment, before the slow imports (numpy, ONNX Runtime): a stop during start-up is orderly.
    signals = Signals(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    ap = argparse.ArgumentParser(prog="edgeinferd", description="edgeinfer inference daemon")
    ap.add_argument("--config", default="/etc/edgeinfer/edgeinferd.yaml")
    ap.add_argument("--check-config", action="store_true", help="validate the configuration and exit")
    ap.add_argument("--verify-only", action="store_true",
                    help="run the start-up checks (config, signature, anti-rollback, model) and exit")
    ap.add_argument("--status-interval", type=float, default=0.0, help="print per-stream status every N seconds")
    ap.add_argument("--stats-file", help="write status as JSON here every --status-interval (default 1 s), and once "
                    "more after the lanes stopped at exit (the final counts)")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    from edgeinfer.models.bundle import BundleError
    from edgeinfer.config.schema import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"edgeinferd: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        for w in cfg.warnings:
            print(f"edgeinferd: warning: {w}", file=sys.stderr)
        print(f"{args.config}: OK" + (f" ({len(cfg.warnings)} warnings)" if cfg.warnings else ""))
        return 0
    # Here, not above: --check-config needs no native core (abi/constants.py).
    from edgeinfer.abi.ring import RingError
    from edgeinfer.control.daemon import Daemon, Stopped
    if cfg.runtime.fault_injection:
        signals.also(signal.SIGUSR1)
    daemon = Daemon(cfg, args.config, signals)
    if args.verify_only:
        try:
            models = daemon.verify_only()
        except (BundleError, OSError) as e:
            print(f"edgeinferd: {e}", file=sys.stderr)
            return 1
        entries = cfg.model_entries()
        for name, m in models.items():
            fallback = daemon.models.served[name].fallback
            if fallback:  # the log line said why, on stderr
                print(f"{entries[name].bundle}: REFUSED; the start falls back on the last known-good bundle "
                      f"{fallback['bundle']}: OK: {m.name} {m.version}, signed by {m.signer.key_file} "
                      f"(sha256 of the key {m.signer.fingerprint[:16]}…)")
                continue
            print(f"{entries[name].bundle}: OK: {m.name} {m.version}, signed by {m.signer.key_file} "
                  f"(sha256 of the key {m.signer.fingerprint[:16]}…)")
        return 0
    try:
        daemon.start()
    except Stopped:
        daemon.close()
        logging.getLogger("edgeinferd").info("stopped during start-up")
        return 0
    except (BundleError, RingError, OSError) as e:
        print(f"edgeinferd: {e}", file=sys.stderr)
        daemon.close()
        return 1
    print("edgeinferd: ready", flush=True)
    interval = args.status_interval or (1.0 if args.stats_file else 0.0)
    try:
        return daemon.serve(interval, args.stats_file, _print_status if args.status_interval else None)
    finally:
        daemon.close()
        logging.getLogger("edgeinferd").info("stopped")


if __name__ == "__main__":
    sys.exit(edgeinferctl_main())
