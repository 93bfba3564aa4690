"""An RTSP source decoded with PyAV (FFmpeg's libraries in-process), for the sender's wall clock.

The ffmpeg program does not say what the RTCP sender reports say: libavformat turns each report's
NTP/RTP pair into a wall clock per packet (AV_PKT_DATA_PRFT, "producer reference time") and the
program drops it. This child reads it, and otherwise does what the ffmpeg program does for the
producer (daemon/edgeinfer/cameras/ffmpeg/ runs it in its place for rtsp:// sources):

    python -m edgeinfer.cameras.avdecode --option rtsp_transport=tcp … [--size WxH] PIX_FMT URL

stdout: each frame's bytes, rows packed, in PIX_FMT (ffmpeg's name) and the asked size, else the
        source's; scaled and converted only when asked (--size, --range) or the format differs, by the
        scale filter as the ffmpeg program runs it. A JPEG-range source keeps its range unless --range.
stderr: one line per event, each written before the bytes of the frame it is about:
    first PIX_FMT W H RANGE SPACE   the first frame: the format and range delivered, the source's size and
                                    matrix (ffprobe's names: yuv420p, tv, bt709 …)
    frame PTS WALL                  its pts in seconds and the sender's wall clock in ns since the
                                    epoch, "-" for either that is not known (no report yet)
    error MESSAGE                   why it fails, FFmpeg's words, before exit status 1
    log LEVEL MESSAGE               FFmpeg's warnings and errors
The end of the stream exits 0.

Why a child and not a thread of the producer: a read blocked in libavformat cannot be cut short
from outside it, and the producer must stop within 0.1 s (a killed child always does); and a
decoder that crashes on a hostile stream ends this process, not the producer, which reconnects.
"""
from __future__ import annotations

import argparse
import logging
import os
import struct
import sys

import av
import av.filter
import av.logging

# Bytes per sample of each plane (a plane's width is in its own samples: nv12's chroma plane is half the width
# of U,V pairs), by format.
_SAMPLE_BYTES = {"yuv420p": (1, 1, 1), "nv12": (1, 2), "yuyv422": (2,), "bgr24": (3,), "rgb24": (3,), "gray": (1,),
                 "rgba": (4,), "bgra": (4,)}
# FFmpeg's AVColorRange and AVColorSpace codes, by ffprobe's names.
_RANGE = {1: "tv", 2: "pc"}
_SPACE = {1: "bt709", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 9: "bt2020nc", 10: "bt2020c"}
_PRFT = struct.Struct("<q")  # AVProducerReferenceTime.wallclock: µs since the Unix epoch (its flags follow)
_MAX_PENDING = 256  # packets' wall clocks waiting for their frames (a decoder holds a few)


def _say(*words) -> None:
    sys.stderr.write(" ".join(str(w) for w in words).replace("\n", " ") + "\n")
    sys.stderr.flush()


class _FfmpegLog(logging.Handler):
    """FFmpeg's warnings and errors (PyAV hands them to Python's logging) as "log" lines."""

    def emit(self, record: logging.LogRecord) -> None:
        _say("log", record.levelname.lower(), record.getMessage())


def _wall_ns(packet) -> int | None:
    """The sender's wall clock for this packet, from the RTCP sender reports; None before the first one."""
    if not packet.has_sidedata("prft"):
        return None
    return _PRFT.unpack_from(bytes(packet.get_sidedata("prft")))[0] * 1000


def _write_packed(out, frame) -> None:
    """The frame's planes, rows without their padding, in one go when a plane has none."""
    for plane, sample_bytes in zip(frame.planes, _SAMPLE_BYTES[frame.format.name]):
        row = plane.width * sample_bytes
        data = memoryview(plane)
        if plane.line_size == row:
            out.write(data[:row * plane.height])
        else:
            for y in range(plane.height):
                out.write(data[y * plane.line_size:y * plane.line_size + row])


class _Convert:
    """Each frame at the asked size, pixel format and range, by FFmpeg's scale filter (a filter graph, as the
    ffmpeg program runs it, so both decoders give the same bytes); a frame already so passes untouched. What the
    first frame delivered (its size, its range) is then kept: a source that changes mid-stream is scaled back to
    it, as the program does (-autoscale), since the ring's frames are all one size."""

    _YUV = ("yuv420p", "nv12", "yuyv422")

    def __init__(self, pix_fmt: str, size: tuple[int, int] | None, out_range: str | None):
        self.pix_fmt, self.size, self.out_range = pix_fmt, size, out_range
        self.graph = None
        self.source = None  # (width, height, format, range, matrix) of the frames the graph is set up for

    def _passes(self, frame) -> bool:
        if frame.format.name != self.pix_fmt or self.size != (frame.width, frame.height):
            return False
        full = frame.color_range == 2  # (unspecified: limited, as players assume)
        return self.out_range is None or (self.out_range == "full") == full

    def _build(self, frame):
        graph = av.filter.Graph()
        # The source described by this frame, range and matrix included (a frame that differs from its buffer's
        # description makes FFmpeg warn on every frame).
        tb = frame.time_base
        src = [f"video_size={frame.width}x{frame.height}", f"pix_fmt={frame.format.name}",
               f"time_base={tb.numerator}/{tb.denominator}" if tb else "time_base=1/90000", "pixel_aspect=1/1"]
        src += [f"range={_RANGE[frame.color_range]}"] if frame.color_range in _RANGE else []
        src += [f"colorspace={_SPACE[frame.colorspace]}"] if frame.colorspace in _SPACE else []
        scale = [f"w={self.size[0]}", f"h={self.size[1]}"] if self.size != (frame.width, frame.height) else []
        scale += [f"out_range={self.out_range}"] if self.out_range else []
        chain = [graph.add("buffer", ":".join(src)), *([graph.add("scale", ":".join(scale))] if scale else []),
                 graph.add("format", self.pix_fmt), graph.add("buffersink")]
        for a, b in zip(chain, chain[1:]):
            a.link_to(b)
        graph.configure()
        return graph

    def __call__(self, frame):
        source = (frame.width, frame.height, frame.format.name, frame.color_range, frame.colorspace)
        if source != self.source:
            if self.size is None:
                self.size = (frame.width, frame.height)
            self.source = source
            self.graph = None if self._passes(frame) else self._build(frame)
        if self.graph is not None:
            self.graph.push(frame)
            frame = self.graph.pull()
        if self.out_range is None and self.pix_fmt in self._YUV:  # the first frame's range is the ring's
            self.out_range = "full" if frame.color_range == 2 else "limited"
        return frame


def decode(source: str, options: dict[str, str], pix_fmt: str, size: tuple[int, int] | None,
           out_range: str | None, hwaccel: str | None, out) -> None:
    accel = None
    if hwaccel:
        from av.codec.hwaccel import HWAccel
        accel = HWAccel(device_type=hwaccel, allow_software_fallback=False)
    with av.open(source, options=options, hwaccel=accel) as container:
        stream = next((s for s in container.streams if s.type == "video"), None)
        if stream is None:
            raise LookupError(f"{source}: no video stream in the source")
        stream.thread_type = "AUTO"  # frame and slice threads, as the ffmpeg program decodes
        convert = _Convert(pix_fmt, size, out_range)
        wall_of: dict[int, int] = {}
        first = True
        for packet in container.demux(stream):
            wall = _wall_ns(packet) if packet.pts is not None else None
            if wall is not None:
                wall_of[packet.pts] = wall
                if len(wall_of) > _MAX_PENDING:
                    del wall_of[next(iter(wall_of))]
            try:
                decoded = packet.decode()
            except av.FFmpegError as e:  # a damaged packet: said, and the stream goes on (as the program does)
                _say("log", "warning", f"decoder: {e}")
                continue
            for frame in decoded:
                pts = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
                wall = wall_of.pop(frame.pts, None) if frame.pts is not None else None
                src_w, src_h, space = frame.width, frame.height, frame.colorspace
                frame = convert(frame)
                if first:  # what the ring will hold: the delivered format and range; the source's size and matrix
                    _say("first", frame.format.name, src_w, src_h, _RANGE.get(frame.color_range, "unknown"),
                         _SPACE.get(space, "unknown"))
                    first = False
                _say("frame", "-" if pts is None else repr(pts), "-" if wall is None else wall)
                _write_packed(out, frame)
                out.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgeinfer.cameras.avdecode")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="FFmpeg's input options")
    p.add_argument("--size", metavar="WxH")
    p.add_argument("--range", choices=["limited", "full"], help="convert to this range (default: keep the source's)")
    p.add_argument("--hwaccel")
    p.add_argument("pix_fmt", choices=sorted(_SAMPLE_BYTES))
    p.add_argument("source")
    a = p.parse_args(argv)
    log = logging.getLogger("libav")
    log.addHandler(_FfmpegLog())
    log.propagate = False
    av.logging.set_level(av.logging.WARNING)
    size = tuple(int(x) for x in a.size.split("x")) if a.size else None
    try:
        decode(a.source, dict(o.split("=", 1) for o in a.option), a.pix_fmt, size, a.range, a.hwaccel,
               sys.stdout.buffer)
    except BrokenPipeError:
        return 0  # the producer stopped reading: it stops us
    except (av.FFmpegError, LookupError) as e:  # FFmpeg's words (the producer matches them to its reasons)
        _say("error", e)
        return 1
    except Exception as e:  # anything else still ends in one line, not a traceback
        _say("error", f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown while FFmpeg's threads may still hold the stdout pipe
