"""edgeinferd's log lines: one line per event, with its syslog priority under systemd."""
from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class JournalFormatter(logging.Formatter):
    """One line per event. Under systemd (JOURNAL_STREAM set) each line starts with
    its syslog priority, `<3>` … `<7>`, which journald turns into PRIORITY=; the
    journal adds the time. Elsewhere: an ISO timestamp and the level name."""

    def __init__(self, journald: bool):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace("\n", " | ")  # one event, one line
        if record.exc_info:
            msg += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        if self.journald:
            return f"<{_PRIORITY.get(record.levelno, 6)}>{record.name}: {msg}"
        return f"{self.formatTime(record)} {record.levelname} {record.name}: {msg}"


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter(bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
