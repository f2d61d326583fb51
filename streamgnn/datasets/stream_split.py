"""The RIPPLE++ evaluation protocol: an initial snapshot plus the held-out vertices and
edges as a time-ordered stream of updates.

Owns the split only; must not import kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from streamgnn.datasets.graph_data import GraphData
from streamgnn.updates import AddEdge, AddVertex, Update


def split_stream(data: GraphData, frac: float = 0.2,
                 seed: int = 0) -> tuple[GraphData, HeldOut]:
    """Hold out ``frac`` of the vertices, chosen at random, with every edge touching them.

    Returns the snapshot induced by the other vertices and the held-out part as updates:
    held-out vertices arrive in random order (``AddVertex``); each held-out edge arrives
    right after the later of its two endpoints, so replaying the stream in order onto the
    snapshot rebuilds ``data`` exactly."""
    if not 0.0 < frac < 1.0:
        raise ValueError(f"frac must be in (0, 1), got {frac}")
    rng = np.random.default_rng(seed)
    n = data.num_vertices
    held = rng.random(n) < frac
    arrival = np.full(n, -1.0)
    arrival[held] = rng.permutation(int(held.sum()))

    s_pos, d_pos = data.positions(data.src), data.positions(data.dst)
    in_snapshot = ~held[s_pos] & ~held[d_pos]
    snapshot = GraphData(ids=data.ids[~held], src=data.src[in_snapshot],
                         dst=data.dst[in_snapshot], x=data.x[~held],
                         y=None if data.y is None else data.y[~held],
                         weight=data.weight[in_snapshot], name=f"{data.name}-snapshot")

    # Sort key: vertex k arrives at time k; its edges at k + 0.5 + jitter (< 1).
    held_v = np.flatnonzero(held)
    held_e = np.flatnonzero(~in_snapshot)
    edge_time = np.maximum(arrival[s_pos[held_e]], arrival[d_pos[held_e]])
    edge_time += 0.5 + 0.49 * rng.random(len(held_e))
    times = np.concatenate([arrival[held_v], edge_time])
    order = np.argsort(times, kind="stable")

    return snapshot, HeldOut(data, held_v, held_e, order)


class HeldOut(Sequence[Update]):
    """The held-out updates in arrival order, each built when it is read: a large preset
    holds out tens of millions of edges, too many to keep as objects."""

    def __init__(self, data: GraphData, vertices: np.ndarray, edges: np.ndarray,
                 order: np.ndarray) -> None:
        self._data, self._vertices, self._edges, self._order = data, vertices, edges, order

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, k: int) -> Update: ...
    @overload
    def __getitem__(self, k: slice) -> list[Update]: ...

    def __getitem__(self, k: int | slice) -> Update | list[Update]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        j = int(self._order[k])  # IndexError past the end, as a list
        nv, data = len(self._vertices), self._data
        if j < nv:
            v = self._vertices[j]
            return AddVertex(id=int(data.ids[v]), x=data.x[v].tolist())
        e = self._edges[j - nv]
        return AddEdge(src=int(data.src[e]), dst=int(data.dst[e]), weight=float(data.weight[e]))
