"""`SlotMap`: the slots a numbering of every vertex (the whole graph's, or the
directory's: `Slotted`) gives the vertices of a partition's graph, remembered per slot
and checked against the ids on every use: a slot a later vertex reuses, on either side, is
looked up again.

Owns this cache only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np

from streamgnn.graph.idmap import Slotted
from streamgnn.graph.store import DynamicGraph


class SlotMap:
    """``target``'s slots of ``source``'s slots."""

    def __init__(self, source: DynamicGraph, target: Slotted) -> None:
        self.source, self.target = source, target
        self._known = np.full(0, -1, np.int64)  # per source slot: target slot, -1 unknown

    def __call__(self, slots: np.ndarray) -> np.ndarray:
        """The target's slots of the live source vertices at ``slots``."""
        if len(self._known) < len(self.source.ext):
            grown = np.full(len(self.source.ext), -1, np.int64)
            grown[:len(self._known)] = self._known
            self._known = grown
        ids = self.source.ext[slots]
        mapped = self._known[slots]
        hit = mapped >= 0
        t = self.target
        hit[hit] = t.alive[mapped[hit]] & (t.ext[mapped[hit]] == ids[hit])
        if not hit.all():
            missed = ~hit
            mapped[missed] = t.slots(ids[missed])
            self._known[slots[missed]] = mapped[missed]
        return mapped
