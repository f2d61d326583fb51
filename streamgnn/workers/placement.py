"""`Placement`: which partition owns each vertex and which hold it as a ghost, and the
routing of a batch's net change to the partitions (RIPPLE++ sections 4.3-4.4, Alg. 1).

Every edge lives with its destination's owner; an edge whose source another partition
owns makes that partition hold the source as a ghost (the owner then sends it the
source's rows). The initial owners come from METIS (pymetis) over the snapshot, or from
``id % P`` (``hash``). A new vertex joins the partition of the first existing neighbour
its batch links it to if that neighbour has a high in-degree (more than twice the average,
refreshed every ``refresh_every`` updates), else the least-loaded partition; with
``hash``, ``id % P``.

Per-vertex arrays are indexed by the router graph's slots. Owns placement metadata and
routing only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numba import njit

from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.graph.batch import sorted_position
from streamgnn.updates import (
    ADD_EDGE,
    ADD_VERTEX,
    DELETE_EDGE,
    DELETE_VERTEX,
    NO_X,
    UPDATE_EDGE,
    UPDATE_FEATURES,
    UpdateBatch,
)

Strategy = Literal["metis", "hash"]
STRATEGIES = ("metis", "hash")


@dataclass
class Routed:
    """One partition's part of a batch: ``batch`` (in an order its graph accepts), the
    ids of the ghosts it adds and their owners, and per other partition the ids of
    vertices it owns that the other now holds as ghosts (``subscribed``) or no longer
    does (``unsubscribed``: the batch removed their last edge into it)."""

    batch: UpdateBatch
    ghosts: np.ndarray
    ghost_owners: np.ndarray
    subscribed: dict[int, np.ndarray]
    unsubscribed: dict[int, np.ndarray] = field(default_factory=dict)


def bit(q) -> np.ndarray:
    """Partition ``q``'s bit in a holder mask (``q`` an int or an array)."""
    return np.uint64(1) << np.asarray(q, np.uint64)


def held_by(holders: np.ndarray, q) -> np.ndarray:
    """Which of the holder masks ``holders`` include partition ``q`` (an int, or an array
    broadcasting against them)."""
    return (holders & bit(q)) != 0


def metis_parts(graph: DynamicGraph, parts: int) -> np.ndarray:
    """Partition of each slot of ``graph`` by METIS over its undirected live edges (-1 for
    free slots)."""
    import pymetis

    live = graph.vertex_slots()
    out = np.full(graph.num_slots, -1, np.int64)
    if parts == 1 or len(live) <= parts:
        out[live] = np.arange(len(live)) % parts
        return out
    position = np.zeros(graph.num_slots, np.int64)
    position[live] = np.arange(len(live))
    s, d, _ = graph.edge_slots()
    s, d, n = position[s], position[d], len(live)
    pairs = np.concatenate([s * n + d, d * n + s])  # both directions, one key each
    del s, d
    pairs.sort()  # by (from, to): a lexsort of two columns took 3x as long on 79M
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(pairs // n, minlength=n), out=xadj[1:])
    adjncy = pairs % n
    del pairs
    _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))
    out[live] = membership
    return out


class Placement:
    def __init__(self, part: np.ndarray, holders: np.ndarray, num_partitions: int,
                 strategy: Strategy = "metis", refresh_every: int = 500_000) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown placement {strategy!r}: one of {', '.join(STRATEGIES)}")
        if not 1 <= num_partitions <= 64:
            raise ValueError(f"partitions must be 1..64, not {num_partitions}")
        self.num_partitions = num_partitions
        self.strategy = strategy
        self.refresh_every = refresh_every
        self.part = part           # owner per slot, -1 for none
        self.holders = holders     # per slot, a bit per partition holding it as a ghost
        self.high_cut = 0.0        # in-degree above which a vertex is "high"
        self._load = np.bincount(part[part >= 0], minlength=num_partitions)
        self._since_refresh = refresh_every

    @classmethod
    def initial(cls, graph: DynamicGraph, num_partitions: int, strategy: Strategy = "metis",
                refresh_every: int = 500_000) -> Placement:
        """Owners for the graph as it is (METIS or hash), and the ghosts its edges imply."""
        if strategy == "hash":
            part = np.full(graph.num_slots, -1, np.int64)
            live = graph.vertex_slots()
            part[live] = graph.ext[live] % num_partitions
        else:
            part = metis_parts(graph, num_partitions)
        placement = cls(part, np.zeros(graph.num_slots, np.uint64), num_partitions, strategy,
                        refresh_every)
        s, d, _ = graph.edge_slots()
        cut = part[s] != part[d]
        np.bitwise_or.at(placement.holders, s[cut],
                         bit(part[d[cut]]))
        return placement

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"part": self.part, "holders": self.holders, "meta": np.array(
            [self.num_partitions, STRATEGIES.index(self.strategy), self.refresh_every,
             self._since_refresh]), "high_cut": np.array(self.high_cut)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Placement:
        p, strategy, refresh_every, since = (int(v) for v in arrays["meta"])
        placement = cls(np.array(arrays["part"]), np.array(arrays["holders"]), p,
                        STRATEGIES[strategy], refresh_every)
        placement.high_cut = float(arrays["high_cut"])
        placement._since_refresh = since
        return placement

    def owners(self, slots: np.ndarray) -> np.ndarray:
        return self.part[slots]

    def load(self) -> np.ndarray:
        """Vertices per partition."""
        return self._load.copy()

    # ---------------------------------------------------------------- routing
    def route(self, graph: DynamicGraph, diff: GraphDiff, updates: int) -> list[Routed]:
        """Split the net change ``diff`` (of ``updates`` updates, already applied to the
        router's ``graph``) into each partition's batch, placing the vertices it added."""
        self._fit(graph.num_slots)
        self._since_refresh += updates
        if self._since_refresh >= self.refresh_every:
            degrees = graph.in_degree[graph.vertex_slots()]
            self.high_cut = 2.0 * float(degrees.mean()) if len(degrees) else 0.0
            self._since_refresh = 0
        removed, added = diff.removed.astype(np.int64), diff.added.astype(np.int64)
        e = diff.edges
        src, dst = e.src.astype(np.int64), e.dst.astype(np.int64)
        dst_part = self.part[dst]  # before the batch's removals: where each edge lived
        gone_part, gone_holders = self.part[removed].copy(), self.holders[removed].copy()
        self.part[removed], self.holders[removed] = -1, 0
        self.holders[added] = 0
        self.part[added] = self._place(graph, diff)
        self._load -= np.bincount(gone_part, minlength=self.num_partitions)
        self._load += np.bincount(self.part[added], minlength=self.num_partitions)

        had, has = ~np.isnan(e.before), ~np.isnan(e.after)
        gone = np.sort(removed)
        src_lives, dst_lives = _outside(src, gone), _outside(dst, gone)
        deleted = had & ~has & src_lives & dst_lives  # the rest: cascades
        kept, new = had & has, has & ~had
        new_src, new_dst = src[new], dst[new]
        owner = self.part[new_dst]
        ghost_src, ghost_at = _hold(new_src, owner, self.part, self.holders)
        lost = had & ~has & src_lives
        drop_src, drop_at = _release(src[lost], dst_part[lost], self.part, self.holders,
                                     *graph.out.arrays[:2], graph.out.arrays[3])

        ext, x, width = graph.ext, graph.x, graph.num_features
        # a removed vertex goes to its owner and to every partition holding it
        n = self.num_partitions
        held = held_by(gone_holders[:, None], np.arange(n))
        held[np.arange(len(removed)), gone_part] = True
        gone_at, gone_q = np.nonzero(held)
        gone = removed[gone_at]
        # (owner of each item, op, a, b, w, feature rows), in the order every graph accepts
        groups = [(self.part[dst[deleted]], DELETE_EDGE, src[deleted], dst[deleted], None,
                   None),
                  (self.part[dst[kept]], UPDATE_EDGE, src[kept], dst[kept], e.after[kept],
                   None),
                  (gone_q, DELETE_VERTEX, gone, None, None, None),
                  (drop_at, DELETE_VERTEX, drop_src, None, None, None),  # unneeded ghosts
                  (self.part[added], ADD_VERTEX, added, None, None, x[added]),
                  (self.part[diff.changed], UPDATE_FEATURES, diff.changed, None, None,
                   x[diff.changed]),
                  (ghost_at, ADD_VERTEX, ghost_src, None, None,
                   np.zeros((len(ghost_src), width), np.float32)),
                  (owner, ADD_EDGE, new_src, new_dst, e.after[new], None)]
        sizes = [len(g[0]) for g in groups]
        part = np.concatenate([g[0] for g in groups]).astype(np.int64)
        order = np.argsort(part, kind="stable")  # each partition's items, in group order
        bounds = np.searchsorted(part[order], np.arange(n + 1))
        op = np.repeat(np.array([g[1] for g in groups], np.int64), sizes)[order]
        a = ext[np.concatenate([g[2] for g in groups]).astype(np.int64)[order]]
        b = np.concatenate([np.zeros(len(g[0]), np.int64) if g[3] is None
                            else ext[g[3].astype(np.int64)] for g in groups])[order]
        w = np.concatenate([np.zeros(len(g[0]), np.float32) if g[4] is None else g[4]
                            for g in groups])[order]
        featured = np.repeat([g[5] is not None for g in groups], sizes)
        xs = np.concatenate([g[5] for g in groups if g[5] is not None])
        xs = xs[(np.cumsum(featured) - 1)[order[featured[order]]]]  # in partition order
        featured = featured[order]
        rows_before = np.concatenate([[0], np.cumsum(featured)])  # feature rows before an item
        # an item's row among its partition's feature rows
        xrow = np.where(featured, rows_before[:-1]
                        - np.repeat(rows_before[bounds[:-1]], np.diff(bounds)), NO_X)
        routed = []
        for q in range(n):
            lo, hi = bounds[q], bounds[q + 1]
            routed.append(Routed(UpdateBatch(op[lo:hi], a[lo:hi], b[lo:hi], w[lo:hi],
                                             xrow[lo:hi], xs[rows_before[lo]:rows_before[hi]]),
                                 np.zeros(0, np.int64), np.zeros(0, np.int64), {}))
        ghost_owner = self.part[ghost_src]
        for q in np.unique(ghost_at).tolist():
            at_q = ghost_at == q
            routed[q].ghosts = ext[ghost_src[at_q]]
            routed[q].ghost_owners = ghost_owner[at_q]
            for p in np.unique(ghost_owner[at_q]).tolist():
                routed[p].subscribed[q] = ext[ghost_src[at_q & (ghost_owner == p)]]
        drop_owner = self.part[drop_src]
        for p in np.unique(drop_owner).tolist():
            for q in np.unique(drop_at[drop_owner == p]).tolist():
                routed[p].unsubscribed[q] = ext[drop_src[(drop_owner == p) & (drop_at == q)]]
        return routed

    def _place(self, graph: DynamicGraph, diff: GraphDiff) -> np.ndarray:
        """Owners for the vertices ``diff`` added (sorted: `GraphDiff`)."""
        added = diff.added.astype(np.int64)
        if self.strategy == "hash" or not len(added):
            return graph.ext[added] % self.num_partitions
        e = diff.edges
        first = _first_neighbours(e.src, e.dst, e.after, added)
        out = np.full(len(added), -1, np.int64)
        high = (first >= 0) & (graph.in_degree[np.maximum(first, 0)] > self.high_cut)
        out[high] = self.part[first[high]]
        load = self.load()
        np.add.at(load, out[high], 1)
        out[~high] = _least_loaded(load, int((~high).sum()))
        return out

    def _fit(self, size: int) -> None:
        if size > len(self.part):
            grow = max(size, len(self.part) * 5 // 4)
            self.part = np.concatenate([self.part, np.full(grow - len(self.part), -1)])
            self.holders = np.concatenate([self.holders,
                                           np.zeros(grow - len(self.holders), np.uint64)])


@njit(cache=True)
def _hold(src, owner, part, holders):
    """Ghosts the new edges ``src -> (a vertex of partition owner)`` call for: the
    distinct (vertex, partition) pairs where the partition does not own the vertex nor
    hold it yet, in edge order; marks them held in ``holders``."""
    u = np.empty(len(src), np.int64)
    q = np.empty(len(src), np.int64)
    n = 0
    for i in range(len(src)):
        s, p = src[i], owner[i]
        flag = np.uint64(1) << np.uint64(p)
        if part[s] != p and not holders[s] & flag:
            holders[s] |= flag
            u[n], q[n] = s, p
            n += 1
    return u[:n], q[:n]


@njit(cache=True)
def _release(src, lost_at, part, holders, start, deg, nbr):
    """Ghosts no edge needs any more: the distinct (vertex, partition) pairs where a lost
    edge ``src -> (a vertex of partition lost_at)`` was the vertex's last out-edge into a
    partition holding it as a ghost (read from the out-adjacency after the batch), in
    edge order; clears them in ``holders``."""
    u = np.empty(len(src), np.int64)
    q = np.empty(len(src), np.int64)
    n = 0
    for i in range(len(src)):
        s, p = src[i], lost_at[i]
        flag = np.uint64(1) << np.uint64(p)
        if part[s] == p or not holders[s] & flag:
            continue
        linked = False
        for k in range(start[s], start[s] + deg[s]):
            if part[nbr[k]] == p:
                linked = True
                break
        if not linked:
            holders[s] &= ~flag
            u[n], q[n] = s, p
            n += 1
    return u[:n], q[:n]


@njit(cache=True)
def _first_neighbours(src, dst, after, added):
    """For each of the vertices ``added`` (sorted), the first neighbour, in the order of
    the net edge changes ``src -> dst`` that exist after the batch (``after`` not NaN),
    that the batch did not add; -1 where there is none."""
    first = np.full(len(added), -1, np.int64)
    for k in range(len(src)):
        if np.isnan(after[k]):
            continue
        a, b = np.int64(src[k]), np.int64(dst[k])
        i, j = sorted_position(added, a), sorted_position(added, b)
        if i >= 0 and j < 0 and first[i] < 0:
            first[i] = b
        if j >= 0 and i < 0 and first[j] < 0:
            first[j] = a
    return first


@njit(cache=True)
def _outside(values, members):
    """Per value, whether it is not among the sorted ``members`` (the batch's few: a
    search each, not a mask over every slot)."""
    out = np.empty(len(values), np.bool_)
    for k in range(len(values)):
        out[k] = sorted_position(members, values[k]) < 0
    return out


@njit(cache=True)
def _least_loaded(load, count):
    """Owners for ``count`` vertices, each in turn to the least-loaded partition (the
    first of equals), ``load`` counting them as they go."""
    out = np.empty(count, np.int64)
    for i in range(count):
        p = np.argmin(load)
        out[i] = p
        load[p] += 1
    return out
