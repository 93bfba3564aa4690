"""edgeinferctl's subcommands, one module a group (the parser that names them: ctl.py).
Its modules, one job each: docs/architecture.md, "Module map"."""
from __future__ import annotations

import signal

from edgeinfer.support.signals import Signals


def stop_flag():
    return Signals(signal.SIGTERM, signal.SIGINT).stop_flag()
