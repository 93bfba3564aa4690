"""`edgeinferctl gateway`: the network fronts in the foreground (ExecStart of edgeinfer-gateway.service)."""
from __future__ import annotations


def cmd_gateway(args) -> int:
    from importlib.metadata import PackageNotFoundError, version
    from edgeinfer.cli.logformat import setup_logging
    from edgeinfer.fronts.gateway import run
    setup_logging(args.log_level)
    try:
        ours = version("edgeinfer")
    except PackageNotFoundError:
        ours = "unknown"
    return run(args.config, ours)
