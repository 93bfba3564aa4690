"""`edgeinferctl status` and `top` (the daemon's /metrics as a table) and `demo`."""
from __future__ import annotations


def cmd_status(args) -> int:
    from edgeinfer.cli.statusview import Endpoint, status
    return status(Endpoint(args.url, args.config, args.timeout))


def cmd_top(args) -> int:
    from edgeinfer.cli.statusview import Endpoint, top
    return top(Endpoint(args.url, args.config, args.timeout), args.iterations)


def cmd_demo(args) -> int:
    from edgeinfer.cli.demo import run_demo
    return run_demo(args.bundle, args.seconds)
