"""A plain-Python, dict-based model of the graph store's semantics, for tests."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

import streamgnn as sg

D = 3


class Reference:
    """Sequential, dict-based semantics of the graph store; vertices carry an incarnation
    counter so a vertex deleted and re-added is a different vertex."""

    def __init__(self, data: sg.GraphData) -> None:
        self.dim = data.num_features
        self.x = {int(i): tuple(r) for i, r in zip(data.ids, data.x.tolist())}
        self.inc = {int(i): 0 for i in data.ids}
        self.e = {(int(s), int(d)): float(w) for s, d, w in zip(data.src, data.dst, data.weight)}
        self.next_inc = 1

    def snapshot(self):
        return dict(self.x), dict(self.inc), dict(self.e), self.next_inc

    def restore(self, snap) -> None:
        self.x, self.inc, self.e, self.next_inc = (dict(snap[0]), dict(snap[1]),
                                                   dict(snap[2]), snap[3])

    def apply(self, batch) -> None:
        snap = self.snapshot()
        try:
            for i, u in enumerate(batch):
                try:
                    self._one(u)
                except sg.InvalidUpdateError as err:
                    raise err.at(i) from None
        except sg.InvalidUpdateError:
            self.restore(snap)
            raise

    def _need(self, v):
        if v not in self.x:
            raise sg.UnknownVertexError(f"{v}")

    def _features(self, x):
        if len(x) != self.dim:
            raise sg.FeatureDimensionError("dim")
        if not all(math.isfinite(a) for a in x):
            raise sg.NonFiniteValueError("nan")
        return tuple(np.float32(a) for a in x)

    def _one(self, u) -> None:
        if isinstance(u, sg.AddVertex):
            x = self._features(u.x)
            if u.id in self.x:
                raise sg.DuplicateVertexError("dup")
            self.x[u.id] = x
            self.inc[u.id] = self.next_inc
            self.next_inc += 1
        elif isinstance(u, sg.DeleteVertex):
            self._need(u.id)
            del self.x[u.id], self.inc[u.id]
            self.e = {k: w for k, w in self.e.items() if u.id not in k}
        elif isinstance(u, sg.UpdateFeatures):
            x = self._features(u.x)
            self._need(u.id)
            self.x[u.id] = x
        else:
            self._need(u.src)
            self._need(u.dst)
            key = (u.src, u.dst)
            if isinstance(u, sg.AddEdge | sg.UpdateEdge) and not math.isfinite(u.weight):
                raise sg.NonFiniteValueError("nan")
            if isinstance(u, sg.AddEdge):
                if u.src == u.dst:
                    raise sg.SelfLoopError("loop")
                if key in self.e:
                    raise sg.DuplicateEdgeError("dup")
                self.e[key] = float(np.float32(u.weight))
            elif key not in self.e:
                raise sg.UnknownEdgeError("missing")
            elif isinstance(u, sg.DeleteEdge):
                del self.e[key]
            else:
                self.e[key] = float(np.float32(u.weight))




def update_strategy(ids: st.SearchStrategy, weights: st.SearchStrategy,
                    rows: st.SearchStrategy) -> st.SearchStrategy:
    """Any of the six update types over the given ids, weights and feature rows."""
    return st.one_of(
        st.builds(sg.AddEdge, src=ids, dst=ids, weight=weights),
        st.builds(sg.DeleteEdge, src=ids, dst=ids),
        st.builds(sg.UpdateEdge, src=ids, dst=ids, weight=weights),
        st.builds(sg.AddVertex, id=ids, x=rows),
        st.builds(sg.DeleteVertex, id=ids),
        st.builds(sg.UpdateFeatures, id=ids, x=rows),
    )
