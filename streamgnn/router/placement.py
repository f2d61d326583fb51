"""`Placement`: which partition each update goes to (RIPPLE++ section 4.3-4.4, Alg. 1).

Keeps the vertex -> partition map, per-partition vertex loads, in-degrees and the high
in-degree set (in-degree > 2x the current average, refreshed every ``refresh_every``
updates). An edge whose ends share a partition goes there; a cut edge goes to its source's
partition plus a no-compute copy to its sink's. A new vertex joins the partition of the
first existing neighbour its batch links it to if that neighbour is high in-degree, else
the least-loaded partition (``locality``); or ``id % P`` (``hash``). The initial map comes
from METIS (pymetis) over the snapshot. With one partition there is nothing to decide:
everything goes to partition 0 and the metadata stays as bootstrapped.

Owns routing metadata only; must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamgnn.updates import EDGE_UPDATES, AddEdge, AddVertex, DeleteEdge, DeleteVertex, Update

Strategy = Literal["locality", "hash"]


@dataclass
class Routed:
    """``partition[i]``: where update i computes; ``copies``: (update index, partition) of
    the no-compute copies cut edges send to their sink's partition."""

    partition: np.ndarray
    copies: list[tuple[int, int]]


def metis_parts(ids: np.ndarray, src: np.ndarray, dst: np.ndarray, parts: int) -> np.ndarray:
    """Partition of each vertex in ``ids`` by METIS over the undirected graph."""
    if parts == 1:
        return np.zeros(len(ids), np.int64)
    import pymetis

    order = np.argsort(ids)
    s = order[np.searchsorted(ids, src, sorter=order)]
    d = order[np.searchsorted(ids, dst, sorter=order)]
    a, b = np.concatenate([s, d]), np.concatenate([d, s])
    by = np.lexsort((b, a))
    a, b = a[by], b[by]
    xadj = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=len(ids)), out=xadj[1:])
    _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, b))
    return np.asarray(membership, np.int64)


class Placement:
    def __init__(self, ids: np.ndarray, parts: np.ndarray, in_degree: np.ndarray,
                 num_partitions: int, strategy: Strategy = "locality",
                 refresh_every: int = 500_000) -> None:
        if strategy not in ("locality", "hash"):
            raise ValueError(f"unknown placement strategy {strategy!r}: locality or hash")
        self.num_partitions = num_partitions
        self.strategy = strategy
        self.refresh_every = refresh_every
        self.part: dict[int, int] = dict(zip(ids.tolist(), parts.tolist()))
        self.in_degree: dict[int, int] = dict(zip(ids.tolist(), in_degree.tolist()))
        self.load = np.bincount(parts, minlength=num_partitions).astype(np.int64)
        self.cut_edges = 0
        self.high: set[int] = set()
        self._since_refresh = 0
        self.refresh()

    @classmethod
    def from_edges(cls, ids: np.ndarray, src: np.ndarray, dst: np.ndarray,
                   num_partitions: int = 1, **kwargs) -> Placement:
        """METIS over the snapshot's edges; counts its cut edges."""
        ids = np.asarray(ids, np.int64)
        parts = metis_parts(ids, src, dst, num_partitions)
        order = np.argsort(ids)
        s = order[np.searchsorted(ids, src, sorter=order)]
        d = order[np.searchsorted(ids, dst, sorter=order)]
        placement = cls(ids, parts, np.bincount(d, minlength=len(ids)), num_partitions,
                        **kwargs)
        placement.cut_edges = int((parts[s] != parts[d]).sum())
        return placement

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        """The metadata as arrays and small JSON (what a checkpoint holds)."""
        return ({"ids": np.fromiter(self.part, np.int64, len(self.part)),
                 "parts": np.fromiter(self.part.values(), np.int64, len(self.part)),
                 "degree_ids": np.fromiter(self.in_degree, np.int64, len(self.in_degree)),
                 "in_degree": np.fromiter(self.in_degree.values(), np.int64,
                                          len(self.in_degree)),
                 "load": self.load, "high": np.array(sorted(self.high), np.int64)},
                {"num_partitions": self.num_partitions, "strategy": self.strategy,
                 "refresh_every": self.refresh_every, "cut_edges": self.cut_edges,
                 "since_refresh": self._since_refresh})

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict) -> Placement:
        placement = cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                        meta["num_partitions"], meta["strategy"], meta["refresh_every"])
        placement.part = dict(zip(arrays["ids"].tolist(), arrays["parts"].tolist()))
        placement.in_degree = dict(zip(arrays["degree_ids"].tolist(),
                                       arrays["in_degree"].tolist()))
        placement.load = np.array(arrays["load"])
        placement.high = set(arrays["high"].tolist())
        placement.cut_edges = meta["cut_edges"]
        placement._since_refresh = meta["since_refresh"]
        return placement

    def refresh(self) -> None:
        """Recompute the high in-degree set."""
        deg = np.fromiter(self.in_degree.values(), np.int64, len(self.in_degree))
        mean = deg.mean() if len(deg) else 0.0
        self.high = {v for v, d in self.in_degree.items() if d > 2 * mean}
        self._since_refresh = 0

    def route(self, batch: Sequence[Update]) -> Routed:
        """Place every update of ``batch`` (in order) and update the metadata."""
        if self.num_partitions == 1:
            return Routed(np.zeros(len(batch), np.int64), [])
        neighbour = _first_neighbours(batch)
        out = np.zeros(len(batch), np.int64)
        copies: list[tuple[int, int]] = []
        for i, u in enumerate(batch):
            if isinstance(u, AddVertex):
                out[i] = self._place(u.id, neighbour.get(u.id))
            elif isinstance(u, DeleteVertex):
                out[i] = self.part.pop(u.id, 0)
                self.load[out[i]] -= 1
                self.in_degree.pop(u.id, None)
            elif isinstance(u, EDGE_UPDATES):
                ps = self.part.get(u.src)
                ps = self._place(u.src, u.dst) if ps is None else ps
                pd = self.part.get(u.dst)
                pd = self._place(u.dst, u.src) if pd is None else pd
                out[i] = ps
                if ps != pd:
                    copies.append((i, pd))
                    self.cut_edges += _edge_change(u)
                if u.dst in self.in_degree:
                    self.in_degree[u.dst] += _edge_change(u)
            else:
                out[i] = self.part.get(u.id, 0)
        self._since_refresh += len(batch)
        if self._since_refresh >= self.refresh_every:
            self.refresh()
        return Routed(out, copies)

    def _place(self, vertex: int, neighbour: int | None) -> int:
        if vertex in self.part:
            return self.part[vertex]
        if self.strategy == "hash":
            p = vertex % self.num_partitions
        elif neighbour is not None and neighbour in self.high and neighbour in self.part:
            p = self.part[neighbour]
        else:
            p = int(self.load.argmin())
        self.part[vertex] = p
        self.in_degree.setdefault(vertex, 0)
        self.load[p] += 1
        return p


def _edge_change(u: Update) -> int:
    return 1 if isinstance(u, AddEdge) else -1 if isinstance(u, DeleteEdge) else 0


def _first_neighbours(batch: Sequence[Update]) -> dict[int, int]:
    """For each vertex the batch adds, the other end of the first edge naming it."""
    added = {u.id for u in batch if isinstance(u, AddVertex)}
    first: dict[int, int] = {}
    for u in batch:
        if isinstance(u, AddEdge):
            if u.src in added:
                first.setdefault(u.src, u.dst)
            if u.dst in added:
                first.setdefault(u.dst, u.src)
    return first
