"""What the daemon loads at its start: the modules it uses, none that only other tools need (issue 37)."""
from __future__ import annotations

import os
import re

from daemon_helpers import start_daemon, stop_daemon, write_config

# Never imported by edgeinferd (its lanes included): Sigstore's client stack (model-signing imports it for a
# signing method bundles never use: edgeinfer/models/signinglib.py), the RTSP decoder (PyAV, in the camera's
# decoder child), the fronts' and the bridge's protocol libraries, the ML engineer's tools (quantization), the
# operator's tool (edgeinferctl's subcommands), and the cameras' image library.
NEVER = ("sigstore", "tuf", "requests", "urllib3", "securesystemslib", "rekor_types", "rfc3161_client", "av",
         "PIL", "grpc", "zmq", "paho", "tritonclient", "matplotlib", "onnxruntime.quantization",
         "edgeinfer.models.tools", "edgeinfer.cli.ctl", "edgeinfer.cli.commands", "edgeinfer.fronts",
         "edgeinfer.bridges", "edgeinfer.cameras")


def test_the_daemon_loads_none_of_the_other_tools_modules_at_its_start(bundles, children, tmp_path, stream):
    """The real daemon, its import log (python -X importtime, the same interpreter) up to ready: it verified the
    signed bundle (model-signing), fused and loaded the model (onnx, onnxruntime), and loaded nothing in NEVER."""
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 224, "height": 224}])
    log = tmp_path / "daemon.log"
    proc = start_daemon(children, cfg, log_file=str(log), env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    assert stop_daemon(proc) == 0
    names = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", log.read_text(errors="replace"), re.M))
    assert {"model_signing.verifying", "onnx.compose", "onnxruntime", "edgeinfer.control.daemon"} <= names
    # (the log also names optional imports that failed: none of those may be attempted either)
    loaded = sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in NEVER))
    assert loaded == []
