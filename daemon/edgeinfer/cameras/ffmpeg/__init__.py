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

Its modules, in the order a feed uses them, one job each: docs/architecture.md, "Module map". The names below are the
package's: importers use `edgeinfer.cameras.ffmpeg`.
"""
from edgeinfer.cameras.ffmpeg.child import EXIT_WAIT_S, POLL_S, PTS_WAIT_S  # noqa: F401
from edgeinfer.cameras.ffmpeg.clock import (  # noqa: F401
    MAX_LAG_NS, NOTICE_INTERVAL_NS, SENDER_AHEAD_NS, SENDER_BEHIND_NS, SENDER_SWITCH_FRAMES, StreamClock)
from edgeinfer.cameras.ffmpeg.cmdline import avdecode_args, ffmpeg_args  # noqa: F401
from edgeinfer.cameras.ffmpeg.errors import FeedError, explain  # noqa: F401
from edgeinfer.cameras.ffmpeg.feed import RETRY_UP_S, UP_RECENTLY_S, retry_delay, run  # noqa: F401
from edgeinfer.cameras.ffmpeg.ffprobe import check_file, check_hwaccel, find_ffmpeg, find_pyav, probe  # noqa: F401
from edgeinfer.cameras.ffmpeg.options import FFMPEG_PIX, FfmpegOptions, source_kind  # noqa: F401
from edgeinfer.cameras.ffmpeg.output import Output, asked_range, output_of  # noqa: F401
