"""What the ring holds: the frame size and the pixel format with its colorimetry, from the options and
what the source says of itself."""
from __future__ import annotations

import dataclasses

from edgeinfer.abi.vocabulary import YUV_BASES, takes_source_colour
from edgeinfer.cameras.ffmpeg.errors import FeedError
from edgeinfer.cameras.ffmpeg.options import FfmpegOptions

# ffprobe's color_space → the ring's matrix (SMPTE 170M and BT.470BG are BT.601's).
_MATRIX_OF = {"bt709": "bt709", "smpte170m": "bt601", "bt470bg": "bt601", "fcc": "bt601"}


@dataclasses.dataclass(frozen=True)
class Output:
    """What the ring holds: the frame size and the pixel format with its colorimetry."""
    width: int
    height: int
    pixel_format: str


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
