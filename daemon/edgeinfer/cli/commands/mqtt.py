"""`edgeinferctl mqtt`: the MQTT bridge in the foreground (ExecStart of edgeinfer-mqtt.service)."""
from __future__ import annotations


def cmd_mqtt(args) -> int:
    from edgeinfer.bridges.bridge import run
    from edgeinfer.cli.logformat import setup_logging
    setup_logging(args.log_level)
    return run(args.config)
