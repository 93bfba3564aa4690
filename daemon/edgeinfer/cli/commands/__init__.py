"""edgeinferctl's subcommands, one module a group (the parser that names them: ctl.py): streams (results,
feed), camera, model (and keys), views (status, top, demo)."""
from __future__ import annotations

import signal

from edgeinfer.support.signals import Signals


def stop_flag():
    return Signals(signal.SIGTERM, signal.SIGINT).stop_flag()
