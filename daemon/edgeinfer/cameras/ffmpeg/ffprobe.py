"""Before a feed starts: the ffmpeg program, its hardware decoders, and what ffprobe says of a file or a
source."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess

from edgeinfer.cameras.ffmpeg.cmdline import _as_flags, _input_options
from edgeinfer.cameras.ffmpeg.errors import FeedError, explain
from edgeinfer.cameras.ffmpeg.options import FfmpegOptions


def find_ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        raise FeedError("ffmpeg is not installed (Debian: apt install ffmpeg)")
    return path


# The RTSP decoder's package (PyAV and its FFmpeg libraries; decision record 0036).
PYAV_PACKAGE = "edgeinfer-rtsp"


def find_pyav() -> None:
    """Refuses an RTSP source with the sender's clock on a host without PyAV (avdecode.py decodes it)."""
    if importlib.util.find_spec("av") is None:
        raise FeedError(f"an RTSP source with rtsp_clock sender is decoded by PyAV, which is not installed "
                        f"(Debian: apt install {PYAV_PACKAGE}; rtsp_clock stream decodes it with the ffmpeg program)")


def check_hwaccel(ffmpeg: str | None, name: str) -> None:
    """Refuses a hardware decoder the decoder does not have, naming the ones it has. ffmpeg None: the PyAV
    decoder's (its own FFmpeg's, which may differ from the program's)."""
    if ffmpeg is None:
        from av.codec.hwaccel import hwdevices_available
        have, which = list(hwdevices_available()), "PyAV's FFmpeg (for RTSP with --rtsp-clock sender; " \
            "--rtsp-clock stream decodes with the ffmpeg program)"
    else:
        out = subprocess.run([ffmpeg, "-hide_banner", "-hwaccels"], capture_output=True, text=True,
                             timeout=30).stdout
        have, which = [x.strip() for x in out.splitlines()[1:] if x.strip()], "this ffmpeg"
    if name not in have:
        raise FeedError(f"hardware decoding {name!r} is not available in {which} (it has: "
                        f"{', '.join(have) or 'none'})")


# Demuxers that turn any bytes into pictures: a text file would "play" as rendered ANSI text.
_NOT_VIDEO_DEMUXERS = {"tty": "a text file", "bin": "binary data", "xbin": "binary data", "adf": "binary data",
                       "idf": "binary data"}


def _ffprobe(ffmpeg: str, args: list[str], source: str, timeout_s: float) -> str | None:
    """ffprobe's stdout for `args` on `source`; None where there is no ffprobe beside ffmpeg (Debian ships them
    together; elsewhere ffmpeg's own errors still apply). A failure is a FeedError with ffprobe's reason."""
    ffprobe = os.path.join(os.path.dirname(ffmpeg), "ffprobe")
    if not os.access(ffprobe, os.X_OK):
        return None
    try:
        r = subprocess.run([ffprobe, "-v", "error", *args, source], capture_output=True, text=True,
                           timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        raise FeedError(f"{source}: no answer to ffprobe within {timeout_s:g} s") from None
    if r.returncode != 0:
        raise FeedError(f"{source}: {explain(r.stderr.strip().splitlines(), r.returncode)}")
    return r.stdout


def check_file(ffmpeg: str, path: str) -> None:
    """A file is looked at before it is played: ffprobe says what ffmpeg would read it as."""
    out = _ffprobe(ffmpeg, ["-show_entries", "format=format_name", "-of", "csv=p=0"], path, 25)
    what = _NOT_VIDEO_DEMUXERS.get((out or "").strip())
    if what:
        raise FeedError(f"{path}: not a video ffmpeg can decode ({what}: ffmpeg would only render its bytes as "
                        "text art)")


def probe(ffmpeg: str, o: FfmpegOptions) -> dict:
    """The source's first video stream as ffprobe sees it (width, height, color_space, color_range, pix_fmt);
    bounded by the connect timeout. Raises FeedError with ffprobe's reason."""
    out = _ffprobe(ffmpeg, [*_as_flags(_input_options(o, o.connect_timeout)), "-select_streams", "v:0", "-show_entries",
                            "stream=codec_name,width,height,avg_frame_rate,color_space,color_range,pix_fmt",
                            "-of", "json"], o.source, o.connect_timeout)
    if out is None:
        raise FeedError("ffprobe is not installed beside ffmpeg (Debian: apt install ffmpeg)")
    streams = json.loads(out or "{}").get("streams")
    if not streams:
        raise FeedError(f"{o.source}: no video stream in the source")
    return streams[0]
