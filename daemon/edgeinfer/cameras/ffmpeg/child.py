"""The decoder child: one ffmpeg program (or the PyAV decoder) run for one connection, its frames read from
its stdout straight into the slot, its stderr read by a thread for each frame's timestamp, the first frame's
geometry and the lines that say why it failed."""
from __future__ import annotations

import collections
import math
import os
import re
import select
import subprocess
import threading
import time

POLL_S = 0.1  # the longest stop() waits for us
EXIT_WAIT_S = 2.0  # for ffmpeg to exit (and say why) once its output ended
PTS_WAIT_S = 0.2   # for the frame's pts line (stderr) once its bytes (stdout) are in


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
