"""A configured stream, as the lanes see it: what both processes share, and what a lane owns.

`Stream` is made once by the control plane at start, before the zygote forks,
and never changes: the stream's name, its place in the dispatch table, its
model, its result ring and its shared-memory blocks (stats and flag words).
Every lane inherits the same objects.

`LaneStream` is a lane's own working state for one stream, made in the lane
process from a `Stream`: the ring it serves now, the fused session for that
ring's geometry, the producer generation, the deadline of its pending frame.
Its fields are flat copies (the loop reads them on every frame), and no other
process holds one. What the control plane keeps about a stream (its producer's
connection, readers, churn) is control/streamstate.py's `StreamState`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeinfer.abi import ring
from edgeinfer.lanes.stats import StreamStats

if TYPE_CHECKING:
    from edgeinfer.models.runtime import FusedSession


class Stream:
    """What both processes know of a configured stream; fixed at start."""

    __slots__ = ("name", "index", "model", "writer", "max_age_ns", "priority", "stats", "flags")

    def __init__(self, name: str, writer: ring.ResultWriter, max_age_ms: float, priority: int = 0, *,
                 index: int = 0, model: str = "", stats: StreamStats | None = None, flags=None):
        self.name = name
        self.index = index      # its place in the dispatch table
        self.model = model      # the name of the model serving it
        self.writer = writer    # its result ring (the lanes publish, readers are handed its fd)
        self.max_age_ns = int(max_age_ms * 1e6)
        self.priority = priority
        self.stats = stats if stats is not None else StreamStats(name)  # in the dispatch table, or private
        self.flags = flags      # its control-plane flag words in the dispatch table (dispatch.FLAG_*)


class LaneStream:
    """One lane's working state for a stream (the lane process only)."""

    __slots__ = Stream.__slots__ + ("reader", "session", "geometry", "epoch", "deadline", "passed_over")
    # Stream's fields, copied flat by __init__ (declared for the type checker: setattr hides them)
    name: str
    index: int
    model: str
    writer: ring.ResultWriter
    max_age_ns: int
    priority: int
    stats: StreamStats
    flags: Any

    def __init__(self, stream: Stream):
        for field in Stream.__slots__:
            setattr(self, field, getattr(stream, field))
        self.reader: ring.FrameReader | None = None  # the producer's ring being served
        self.session: FusedSession | None = None  # the FusedSession for that ring's geometry
        self.geometry = (0, 0)  # (width, height) of the attached ring
        self.epoch = 0          # producer generation of the attached ring
        self.deadline = 0       # of the pending frame, set while picking
        self.passed_over = 0    # picks that went to other streams while it was ready (its cursor's), read while picking
