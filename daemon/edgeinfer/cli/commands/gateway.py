"""`edgeinferctl gateway`: the network fronts in the foreground (ExecStart of edgeinfer-gateway.service)."""
from __future__ import annotations


def cmd_gateway(args) -> int:
    from edgeinfer.support.version import VERSION
    from edgeinfer.cli.logformat import setup_logging
    from edgeinfer.fronts.gateway import run
    setup_logging(args.log_level)
    return run(args.config, VERSION)
