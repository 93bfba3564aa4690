"""`edgeinferctl results` (a stream's result ring, one JSON line per result) and `edgeinferctl feed` (a
reference camera: synthetic or ffmpeg)."""
from __future__ import annotations

import json
import sys

from edgeinfer.cli.commands import stop_flag


def cmd_results(args) -> int:
    from edgeinfer.abi import ring
    from edgeinfer.abi.payloads import describe
    from edgeinfer.config.labels import LabelSource
    labels = LabelSource(args.bundle, args.config, lambda msg: print(f"edgeinferctl: {msg}", file=sys.stderr))
    reader = ring.ResultReader.connect(args.stream, socket=args.socket, from_oldest=args.from_oldest)
    n = 0
    try:
        for rec in reader.follow(timeout=args.timeout):
            names = labels.labels(rec.model_name, rec.model_version) if not args.no_labels else None
            out = {"number": rec.number, "frame_seq": rec.frame_seq, "frame_id": rec.frame_id,
                   "model": rec.model_name, "version": rec.model_version, "status": rec.status, "kind": rec.kind,
                   "latency_ms": round((rec.done_ns - rec.capture_ns) / 1e6, 3), "missed": rec.missed,
                   **describe(rec.kind, rec.payload, rec.item_count, names or [])}
            print(json.dumps(out), flush=True)
            n += 1
            if args.count and n >= args.count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
    return 0


def cmd_feed(args) -> int:
    stop = stop_flag()
    if args.synthetic:
        from edgeinfer.cameras import synthetic
        n = synthetic.run(args.stream, args.width, args.height, args.fps, args.frames,
                          socket=args.socket, wait=args.wait, seed=args.seed, stop=stop)
    else:
        from edgeinfer.cameras import ffmpeg
        opts = ffmpeg.FfmpegOptions(args.ffmpeg, args.width, args.height, args.pixel_format, fps=args.fps,
                                    frames=args.frames,
                                    loop=args.loop, connect_timeout=args.connect_timeout,
                                    read_timeout=args.read_timeout, transport=args.transport, hwaccel=args.hwaccel,
                                    rtsp_clock=args.rtsp_clock,
                                    reconnect=args.reconnect, max_reconnects=args.max_reconnects)
        try:
            n = ffmpeg.run(opts, args.stream, socket=args.socket, wait=args.wait, stop=stop)
        except ffmpeg.FeedError as e:
            print(f"edgeinferctl: feed {args.stream}: {e}", file=sys.stderr)
            return 1
    print(f"published {n} frames", file=sys.stderr)
    return 0
