"""The ffmpeg producer: any source ffmpeg reads (a file, an RTSP/HTTP URL, /dev/videoN) decoded
to raw frames on a pipe, read straight into the ring's free slot (readinto: the only copy is
the kernel's, pipe → slot).

Frames are the decoder's own YUV by default (i420, ffmpeg's yuv420p, what H.264/H.265 decode to):
no colour conversion in the producer (the model's graph does it, at the model's size) and no
scaling unless a size is asked for. The colorimetry (BT.601/709, limited/full) is the source's,
as ffprobe reports it; a source that does not say gets BT.709 from 720 lines up, else BT.601,
limited range (what players assume). bgr24/rgb24 remain available (swscale converts).

An RTSP source is decoded by avdecode.py (PyAV: FFmpeg's libraries) instead of the ffmpeg program, because
only the libraries say what the RTCP sender reports say: the sender's wall clock of each frame, which then
stamps it (StreamClock). The child is driven the same way (frames on stdout, a line per frame on stderr).
`rtsp_clock="stream"` keeps the ffmpeg program (and the stream's own timestamps) for RTSP too.

What a supervisor (systemd, an operator) can rely on:
- A failure exits non-zero with one line that says what failed (file missing, no video stream,
  connection refused, unauthorized, a silent server, ffmpeg killed …); the end of a file exits 0.
- A source that sends nothing for `read_timeout` seconds (`connect_timeout` for the first frame)
  is a failure, whatever ffmpeg itself would wait.
- A live source (a URL, a device) that fails or ends is reconnected with bounded exponential
  backoff, each attempt counted and said; a file is not. A source that delivered frames within the last
  minute is tried at least every second (retry_delay), so frames resume within about a second of its return.
- stop() (SIGTERM, SIGINT) is seen within 0.1 s at any moment, a stalled source included: ffmpeg
  is stopped and the ring closed.
- Frames are the source's: a file plays at its own rate (fps None), as fast as it decodes
  (fps 0), or at its own rate with at most `fps` frames a second published (the others
  dropped, never duplicated).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

from edgeinfer.abi import ring
from edgeinfer.cameras.connection import ConnectionReporter
from edgeinfer.abi.vocabulary import RTSP_CLOCKS, YUV_BASES, takes_source_colour

POLL_S = 0.1  # the longest stop() waits for us
EXIT_WAIT_S = 2.0  # for ffmpeg to exit (and say why) once its output ended
PTS_WAIT_S = 0.2   # for the frame's pts line (stderr) once its bytes (stdout) are in
MAX_LAG_NS = 2_000_000_000  # a frame stamped this far behind its arrival re-anchors the stream clock
SENDER_AHEAD_NS = 100_000_000  # a sender's clock ahead of ours by up to this is clock error: stamped at arrival
SENDER_BEHIND_NS = MAX_LAG_NS  # older by the sender's clock: the clock is wrong (no stamp goes further back)
SENDER_SWITCH_FRAMES = 25  # frames in a row on the other side of those bounds before the clock is switched
NOTICE_INTERVAL_NS = 60_000_000_000  # a switch of clocks is said at most this often (the others counted)
# A source that delivered frames within UP_RECENTLY_S (a camera rebooting, a server restarted) is tried again at
# least every RETRY_UP_S, so its frames resume within about a second of its return; one that never delivered a
# frame (or not for longer) backs off exponentially up to backoff_max.
RETRY_UP_S = 1.0
UP_RECENTLY_S = 60.0


def retry_delay(backoff: float, since_frame: float | None) -> float:
    """The wait before the next attempt: the exponential `backoff`, capped at RETRY_UP_S when the source's last frame
    came `since_frame` seconds ago with that under UP_RECENTLY_S (None: no frame yet)."""
    if since_frame is not None and since_frame < UP_RECENTLY_S:
        return min(backoff, RETRY_UP_S)
    return backoff


# "[ctx @ 0x55…] [level] message" or "[level] message" (-loglevel level+info)
_LEVELLED = re.compile(r"^(\[[^\]]* @ 0x[0-9a-f]+\] )?\[(\w+)\] (.*)$")


_SHOWINFO_FRAME = re.compile(r"\bn:\s*\d+\s+pts:\s*(\S+)\s+pts_time:(\S+)")
_SHOWINFO_GEOMETRY = re.compile(r"\bfmt:(\S+).*\bs:(\d+)x(\d+)")
_SHOWINFO_COLOUR = re.compile(r"\bcolor_range:(\S+)\s+color_space:(\S+)")


def _showinfo_pts(line: str) -> tuple[bool, float | None]:
    """(is it a showinfo frame line, its pts_time): "… n:  12 pts:  12 pts_time:0.48 …"; a frame without a
    timestamp ("pts:NOPTS") is a frame line with None."""
    m = _SHOWINFO_FRAME.search(line)
    if not m:
        return False, None
    try:
        pts = float(m.group(2))
    except ValueError:
        return True, None
    return True, pts if pts == pts and abs(pts) != float("inf") else None


class StreamClock:
    """Capture time on CLOCK_MONOTONIC (and CLOCK_REALTIME beside it): the sender's wall clock where the stream
    carries one, else the stream's own timestamps, else the arrival.

    The sender's clock (an RTSP source's RTCP sender reports, read by the PyAV decoder): the frame was captured
    when the sender's clock says, mapped onto CLOCK_MONOTONIC through our CLOCK_REALTIME; so the camera's encode,
    the network and the decode are all inside the e2e latency (and a stream's max_age_ms counts from there). It is
    trusted when it puts the frame from SENDER_AHEAD_NS in the future (clock error: stamped at arrival) to
    SENDER_BEHIND_NS in the past; beyond, the clocks disagree (a camera without NTP) and the stream's timestamps
    stamp the frames. The first report of a connection decides; after that the choice changes only when
    SENDER_SWITCH_FRAMES frames in a row say otherwise (meanwhile a trusted clock's outliers are clamped into
    the bounds), so a clock near a bound cannot make the stamps flip frame by frame. `notice` says each choice,
    at most once per NOTICE_INTERVAL_NS.

    The stream's timestamps: frame k is stamped anchor + (pts(k) - pts(anchor)), where the anchor is the frame
    that arrived earliest relative to its pts (a frame that would be stamped after its arrival moves the anchor
    to itself): the least-delayed frame defines "no delay", and every later frame's extra decode and transport
    delay is inside its e2e latency. Re-anchored when pts goes backwards (a loop, a reconnection) and when the
    stream falls MAX_LAG_NS behind (a stall, or a source clock slower than ours). A file read faster than real
    time (`--fps 0`) is therefore stamped on arrival. Without a pts a frame is stamped on arrival."""

    def __init__(self):
        self.anchor_pts = self.last_pts = None
        self.anchor_mono = self.real_offset = 0
        self.notice: str | None = None  # something to say (the caller takes it and clears it)
        self.reset()

    def reset(self) -> None:
        """A new connection: its timestamps start anew, and its first sender report decides again."""
        self.anchor_pts = None
        self.sender_trusted: bool | None = None  # None: no report yet
        self._against = 0  # frames in a row whose report disagrees with sender_trusted
        self._said_at: int | None = None  # CLOCK_MONOTONIC of the last notice
        self._unsaid = 0  # switches since, not said

    def _choose(self, trusted: bool, age: int, now_mono: int) -> None:
        self.sender_trusted, self._against = trusted, 0
        if self._said_at is not None and now_mono - self._said_at < NOTICE_INTERVAL_NS:
            self._unsaid += 1
            return
        if trusted:
            text = (f"frames are stamped by the sender's clock (RTCP sender reports): this one was "
                    f"{max(age, 0) / 1e6:.0f} ms old at its arrival (a stream's max_age_ms counts from this clock)")
        else:
            text = (f"the sender's clock (RTCP sender reports) is {-age / 1e9:+.3f} s off ours: frames are stamped "
                    "from the stream's own timestamps instead (set the camera's clock by NTP)")
        self.notice = text + (f"; {self._unsaid} earlier switch(es) of clocks not said" if self._unsaid else "")
        self._said_at, self._unsaid = now_mono, 0

    def stamp(self, pts: float | None, now_mono: int, now_real: int, sender_real: int | None = None) -> tuple[int, int]:
        if sender_real is not None:
            age = now_real - sender_real
            fits = -SENDER_AHEAD_NS <= age <= SENDER_BEHIND_NS
            if self.sender_trusted is None:
                self._choose(fits, age, now_mono)
            elif fits == self.sender_trusted:
                self._against = 0
            else:
                self._against += 1
                if self._against >= SENDER_SWITCH_FRAMES:
                    self._choose(fits, age, now_mono)
            if self.sender_trusted:
                age = min(max(age, 0), SENDER_BEHIND_NS, now_mono)  # (and never before CLOCK_MONOTONIC's zero)
                self.anchor_pts = None  # should the reports stop, the stream's timestamps are anchored afresh
                return now_mono - age, now_real - age
        if pts is None:
            return now_mono, now_real
        if self.anchor_pts is None or pts < self.last_pts:
            self._anchor(pts, now_mono, now_real)
        self.last_pts = pts
        mono = self.anchor_mono + round((pts - self.anchor_pts) * 1e9)
        if mono > now_mono or now_mono - mono > MAX_LAG_NS:
            self._anchor(pts, now_mono, now_real)
            mono = now_mono
        return mono, mono + self.real_offset

    def _anchor(self, pts: float, now_mono: int, now_real: int) -> None:
        self.anchor_pts, self.anchor_mono, self.real_offset = pts, now_mono, now_real - now_mono


class FeedError(RuntimeError):
    """The feed failed; the message is the one line a supervisor's log shows."""


# The ring's pixel formats as ffmpeg names them.
FFMPEG_PIX = {"i420": "yuv420p", "nv12": "nv12", "yuyv": "yuyv422", "bgr24": "bgr24", "rgb24": "rgb24",
              "gray8": "gray", "rgba32": "rgba", "bgra32": "bgra"}
# ffprobe's color_space → the ring's matrix (SMPTE 170M and BT.470BG are BT.601's).
_MATRIX_OF = {"bt709": "bt709", "smpte170m": "bt601", "bt470bg": "bt601", "fcc": "bt601"}


def source_kind(source: str) -> str:
    """file, network or device."""
    if source.startswith("/dev/"):
        return "device"
    if "://" in source and not source.startswith("file:"):
        return "network"
    return "file"


@dataclasses.dataclass(frozen=True)
class FfmpegOptions:
    source: str
    width: int | None = None       # None (with height): the source's own size, no scaling
    height: int | None = None
    pixel_format: str = "i420"     # a YUV format without ":colorimetry" takes the source's
    fps: float | None = None       # None: the source's own rate; 0: as fast as it decodes; N: at most N/s
    frames: int | None = None      # stop after publishing this many
    loop: bool = False             # a file: play it again at its end
    connect_timeout: float = 10.0  # seconds to the first frame after (re)connecting
    read_timeout: float = 5.0      # seconds between frames
    transport: str | None = None   # rtsp: tcp or udp (ffmpeg's default: udp, then tcp)
    hwaccel: str | None = None     # vaapi, cuda, … where this ffmpeg has it
    reconnect: bool | None = None  # None: live sources yes, files no
    backoff_min: float = 0.5
    backoff_max: float = 10.0
    max_reconnects: int | None = None  # None: for as long as it runs
    rtsp_clock: str = "sender"     # rtsp: "sender" (RTCP reports; decoded by PyAV) or "stream" (the ffmpeg program)

    def __post_init__(self):
        if (self.width is None) != (self.height is None):
            raise ValueError("--width and --height: give both (a scaled size) or neither (the source's size)")
        if self.width is not None and not (1 <= self.width <= 16384 and 1 <= self.height <= 16384):
            raise ValueError(f"--width {self.width} --height {self.height}: each must be 1 … 16384")
        ring.parse_pixel_format(self.pixel_format)  # ValueError naming the formats
        base = self.pixel_format.partition(":")[0]
        if base not in FFMPEG_PIX:
            raise ValueError(f"--pixel-format {self.pixel_format}: one of {', '.join(FFMPEG_PIX)}")
        if base in YUV_BASES and self.width is not None and (self.width % 2 or self.height % 2):
            raise ValueError(f"--width {self.width} --height {self.height}: {base} frames need an even width and "
                             "height")
        if self.fps is not None and not 0 <= self.fps <= 1000:
            raise ValueError(f"--fps {self.fps}: 0 (as fast as it decodes) … 1000")
        if self.frames is not None and self.frames < 1:
            raise ValueError(f"--frames {self.frames}: must be at least 1")
        for name in ("connect_timeout", "read_timeout", "backoff_min", "backoff_max"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')}: must be more than 0 seconds")
        if self.transport not in (None, "tcp", "udp"):
            raise ValueError(f"--transport {self.transport}: tcp or udp")
        if self.rtsp_clock not in RTSP_CLOCKS:
            raise ValueError(f"--rtsp-clock {self.rtsp_clock}: one of {', '.join(RTSP_CLOCKS)}")

    @property
    def kind(self) -> str:
        return source_kind(self.source)

    @property
    def reconnects(self) -> bool:
        return self.kind != "file" if self.reconnect is None else self.reconnect

    @property
    def rtsp(self) -> bool:
        return self.source.startswith(("rtsp://", "rtsps://"))

    @property
    def ffmpeg_pix_fmt(self) -> str:
        """The output's pixel format as FFmpeg names it."""
        return FFMPEG_PIX[self.pixel_format.partition(":")[0]]

    @property
    def pyav(self) -> bool:
        """Decoded by avdecode.py (PyAV, which reads the RTCP sender reports): RTSP with the sender's clock; else
        by the ffmpeg program."""
        return self.rtsp and self.rtsp_clock == "sender"


def find_ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        raise FeedError("ffmpeg is not installed (Debian: apt install ffmpeg)")
    return path


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


def _input_options(o: FfmpegOptions, timeout_s: float) -> dict[str, str]:
    """FFmpeg's input options for the source (the program's, ffprobe's and the PyAV decoder's): a network
    source's socket I/O timeout (our own watchdog stands behind it) and RTSP transport."""
    us = str(int(timeout_s * 1e6))
    if o.rtsp:
        return {"timeout": us, **({"rtsp_transport": o.transport} if o.transport else {})}
    return {"rw_timeout": us} if o.kind == "network" else {}


def _as_flags(options: dict[str, str]) -> list[str]:
    return [x for key, value in options.items() for x in (f"-{key}", value)]


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


@dataclasses.dataclass(frozen=True)
class Output:
    """What the ring holds: the frame size and the pixel format with its colorimetry."""
    width: int
    height: int
    pixel_format: str


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


def output_of(o: FfmpegOptions, src: dict | None) -> Output:
    """The ring's geometry: the asked size or the source's; the source's colorimetry for a YUV format given
    without one. src: the source's width, height, color_space, color_range, pix_fmt (ffprobe's names; showinfo
    says the same of the first frame)."""
    w, h = (o.width, o.height) if o.width is not None else (int(src["width"]), int(src["height"]))
    fmt = o.pixel_format
    base = fmt.partition(":")[0]
    if takes_source_colour(fmt):
        src = src or {}
        matrix = _MATRIX_OF.get(src.get("color_space", ""), "bt709" if int(src.get("height") or h) >= 720
                                else "bt601")
        # Full range only where the frames stay full: the ffmpeg program squeezes a JPEG-range decode (yuvj420p:
        # MJPEG, full-range H.264) into limited range on its way to yuv420p/nv12/yuyv; the PyAV decoder reports
        # the format and range it delivers.
        full = src.get("color_range") == "pc" and not str(src.get("pix_fmt", "")).startswith("yuvj")
        colour = matrix + ("-full" if full else "")
        fmt = base if colour == "bt601" else f"{base}:{colour}"
    if base in YUV_BASES and (w % 2 or h % 2):
        raise FeedError(f"the source's {w}x{h}: {base} frames need an even width and height (give an even "
                        "--width/--height to scale to)")
    return Output(w, h, fmt)


def asked_range(o: FfmpegOptions) -> str | None:
    """"full" or "limited" where the ring's YUV colorimetry is given (the frames are then converted to it, so
    they hold what the ring says); None where it is the source's."""
    base, _, colour = o.pixel_format.partition(":")
    if base not in YUV_BASES or takes_source_colour(o.pixel_format):
        return None
    return "full" if colour.endswith("-full") else "limited"


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
    args = [sys.executable, "-m", "edgeinfer.producers.avdecode"]
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


# ffmpeg's words → the one line a supervisor reads (first match wins).
_REASONS = [
    ("No such file or directory", "no such file"),
    ("Permission denied", "permission denied"),
    ("matches no streams", "no video stream in the source"),
    ("no video stream in the source", "no video stream in the source"),
    ("does not contain any stream", "no video stream in the source"),
    ("401 Unauthorized", "unauthorized (401): wrong or missing credentials"),
    ("403 Forbidden", "forbidden (403)"),
    ("404 Not Found", "not found (404)"),
    ("Connection refused", "connection refused"),
    ("Connection timed out", "connection timed out"),
    ("No route to host", "no route to host"),
    ("Name or service not known", "unknown host"),
    ("Network is unreachable", "network unreachable"),
    ("Invalid data found when processing input", "not a video ffmpeg can decode (invalid data)"),
    ("Error while decoding", "decoder error"),
]


def explain(stderr_lines: list[str], returncode: int | None, who: str = "ffmpeg") -> str:
    """One line for a failed ffmpeg (or `who`): the reason it gave, in our words, with its own last line."""
    text = "\n".join(stderr_lines)
    last = stderr_lines[-1].strip() if stderr_lines else ""
    for needle, reason in _REASONS:
        if needle in text:
            return f"{reason} ({who}: {last})" if last else reason
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{who} was killed by {name}"
    if returncode is None:  # its output ended but it did not exit: stopped by us
        return f"{who}'s output ended and it did not exit{f' ({last})' if last else ''}"
    if last:
        return f"{who} failed (exit {returncode}): {last}"
    return f"{who} exited {returncode} without a frame"


class _Ffmpeg:
    """One ffmpeg child: its stdout read without blocking for more than POLL_S, its stderr kept (the last
    lines) by a thread, which also takes each frame's pts (showinfo's lines) and the first frame's geometry."""
    who = "ffmpeg"  # in the lines that say why it failed

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                     start_new_session=True)  # a terminal's Ctrl-C reaches us, not it
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)  # warnings and errors, level tag off
        # Each frame's (pts in seconds, the sender's wall clock in ns), either None where unknown; frame order.
        self.stamps: collections.deque = collections.deque(maxlen=4096)
        self.first: dict | None = None  # the first frame as decoded: pix_fmt, width, height, colour
        self._first: dict | None = None  # (its frame line, until its colour line completes `first`)
        self._pts_seen = threading.Condition()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        self.poller = select.poll()
        self.poller.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP)

    def _drain(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            self._line(raw.decode(errors="replace").rstrip())
        with self._pts_seen:
            self._pts_seen.notify_all()

    def _line(self, line: str) -> None:
        m = _LEVELLED.match(line)
        context, level, msg = (m.group(1) or "", m.group(2), m.group(3)) if m else ("", "", line)
        if context.startswith("[Parsed_showinfo"):
            is_frame, pts = _showinfo_pts(msg)
            if is_frame:  # None (no timestamp) too: the frame is then stamped on arrival, without waiting
                g = _SHOWINFO_GEOMETRY.search(msg) if self.first is None else None
                if g:
                    self._first = {"pix_fmt": g.group(1), "width": g.group(2), "height": g.group(3)}
                self._stamp(pts, None)
            elif self.first is None and self._first is not None:  # the first frame's colour line
                c = _SHOWINFO_COLOUR.search(msg)
                with self._pts_seen:
                    self.first = {**self._first, **({"color_range": c.group(1), "color_space": c.group(2)}
                                                    if c else {})}
                    self._pts_seen.notify_all()
        elif level not in ("info", "verbose", "debug", "trace"):  # problems, and lines without a level
            self.stderr.append(context + msg)


    def _stamp(self, pts: float | None, wall_ns: int | None) -> None:
        with self._pts_seen:
            self.stamps.append((pts, wall_ns))
            self._pts_seen.notify()

    def first_frame(self, deadline: float, stop) -> dict | str:
        """What showinfo said of the first frame (before its bytes leave ffmpeg); or "stopped", "timeout", or
        "eof" (ffmpeg's stderr ended: it exited without a frame)."""
        with self._pts_seen:
            while self.first is None:
                if stop():
                    return "stopped"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                if not self._thread.is_alive():
                    return self._first or "eof"  # a frame line without its colour line: take what we have
                self._pts_seen.wait(min(left, POLL_S))
            return self.first

    def next_stamp(self, wait_s: float = PTS_WAIT_S) -> tuple[float | None, int | None]:
        """(pts in seconds, the sender's wall clock in ns) of the frame just read: its line is written before
        the frame's bytes, but the two pipes are read by two threads, so it may take a moment to arrive.
        (None, None) if it does not."""
        with self._pts_seen:
            if not self.stamps:
                self._pts_seen.wait(wait_s)
            return self.stamps.popleft() if self.stamps else (None, None)  # no line came in time

    def read_frame(self, view: memoryview, deadline: float, stop) -> str:
        """Fills `view`: "frame"; or "eof", "stopped", "timeout" (nothing for the deadline)."""
        got = 0
        while got < len(view):
            if stop():
                return "stopped"
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            if not self.poller.poll(min(left, POLL_S) * 1000):
                continue
            k = self.proc.stdout.readinto(view[got:])
            if k is None:
                continue  # woken without data
            if k == 0:
                return "eof"
            got += k
        return "frame"

    def finish(self, ended: bool) -> int | None:
        """Stops ffmpeg (if it still runs) and returns how it ended: its exit status, or None if we stopped it.
        ended: its output ended, so it is exiting by itself: given EXIT_WAIT_S to say why. Else SIGKILL, not
        SIGTERM: nothing of its output is wanted any more, and ffmpeg stuck in a connect can take seconds to
        honour SIGTERM, which a stop must not wait for."""
        if ended:
            try:
                self.proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            code = None
        else:
            code = self.proc.returncode
        self._thread.join(1.0)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


class _AvDecoder(_Ffmpeg):
    """The PyAV decoder child (avdecode.py): the same stdout, and its own stderr lines (its docstring)."""
    who = "the RTSP decoder (PyAV)"

    def _line(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        try:
            if kind == "frame":
                pts, wall = rest.split(" ")
                pts = None if pts == "-" else float(pts)
                self._stamp(pts if pts is not None and math.isfinite(pts) else None, None if wall == "-" else int(wall))
                return
            if kind == "first":
                fmt, w, h, rng, space = rest.split(" ")
                geometry = {"pix_fmt": fmt, "width": str(int(w)), "height": str(int(h)),
                            **{k: v for k, v in (("color_range", rng), ("color_space", space)) if v != "unknown"}}
                with self._pts_seen:
                    self.first = self.first or geometry
                    self._pts_seen.notify_all()
                return
        except ValueError:
            pass  # not a line of ours after all: kept below, as it is
        if kind in ("error", "log"):
            self.stderr.append(rest.partition(" ")[2] if kind == "log" else rest)
        else:  # not ours (a Python error, a malformed line): kept as it is
            self.stderr.append(line)


def _say_to_stderr(msg: str) -> None:
    print(f"edgeinferctl: {msg}", file=sys.stderr, flush=True)


def run(o: FfmpegOptions, stream: str, *, socket: str = ring.INGRESS_SOCKET, wait: float = 10.0,
        stop=lambda: False, say=_say_to_stderr, note=_say_to_stderr, on_publish=lambda n: None,
        on_ring=lambda out: None) -> int:
    """Publishes the source's frames as `stream` until its end (a file), `frames`, or stop(); returns the count.
    Raises FeedError when the source fails and is not (or no longer) reconnected. say(line) hears each
    reconnection; note(line) what stamps the frames (the sender's clock, or why not); on_publish(count) each frame
    (a camera unit's READY and watchdog); on_ring(Output) the ring's geometry when it is made."""
    pyav = o.pyav
    ffmpeg = None if pyav else find_ffmpeg()
    if o.hwaccel:
        check_hwaccel(ffmpeg, o.hwaccel)
    if o.kind == "file":
        check_file(ffmpeg, o.source)
    # The ring's geometry: known now when a size and (for YUV) a colorimetry were given, else from what
    # showinfo says of the first frame (no second connection to the source to ask).
    known = o.width is not None and not takes_source_colour(o.pixel_format)
    out = output_of(o, None) if known else None
    writer = report = None

    def open_ring(first: Output) -> None:
        nonlocal writer, report, frame_bytes
        writer = ring.FrameWriter.connect(stream, first.width, first.height, first.pixel_format, socket=socket,
                                          wait=wait)
        on_ring(first)
        report = ConnectionReporter(writer)
        frame_bytes = writer.layout["frame_bytes"]
    frame_bytes = 0
    if out is not None:
        open_ring(out)
    args, decoder = (avdecode_args(o), _AvDecoder) if pyav else (ffmpeg_args(ffmpeg, o), _Ffmpeg)
    period = 1.0 / o.fps if o.fps else 0.0
    clock = StreamClock()
    published = decoded = reconnects = 0
    backoff = o.backoff_min
    last_published = -1e9
    last_frame: float | None = None  # monotonic time of the source's last frame (None: none yet)
    child = None
    try:
        while True:
            child = decoder(args)
            clock.reset()  # a new connection's timestamps start anew
            deadline = time.monotonic() + o.connect_timeout
            frames_this_time = 0
            got = "frame"
            if not known:  # the source's size and colour, from its first frame
                first = child.first_frame(deadline, stop)
                if isinstance(first, dict):
                    now_out = output_of(o, first)
                    if writer is None:
                        open_ring(now_out)
                    elif now_out != out:  # (a ring's geometry is sealed: systemd restarts the camera anew)
                        raise FeedError(f"{o.source}: the source came back as {now_out.width}x{now_out.height} "
                                        f"{now_out.pixel_format}, its ring holds {out.width}x{out.height} "
                                        f"{out.pixel_format}: restart the feed")
                    out = now_out
                else:
                    got = first
            while got == "frame":
                view = memoryview(writer.begin_flat())[:frame_bytes]
                got = child.read_frame(view, deadline, stop)
                if got != "frame":
                    break
                pts, sender_ns = child.next_stamp()
                capture_ns, capture_real_ns = clock.stamp(pts, ring.monotonic_ns(), time.time_ns(), sender_ns)
                if clock.notice:
                    note(f"stream {stream}: {clock.notice}")
                    clock.notice = None
                decoded += 1
                frames_this_time += 1
                now = last_frame = time.monotonic()
                deadline = now + o.read_timeout
                if period and now - last_published < period * 0.98:
                    continue  # over the fps limit: dropped (the slot is written again)
                last_published = now
                # The frame's position in what the source sent, and its time from the stream's timestamps.
                writer.publish(capture_ns, frame_id=decoded, realtime_ns=capture_real_ns)
                report()
                published += 1
                on_publish(published)
                if o.frames is not None and published >= o.frames:
                    got = "done"
                    break
            code = child.finish(ended=got == "eof")
            if got in ("stopped", "done"):
                return published
            if got == "eof" and code == 0 and o.kind == "file" and frames_this_time:
                return published  # the end of the file
            if got == "timeout":
                what = "the first frame" if not frames_this_time else "a frame"
                limit = o.connect_timeout if not frames_this_time else o.read_timeout
                reason = f"no frame from {o.source}: waited {limit:g} s for {what} (a silent source)"
            elif got == "eof" and code == 0:
                reason = f"{o.source}: the source ended" if frames_this_time else \
                    f"{o.source}: {explain(list(child.stderr), code, child.who)}"
            else:
                reason = f"{o.source}: {explain(list(child.stderr), code, child.who)}"
            if frames_this_time:
                backoff = o.backoff_min  # it worked for a while: start the backoff again
            if not o.reconnects or (o.max_reconnects is not None and reconnects >= o.max_reconnects):
                raise FeedError(reason + (f" (after {reconnects} reconnections)" if reconnects else ""))
            reconnects += 1
            delay = retry_delay(backoff, None if last_frame is None else time.monotonic() - last_frame)
            say(f"stream {stream}: {reason}; reconnecting in {delay:g} s (reconnection {reconnects})")
            end = time.monotonic() + delay
            while time.monotonic() < end:
                if stop():
                    return published
                time.sleep(min(POLL_S, max(end - time.monotonic(), 0)))
            backoff = min(backoff * 2, o.backoff_max)
    finally:
        if child is not None and child.proc.poll() is None:  # an error on the way: the decoder goes with us
            child.finish(ended=False)
        if writer is not None:
            writer.close()
