"""The ffmpeg producer (feed.py); its names, as importers have used them."""
from edgeinfer.cameras.ffmpeg.feed import (  # noqa: F401
    EXIT_WAIT_S, FFMPEG_PIX, MAX_LAG_NS, NOTICE_INTERVAL_NS, POLL_S, PTS_WAIT_S, RETRY_UP_S, SENDER_AHEAD_NS,
    SENDER_BEHIND_NS, SENDER_SWITCH_FRAMES, UP_RECENTLY_S, FeedError, FfmpegOptions, Output, StreamClock,
    asked_range, avdecode_args, check_file, check_hwaccel, explain, ffmpeg_args, find_ffmpeg, output_of, probe,
    retry_delay, run, source_kind)
