"""`LinkBenchWorkload`: batches of graph updates with LinkBench's write mix and skewed ids,
valid against the graph they are generated for (applied in order).

LinkBench ``FBWorkload.properties`` writes, renormalised to writes only
(docs/architecture.md "Components"): addlink 29.05 %, deletelink 9.67 %, updatelink 25.89 %,
addnode 8.32 %, updatenode 23.81 %, deletenode 3.27 %. Ids are Zipf-like: link writes 0.741,
node updates 0.606, node deletes uniform. Given ``arrivals`` (the held-out stream of the
RIPPLE++ 80/20 protocol), the add operations replay it in order instead of inventing
vertices and links. Owns trace generation only; must not import kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamgnn.graph import DynamicGraph
from streamgnn.updates import (
    AddEdge,
    AddVertex,
    DeleteEdge,
    DeleteVertex,
    Update,
    UpdateEdge,
    UpdateFeatures,
)

WRITE_MIX: dict[type, float] = {
    AddEdge: 29.05, DeleteEdge: 9.67, UpdateEdge: 25.89,
    AddVertex: 8.32, UpdateFeatures: 23.81, DeleteVertex: 3.27,
}
LINK_SKEW = 0.741
NODE_UPDATE_SKEW = 0.606


class LinkBenchWorkload:
    """Generates batches for ``graph``, which the caller keeps applying them to (`applied`
    does, for a graph of the workload's own)."""

    def __init__(self, graph: DynamicGraph, seed: int = 0, mix: dict[type, float] | None = None,
                 arrivals: Sequence[Update] = (), unit_weights: bool = False,
                 max_tries: int = 20) -> None:
        self.graph = graph
        self.rng = np.random.default_rng(seed)
        mix = mix or WRITE_MIX
        self.kinds = list(mix)
        p = np.array([mix[k] for k in self.kinds], np.float64)
        self.p = p / p.sum()
        self.max_tries = max_tries
        self.arrivals = list(arrivals)
        self.next_arrival = 0
        self.unit_weights = unit_weights
        arriving = [u.id for u in self.arrivals if isinstance(u, AddVertex)]
        self.next_id = max(int(graph.vertex_ids().max(initial=0)), *arriving, 0) + 1

    def batch(self, size: int) -> list[Update]:
        """``size`` updates valid in order against the graph's current state (fewer only if
        the graph runs out of edges or vertices to delete)."""
        g = self.graph
        ids = g.vertex_ids()
        rank = self.rng.permutation(len(ids))  # popularity order for this batch
        state = _Overlay()
        out: list[Update] = []
        for kind in self.rng.choice(len(self.kinds), size=size, p=self.p):
            for _ in range(self.max_tries):
                update = self._one(self.kinds[kind], ids, rank, state)
                if update is not None:
                    out.append(update)
                    break
        return out

    def applied(self, size: int) -> list[Update]:
        """`batch`, applied to the graph too: keeps a graph of the workload's own in step
        with an engine that has none to share (one with partitions)."""
        updates = self.batch(size)
        self.graph.apply(updates)
        return updates

    def _pick(self, ids, rank, skew: float) -> int:
        """An id by Zipf-like popularity (skew 0: uniform)."""
        n = len(ids)
        k = int(n * self.rng.random() ** (1.0 / (1.0 - skew))) if skew else int(
            self.rng.integers(n))
        return int(ids[rank[min(k, n - 1)]])

    def _features(self, ids) -> list[float]:
        g = self.graph
        base = g.x[g.slots([int(ids[self.rng.integers(len(ids))])])[0]]
        return (base + 0.1 * self.rng.standard_normal(len(base))).astype(np.float32).tolist()

    def _live(self, v: int, state: _Overlay) -> bool:
        return v not in state.deleted and (v in state.added or bool(self.graph.contains([v])[0]))

    def _has_edge(self, s: int, d: int, state: _Overlay) -> bool:
        if (s, d) in state.edges:
            return state.edges[(s, d)]
        if s in state.added or d in state.added:
            return False
        return bool(self.graph.has_edges(self.graph.slots([s]), self.graph.slots([d]))[0])

    def _existing_edge(self, ids, rank, state) -> tuple[int, int] | None:
        s = self._pick(ids, rank, LINK_SKEW)
        if not self._live(s, state) or s in state.added:
            return None
        _, nbrs, _ = self.graph.out_edges(self.graph.slots([s]))
        if not len(nbrs):
            return None
        d = int(self.graph.ext[nbrs[self.rng.integers(len(nbrs))]])
        if not self._live(d, state) or not self._has_edge(s, d, state):
            return None
        return s, d

    def _weight(self) -> float:
        return 1.0 if self.unit_weights else float(self.rng.uniform(0.5, 1.5))

    def _arrival(self, state: _Overlay) -> Update | None:
        """The next held-out vertex or link that is still valid (its ends may have been
        deleted since), or None when the stream is used up."""
        while self.next_arrival < len(self.arrivals):
            u = self.arrivals[self.next_arrival]
            self.next_arrival += 1
            if isinstance(u, AddVertex):
                state.added.add(u.id)
                return u
            if (self._live(u.src, state) and self._live(u.dst, state)
                    and not self._has_edge(u.src, u.dst, state)):
                state.edges[(u.src, u.dst)] = True
                return u.model_copy(update={"weight": 1.0}) if self.unit_weights else u
        return None

    def _one(self, kind, ids, rank, state: _Overlay) -> Update | None:
        if kind in (AddVertex, AddEdge):
            arrival = self._arrival(state)
            if arrival is not None:
                return arrival
        if kind is AddVertex:
            v = self.next_id
            self.next_id += 1
            state.added.add(v)
            return AddVertex(id=v, x=self._features(ids))
        if kind is UpdateFeatures:
            v = self._pick(ids, rank, NODE_UPDATE_SKEW)
            return UpdateFeatures(id=v, x=self._features(ids)) if self._live(v, state) else None
        if kind is DeleteVertex:
            v = self._pick(ids, rank, 0.0)
            if not self._live(v, state) or v in state.added:
                return None
            state.deleted.add(v)
            return DeleteVertex(id=v)
        if kind is AddEdge:
            s, d = self._pick(ids, rank, LINK_SKEW), self._pick(ids, rank, LINK_SKEW)
            if state.added and self.rng.random() < 0.5:  # new vertices link in too
                s = sorted(state.added)[self.rng.integers(len(state.added))]
            if s == d or not (self._live(s, state) and self._live(d, state)):
                return None
            if self._has_edge(s, d, state):
                return None
            state.edges[(s, d)] = True
            return AddEdge(src=s, dst=d, weight=self._weight())
        edge = self._existing_edge(ids, rank, state)
        if edge is None:
            return None
        if kind is DeleteEdge:
            state.edges[edge] = False
            return DeleteEdge(src=edge[0], dst=edge[1])
        return UpdateEdge(src=edge[0], dst=edge[1], weight=self._weight())


class _Overlay:
    """What the batch generated so far changed: vertices added/deleted, edge presence."""

    def __init__(self) -> None:
        self.added: set[int] = set()
        self.deleted: set[int] = set()
        self.edges: dict[tuple[int, int], bool] = {}
