"""What the control plane keeps about each configured stream: its producer, its readers, its churn.

One `StreamState` per stream, in the daemon process only, owned by admission
(admission.py) and read by status (status.py). The part both processes share
(name, model, result ring, stats) is the stream's `Stream` (lanes/stream.py);
the lanes' working state is theirs alone.
"""
from __future__ import annotations

import collections

from edgeinfer.abi import ring
from edgeinfer.lanes.stream import Stream


class StreamState:
    def __init__(self, stream: Stream, producer_desc: str = "", readers_desc: str = "", pool: str | None = None):
        self.stream = stream
        self.pool = pool                # the front's pool it is a stream of; None: a camera's
        self.conn = None                # the admitted producer's connection (ingress.Client)
        self.ring: ring.FrameReader | None = None  # the ring handed to the lanes for it
        self.geometry: tuple | None = None  # (pixel format, height, width) being served
        self.last_geometry = None       # of the previous producer (geometry churn)
        self.geometry_changes: collections.deque = collections.deque()  # monotonic times of recent changes
        self.handovers: collections.deque = collections.deque()  # monotonic times of recent hand-overs
        self.cooldown_until = 0.0       # producers refused until then (geometry changed or ring handed too often)
        self.cooldown_why = ("", "")    # (refusal reason, why in words) of the cooldown
        self.attach_count = 0           # producers admitted so far (the epoch of the current one)
        self.reader_count = 0           # reader connections held
        self.producer_desc = producer_desc  # who may produce it, in words
        self.readers_desc = readers_desc    # who may read it, in words

    @property
    def name(self) -> str:
        return self.stream.name

    @property
    def model(self) -> str:
        return self.stream.model

    @property
    def connected(self) -> bool:
        """A producer is connected (its connection is the liveness)."""
        return self.conn is not None
