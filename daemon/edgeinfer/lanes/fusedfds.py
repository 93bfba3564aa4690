"""The sealed memfds a lane gets a stream's fused graph in, made once per model version and geometry.

Every ring handed to a lane comes with the fused graph of its geometry, in case the lane has no session for it
yet. Writing the graph into a fresh memfd each time (6.8 MB for the demo model) took 7 ms of the control plane's
attach path, and a camera's first frame waited for it: a sealed memfd can be handed over as often as needed, so
it is kept. Bounded: the last `per_model` geometries of each model (runtime.max_sessions, as the lanes' sessions),
and only the version being served (a reload's or promotion's new ModelRuntime makes its own).
"""
from __future__ import annotations

import collections
import os

from edgeinfer.lanes.protocol import to_memfd


class FusedFds:
    def __init__(self, per_model: int):
        self.per_model = per_model
        # (model name, geometry) → (the ModelRuntime it came from, fd), least recently used first.
        self._fds: collections.OrderedDict[tuple, tuple[object, int]] = collections.OrderedDict()

    def fd(self, name: str, runtime, geometry) -> int:
        """The memfd of model `name`'s fused graph for `geometry` as `runtime` serves it; owned here (send it,
        do not close it)."""
        key = (name, tuple(geometry))
        held = self._fds.get(key)
        if held is not None and held[0] is runtime:
            self._fds.move_to_end(key)
            return held[1]
        for k in [k for k, (rt, _) in self._fds.items() if k[0] == name and rt is not runtime]:
            os.close(self._fds.pop(k)[1])  # an older version's: never handed over again
        fd = to_memfd(runtime.fused_model(*geometry), "edgeinfer-fused")
        self._fds[key] = (runtime, fd)
        mine = [k for k in self._fds if k[0] == name]
        for k in mine[: max(0, len(mine) - self.per_model)]:
            os.close(self._fds.pop(k)[1])
        return fd

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1][1])
