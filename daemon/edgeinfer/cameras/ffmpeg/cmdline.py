"""The decoder child's command line: the ffmpeg program's, or the PyAV decoder's (avdecode.py), with the same
input options and output."""
from __future__ import annotations

import sys

from edgeinfer.cameras.ffmpeg.options import FfmpegOptions
from edgeinfer.cameras.ffmpeg.output import asked_range


def _input_options(o: FfmpegOptions, timeout_s: float) -> dict[str, str]:
    """FFmpeg's input options for the source (the program's, ffprobe's and the PyAV decoder's): a network
    source's socket I/O timeout (our own watchdog stands behind it) and RTSP transport."""
    us = str(int(timeout_s * 1e6))
    if o.rtsp:
        return {"timeout": us, **({"rtsp_transport": o.transport} if o.transport else {})}
    return {"rw_timeout": us} if o.kind == "network" else {}


def _as_flags(options: dict[str, str]) -> list[str]:
    return [x for key, value in options.items() for x in (f"-{key}", value)]


def ffmpeg_args(ffmpeg: str, o: FfmpegOptions) -> list[str]:
    # level+info: each stderr line says its level (problems are kept, info dropped) and showinfo's per-frame lines
    # (the frame's pts) are info.
    args = [ffmpeg, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "level+info"]
    if o.hwaccel:
        args += ["-hwaccel", o.hwaccel]
    if o.kind == "file":
        if o.fps != 0:
            args += ["-re"]  # a file plays at its own rate, like a camera (fps 0: as fast as it decodes)
        if o.loop:
            args += ["-stream_loop", "-1"]
    else:
        args += _as_flags(_input_options(o, o.read_timeout))
    # showinfo first: each decoded frame's pts, size, format and colour, in order. Scaled only when a size was
    # asked for (a frame already in the output's format then passes through without swscale). A full range asked
    # is made so (ffmpeg 5.1 would squeeze a JPEG-range frame into limited range); a limited one is what its
    # conversion to a non-JPEG format gives anyway (an explicit out_range would cost a copy of every frame).
    scale = [f"{o.width}:{o.height}"] if o.width is not None else []
    scale += ["out_range=full"] if asked_range(o) == "full" else []
    scale = f",scale={':'.join(scale)}" if scale else ""
    args += ["-i", o.source, "-map", "0:v:0",  # the first video stream, or an error if there is none
             "-vf", f"showinfo=checksum=0{scale}",
             "-fps_mode", "passthrough",  # never duplicate a frame
             "-f", "rawvideo", "-pix_fmt", o.ffmpeg_pix_fmt, "-"]
    return args


def avdecode_args(o: FfmpegOptions) -> list[str]:
    """The PyAV decoder (avdecode.py) with the same input options and output as ffmpeg_args gives the program."""
    args = [sys.executable, "-m", "edgeinfer.cameras.avdecode"]
    for key, value in _input_options(o, o.read_timeout).items():
        args += ["--option", f"{key}={value}"]
    if o.width is not None:
        args += ["--size", f"{o.width}x{o.height}"]
    out_range = asked_range(o)
    if out_range:
        args += ["--range", out_range]  # (FFmpeg 8.1 keeps a JPEG range through the conversion otherwise)
    if o.hwaccel:
        args += ["--hwaccel", o.hwaccel]
    return [*args, o.ffmpeg_pix_fmt, o.source]
