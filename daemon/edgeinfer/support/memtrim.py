"""Giving freed heap back to the kernel after a model swap.

A reload frees the old model's graph, bundle bytes and ORT session, but glibc
keeps the freed pages in its arenas: without a trim, every reload ratchets the
RSS an operator sees up by tens of MiB (measured in the soak test), although
nothing leaks. Called on the main thread, a few seconds after a swap.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time

# After a model swap, when to trim: once the loop has let go of the old version (control plane and lanes alike).
TRIM_DELAY_S = 3.0

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _malloc_trim = _libc.malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
except (OSError, AttributeError):  # not glibc: nothing to trim with
    _malloc_trim = None


def release_freed_memory() -> bool:
    """Collects cycles, then returns free heap pages to the kernel; True if any were."""
    gc.collect()
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False


class DeferredTrim:
    """A trim a few seconds after a swap: schedule() at the swap, run_due() on every turn of the owner's loop
    (one owner thread; nothing here is shared)."""

    def __init__(self, delay_s: float = TRIM_DELAY_S):
        self.delay_s = delay_s
        self.at: float | None = None  # monotonic time of the trim due, if any

    def schedule(self) -> None:
        self.at = time.monotonic() + self.delay_s

    def run_due(self) -> bool:
        """Trims if one is due; True if it did (whatever it gave back)."""
        if self.at is None or time.monotonic() < self.at:
            return False
        self.at = None
        release_freed_memory()
        return True
