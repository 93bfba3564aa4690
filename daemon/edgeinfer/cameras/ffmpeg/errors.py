"""How the feed fails: FeedError, and ffmpeg's words (or its exit) turned into the one line a supervisor
reads."""
from __future__ import annotations

import signal


class FeedError(RuntimeError):
    """The feed failed; the message is the one line a supervisor's log shows."""


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
