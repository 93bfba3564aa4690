"""The producer's StreamClock on its own (the RTSP and file tests drive it end to end): which clock stamps a frame,
and what a sender whose clock disagrees with ours can and cannot do to the stamps. Times are made up here (ns on
our clocks), so every case is exact."""
from __future__ import annotations

from edgeinfer.cameras.ffmpeg import (MAX_LAG_NS, NOTICE_INTERVAL_NS, SENDER_AHEAD_NS, SENDER_BEHIND_NS,
                                         SENDER_SWITCH_FRAMES, StreamClock)

MONO, REAL = 5_000_000_000_000, 1_795_000_000_000_000_000  # "now" on CLOCK_MONOTONIC and CLOCK_REALTIME
MS = 1_000_000


def test_a_sender_clock_in_bounds_stamps_the_frame_and_is_said_once():
    clock = StreamClock()
    assert clock.stamp(1.0, MONO, REAL, REAL - 80 * MS) == (MONO - 80 * MS, REAL - 80 * MS)
    assert "sender's clock" in clock.notice and "80 ms old" in clock.notice
    clock.notice = None
    assert clock.stamp(1.04, MONO + 40 * MS, REAL + 40 * MS, REAL - 30 * MS) == (MONO - 30 * MS, REAL - 30 * MS)
    assert clock.notice is None  # said once per connection
    clock.reset()
    clock.stamp(0.0, MONO, REAL, REAL - 10 * MS)
    assert clock.notice  # a new connection says it again


def test_a_sender_slightly_ahead_is_stamped_at_arrival_never_in_the_future():
    clock = StreamClock()
    assert clock.stamp(1.0, MONO, REAL, REAL + SENDER_AHEAD_NS) == (MONO, REAL)


def test_a_sender_clock_out_of_bounds_is_refused_once_and_the_stream_clock_stamps():
    for off in (SENDER_AHEAD_NS + 50 * MS, -SENDER_BEHIND_NS - 50 * MS, 3600 * 10**9, -(10**18)):  # past jitter
        clock = StreamClock()
        first = clock.stamp(10.0, MONO, REAL, REAL + off)
        assert first == (MONO, REAL)  # anchored on this frame, as if there were no reports
        assert "off ours" in clock.notice and "stream's own timestamps" in clock.notice
        clock.notice = None
        # 40 ms of stream later, arriving 5 ms late: stamped by its pts, not by the sender, and nothing said again
        sender = REAL + off + 40 * MS  # (the sender's clock runs on as ours does)
        assert clock.stamp(10.04, MONO + 45 * MS, REAL + 45 * MS, sender) == (MONO + 40 * MS, REAL + 40 * MS)
        assert clock.notice is None


def test_the_stream_clock_takes_over_afresh_when_the_reports_stop():
    clock = StreamClock()
    clock.stamp(1.0, MONO, REAL)  # anchored on the stream before the first report
    clock.stamp(1.04, MONO + 40 * MS, REAL + 40 * MS, REAL - 500 * MS)  # the reports' clock
    # no report any more, 10 s of stream later: anchored on this frame, not on the stale anchor 10 s back
    later = MONO + 10_040 * MS
    assert clock.stamp(11.04, later, REAL + 10_040 * MS) == (later, REAL + 10_040 * MS)


def test_without_reports_frames_are_stamped_by_pts_within_the_lag_bound():
    clock = StreamClock()
    clock.stamp(0.0, MONO, REAL)
    assert clock.stamp(0.04, MONO + 47 * MS, REAL + 47 * MS)[0] == MONO + 40 * MS  # decode jitter not in the stamp
    far = MONO + 80 * MS + MAX_LAG_NS + 1 * MS  # a stall: this frame would be stamped too far back
    assert clock.stamp(0.08, far, REAL)[0] == far


def test_a_clock_at_a_bound_does_not_flip_the_stamps_and_switches_are_said_once_a_minute():
    """A camera whose clock wanders across a bound: the choice holds until SENDER_SWITCH_FRAMES frames in a row
    say otherwise (meanwhile the trusted clock's outliers are clamped into the bounds), and a switch back within
    NOTICE_INTERVAL_NS of the last notice is counted, not said."""
    clock = StreamClock()
    now, real = MONO, REAL
    clock.stamp(0.0, now, real, real - 80 * MS)
    assert clock.sender_trusted and clock.notice
    clock.notice = None
    ahead = 3600 * 10**9
    for k in range(1, SENDER_SWITCH_FRAMES):  # an hour ahead, but not yet for long enough: clamped to arrival
        now, real = now + 40 * MS, real + 40 * MS
        assert clock.stamp(k * 0.04, now, real, real + ahead) == (now, real)
        assert clock.sender_trusted and clock.notice is None
    now, real = now + 40 * MS, real + 40 * MS
    clock.stamp(1.0, now, real, real + ahead)
    assert clock.sender_trusted is False and clock.notice is None  # switched; said 1 s after the last: not said
    for k in range(SENDER_SWITCH_FRAMES):  # back in bounds, 61 s later
        now, real = now + NOTICE_INTERVAL_NS // SENDER_SWITCH_FRAMES + MS, real + 61 * 10**9 // SENDER_SWITCH_FRAMES
        clock.stamp(2.0 + k, now, real, real - 50 * MS)
    assert clock.sender_trusted and "stamped by the sender's clock" in clock.notice
    assert "1 earlier switch(es) of clocks not said" in clock.notice


def test_a_trusted_clock_never_stamps_before_monotonic_zero():
    """Just after boot CLOCK_MONOTONIC is small: a frame 1.5 s old by the sender's clock at 0.5 s of uptime is
    stamped at 0, not at a negative time (the ring's capture time is unsigned)."""
    clock = StreamClock()
    assert clock.stamp(0.0, 500 * MS, REAL, REAL - 1500 * MS) == (0, REAL - 500 * MS)
