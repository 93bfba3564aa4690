"""The stream clock: each frame's capture time, from the sender's wall clock, the stream's own timestamps, or
its arrival."""
from __future__ import annotations

MAX_LAG_NS = 2_000_000_000  # a frame stamped this far behind its arrival re-anchors the stream clock
SENDER_AHEAD_NS = 100_000_000  # a sender's clock ahead of ours by up to this is clock error: stamped at arrival
SENDER_BEHIND_NS = MAX_LAG_NS  # older by the sender's clock: the clock is wrong (no stamp goes further back)
SENDER_SWITCH_FRAMES = 25  # frames in a row on the other side of those bounds before the clock is switched
NOTICE_INTERVAL_NS = 60_000_000_000  # a switch of clocks is said at most this often (the others counted)


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
