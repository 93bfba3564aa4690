"""The feed: a decoder child per connection, each frame stamped (StreamClock) and published into the ring,
and the reconnect loop with its backoff (the package's docstring says what a supervisor can rely on)."""
from __future__ import annotations

import sys
import time

from edgeinfer.abi import ring
from edgeinfer.abi.vocabulary import takes_source_colour
from edgeinfer.cameras.connection import ConnectionReporter
from edgeinfer.cameras.ffmpeg.child import POLL_S, _AvDecoder, _Ffmpeg
from edgeinfer.cameras.ffmpeg.clock import StreamClock
from edgeinfer.cameras.ffmpeg.cmdline import avdecode_args, ffmpeg_args
from edgeinfer.cameras.ffmpeg.errors import FeedError, explain
from edgeinfer.cameras.ffmpeg.ffprobe import check_file, check_hwaccel, find_ffmpeg, find_pyav
from edgeinfer.cameras.ffmpeg.options import FfmpegOptions
from edgeinfer.cameras.ffmpeg.output import Output, output_of

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
    ffmpeg = find_pyav() if pyav else find_ffmpeg()
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
