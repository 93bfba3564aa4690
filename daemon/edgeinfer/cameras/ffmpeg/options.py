"""The feed's options (FfmpegOptions), checked when made, and what kind of source it reads."""
from __future__ import annotations

import dataclasses

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import RTSP_CLOCKS, YUV_BASES

# The ring's pixel formats as ffmpeg names them.
FFMPEG_PIX = {"i420": "yuv420p", "nv12": "nv12", "yuyv": "yuyv422", "bgr24": "bgr24", "rgb24": "rgb24",
              "gray8": "gray", "rgba32": "rgba", "bgra32": "bgra"}


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
