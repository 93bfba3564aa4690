"""Command-line entry points: `edgeinferd` (the daemon, here) and `edgeinferctl` (the operator's tool: ctl.py,
its subcommands in commands/). Both are named from here: setup.py's console scripts, `edgeinfer.cli`."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from edgeinfer.support.version import VERSION
from edgeinfer.support.signals import Signals
from edgeinfer.cli.logformat import setup_logging


def edgeinferctl_main(argv=None) -> int:
    """edgeinferctl (ctl.py), by the name setup.py's console script gives it. Imported when called: the
    daemon's start loads none of the operator tool's subcommands (tests/integration/test_startup_imports.py)."""
    from edgeinfer.cli.ctl import edgeinferctl_main as main
    return main(argv)


def _print_status(st: dict) -> None:
    for name, s in st["streams"].items():
        e2e = s.get("e2e_ms") or {}
        from edgeinfer.abi.vocabulary import OUTCOMES
        drops = "  ".join(f"{o} {s[o]}" for o in OUTCOMES)
        print(f"{name}: {s['fps']:5.1f} fps  e2e p50 {e2e.get('p50', 0):6.2f} ms  p99 {e2e.get('p99', 0):6.2f} ms  "
              f"{drops}  {'connected' if s['connected'] else 'waiting for producer'}", flush=True)


# The owner and mode of what edgeinferd (user edgeinfer) reads at start before the bundles, whose own checks name
# their files (docs/operations/install-and-upgrade.md, "Files each service reads at start").
CONFIG_NEED = "readable by user edgeinfer: 0644 root:root, as the package ships it (or 0640 root:edgeinfer)"
TRUST_NEED = "listable by user edgeinfer: 0755 root:root, its keys 0644 root:root"


def _bundles_missing(cfg) -> str | None:
    """None when a bundle the configuration names is installed (its model.onnx is there, or cannot be looked at:
    the start says why); else what is missing, each with its key. The unit's ExecCondition= (edgeinferd
    --condition): a fresh install, with no bundle, stays inactive instead of crash-looping."""
    import os
    entries = cfg.model_entries()
    if not entries:
        return None  # the configuration's own check refuses it
    missing = []
    for name, entry in entries.items():
        onnx = os.path.join(entry.bundle, "model.onnx")
        try:
            os.stat(onnx)
            return None
        except FileNotFoundError:
            legacy = cfg.model.bundle is not None and entry.bundle == cfg.model.bundle
            missing.append(f"{onnx} (model.bundle)" if legacy else f"{onnx} (models.{name}.bundle)")
        except OSError:
            return None
    return ", ".join(missing)


def _providers_missing(cfg) -> list[str]:
    """A line for each model whose execution provider cannot serve on this host (`--check-config`); a start serves
    such a model on the CPU provider, degraded (docs/operations/providers.md)."""
    from edgeinfer.models import providers
    lines = []
    for name, entry in cfg.model_entries().items():
        spec = entry.provider.spec()
        why = providers.check(spec)
        if why:
            lines.append(f"models.{name}.provider: {spec.label} cannot serve on this host: {why}; a start would "
                         f"serve {name} on the CPU provider (edgeinferctl model bench --providers lists what this "
                         f"host has)")
    return lines


def edgeinferd_main(argv=None) -> int:
    # From the first moment, before the slow imports (numpy, ONNX Runtime): a stop during start-up is orderly.
    signals = Signals(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    ap = argparse.ArgumentParser(prog="edgeinferd", description="edgeinfer inference daemon")
    ap.add_argument("--version", action="version", version=f"edgeinferd {VERSION}")
    ap.add_argument("--config", default="/etc/edgeinfer/edgeinferd.yaml")
    ap.add_argument("--check-config", action="store_true", help="validate the configuration and exit")
    ap.add_argument("--verify-only", action="store_true",
                    help="run the start-up checks (config, signature, anti-rollback, model) and exit")
    ap.add_argument("--condition", action="store_true",
                    help="the unit's ExecCondition=: exit 1 (the unit stays inactive, not failed) while no bundle the "
                    "configuration names is installed; 0 otherwise, or when the configuration cannot be read (the "
                    "start then says why)")
    ap.add_argument("--status-interval", type=float, default=0.0, help="print per-stream status every N seconds")
    ap.add_argument("--stats-file", help="write status as JSON here every --status-interval (default 1 s), and once "
                    "more after the lanes stopped at exit (the final counts)")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    from edgeinfer.models.bundle import BundleError
    from edgeinfer.config.schema import ConfigError, load_config

    from edgeinfer.support.startfiles import StartFile, StartFileError, check_start_files
    try:
        check_start_files([StartFile(args.config, "--config", CONFIG_NEED)])
        cfg = load_config(args.config)
    except StartFileError as e:
        if args.condition:
            return 0  # the start refuses it, saying why (exit 2)
        for line in e.problems:
            print(f"edgeinferd: cannot start: {line}", file=sys.stderr)
        return 2
    except ConfigError as e:
        if args.condition:
            return 0
        print(f"edgeinferd: {e}", file=sys.stderr)
        return 2
    if args.condition:
        missing = _bundles_missing(cfg)
        if missing is None:
            return 0
        print(f"edgeinferd: no model bundle installed: {missing}; the unit stays inactive until one is (then "
              f"systemctl start edgeinferd)")
        return 1
    if args.check_config:
        for w in cfg.warnings:
            print(f"edgeinferd: warning: {w}", file=sys.stderr)
        missing = _providers_missing(cfg)
        if missing:
            for line in missing:
                print(f"edgeinferd: {line}", file=sys.stderr)
            return 2
        print(f"{args.config}: OK" + (f" ({len(cfg.warnings)} warnings)" if cfg.warnings else ""))
        return 0
    try:  # the trust store: a start (and --verify-only) reads it, --check-config does not
        check_start_files([StartFile(cfg.model.trust_dir, "model.trust_dir", TRUST_NEED, directory=True)])
    except StartFileError as e:
        for line in e.problems:
            print(f"edgeinferd: cannot start: {line}", file=sys.stderr)
        return 2
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
