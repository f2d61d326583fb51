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
ZERO_ROW = -1  # where a routed item's features come from: a row of zeros (a new ghost's)


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

        # a removed vertex goes to its owner and to every partition holding it
        n = self.num_partitions
        held = held_by(gone_holders[:, None], np.arange(n))
        held[np.arange(len(removed)), gone_part] = True
        gone_at, gone_q = np.nonzero(held)
        gone = removed[gone_at]
        # (owner of each item, op, a), in the order every graph accepts; then for the
        # items with one, in that order: b of edges, w of added/updated edges, the slot
        # whose features an added vertex or new features carry (ZERO_ROW: a new ghost's)
        groups = [(self.part[dst[deleted]], DELETE_EDGE, src[deleted]),
                  (self.part[dst[kept]], UPDATE_EDGE, src[kept]),
                  (gone_q, DELETE_VERTEX, gone),
                  (drop_at, DELETE_VERTEX, drop_src),  # unneeded ghosts
                  (self.part[added], ADD_VERTEX, added),
                  (self.part[diff.changed], UPDATE_FEATURES, diff.changed),
                  (ghost_at, ADD_VERTEX, ghost_src),
                  (owner, ADD_EDGE, new_src)]
        b = np.concatenate([dst[deleted], dst[kept], new_dst])
        w = np.concatenate([e.after[kept], e.after[new]])
        xfrom = np.concatenate([added, diff.changed, np.full(len(ghost_src), ZERO_ROW)])
        read, bounds, xbounds, *columns = _split(
            np.concatenate([g[0] for g in groups]),
            np.repeat(np.array([g[1] for g in groups], np.int8), [len(g[0]) for g in groups]),
            np.concatenate([g[2] for g in groups]), b, w, xfrom, n, graph.ext, graph.x)
        assert read == (len(b), len(w), len(xfrom)), "groups and their columns out of step"
        op, a, b, w, xrow, xs = columns
        routed = [Routed(UpdateBatch.unchecked(
            *(c[bounds[q]:bounds[q + 1]] for c in (op, a, b, w, xrow)),
            xs[xbounds[q]:xbounds[q + 1]]), np.zeros(0, np.int64), np.zeros(0, np.int64), {})
            for q in range(n)]
        ext, ghost_owner = graph.ext, self.part[ghost_src]
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
def _split(owner, op, a, b, w, xfrom, parts, ext, x):
    """The routed items (owner partition, op code, vertex slot ``a``; and for the items
    with one, in order: the slot ``b`` of edges, the weight ``w`` of added and updated
    edges, the slot ``xfrom`` whose features added vertices and new features carry
    (ZERO_ROW: zeros)) as each partition's columns of an `UpdateBatch`, partitions one
    after the other and each's items in the given order: how many of ``b``, ``w`` and
    ``xfrom`` it read, the bounds of each partition's items and of its feature rows, then
    op, a, b (external ids; 0 where absent), w, xrow (into the partition's rows) and x."""
    n = len(owner)
    has_x = (op == ADD_VERTEX) | (op == UPDATE_FEATURES)
    bounds, xbounds = np.zeros(parts + 1, np.int64), np.zeros(parts + 1, np.int64)
    for k in range(n):
        bounds[owner[k] + 1] += 1
        xbounds[owner[k] + 1] += has_x[k]
    bounds, xbounds = np.cumsum(bounds), np.cumsum(xbounds)
    at, xat = bounds[:-1].copy(), xbounds[:-1].copy()
    op_out, a_out, b_out = np.empty(n, np.int8), np.empty(n, np.int64), np.zeros(n, np.int64)
    w_out, xrow = np.zeros(n, np.float32), np.full(n, NO_X, np.int64)
    x_out = np.zeros((xbounds[-1], x.shape[1]), np.float32)
    kb = kw = kx = 0
    for k in range(n):
        q = owner[k]
        i = at[q]
        at[q] += 1
        op_out[i], a_out[i] = op[k], ext[a[k]]
        if op[k] <= UPDATE_EDGE:  # an edge
            b_out[i] = ext[b[kb]]
            kb += 1
            if op[k] != DELETE_EDGE:
                w_out[i] = w[kw]
                kw += 1
        elif has_x[k]:
            r = xat[q]
            xat[q] += 1
            xrow[i] = r - xbounds[q]
            if xfrom[kx] != ZERO_ROW:
                x_out[r] = x[xfrom[kx]]
            kx += 1
    return (kb, kw, kx), bounds, xbounds, op_out, a_out, b_out, w_out, xrow, x_out


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
