"""edgeinfer: zero-copy, real-time ONNX inference on shared-memory camera frames.

The packages, their layers and every module's one job: docs/architecture.md, "Module map"."""
import os

# ONNX Runtime >= 1.29 ships telemetry on Linux (a persistent device id in $TMPDIR and an uploader to
# Microsoft), on unless this is set before it initialises. An edge appliance makes no outbound connection
# nobody asked for: off, before anything of ours can import onnxruntime. An operator who wants it sets
# ORT_DISABLE_TELEMETRY=0 explicitly.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from edgeinfer.support.version import VERSION as __version__  # noqa: E402 (defined once: support/version.py)
