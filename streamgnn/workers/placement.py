"""`Placement`: which partition owns each vertex and which hold it as a ghost, and the
routing of a batch's net change to the partitions (RIPPLE++ sections 4.3-4.4, Alg. 1).

Every edge lives with its destination's owner; an edge whose source another partition
owns makes that partition hold the source as a ghost (the owner then sends it the
source's rows). The initial owners come from METIS (pymetis) over the snapshot, from
one streamed pass over its vertices (``stream``), or from ``id % P`` (``hash``). A new
vertex joins the partition of the first existing neighbor its batch links it to if that
neighbor has a high in-degree (more than twice the average, refreshed every
``refresh_every`` updates), else the least-loaded partition (``metis`` and ``stream``
alike); with ``hash``, ``id % P``.

``stream`` is Fennel (Tsourakakis et al. 2014) with the vertices in id order, kept over
LDG (Stanton & Kliot 2012) and over breadth-first order by benchmarks/partitioning.py
(docs/benchmarks.md, "Initial placement"). In id order the two rules placed every
arxiv-like vertex alike (with loads that even, both take the partition with the most
neighbors); breadth first, at the same capacity (1.1 n / P), Fennel cut 15-18 % fewer
edges than LDG, so Fennel is never the worse. Breadth first cuts 8-17 % fewer edges than
id order, but it is not kept: it needs the whole graph's adjacency before the first
vertex is placed (a streamed placement is for a graph that one process cannot hold), and
the partition it starts in takes the hubs' edges (1.26-1.57x the mean edges, against
1.02-1.10x), so at P <= 8 its largest partition holds more vertices and ghosts than id
order's. Fennel in id order cut 1.95-2.48x METIS's edges (hash: 2.53-3.36x).

Per-vertex arrays are indexed by the coordinator graph's slots. Owns placement metadata and
routing only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numba import njit

from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.graph.batch import copy_row, sorted_position
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

Strategy = Literal["metis", "hash", "stream"]
STRATEGIES = ("metis", "hash", "stream")  # (a checkpoint stores the index: append only)


@dataclass
class Routed:
    """One partition's part of a batch: ``batch`` (in an order its graph accepts), the
    ids of the ghosts it adds and their owners, the ids of vertices it owns that another
    partition now holds as ghosts (``subscribed``, that partition in ``subscribers``) or
    no longer does (``unsubscribed``: the batch removed their last edge into it)."""

    batch: UpdateBatch
    ghosts: np.ndarray
    ghost_owners: np.ndarray
    subscribed: np.ndarray
    subscribers: np.ndarray
    unsubscribed: np.ndarray
    unsubscribers: np.ndarray


def bit(q) -> np.ndarray:
    """Partition ``q``'s bit in a holder mask (``q`` an int or an array)."""
    return np.uint64(1) << np.asarray(q, np.uint64)


def held_by(holders: np.ndarray, q) -> np.ndarray:
    """Which of the holder masks ``holders`` include partition ``q`` (an int, or an array
    broadcasting against them)."""
    return (holders & bit(q)) != 0


def check_strategy(strategy: str) -> None:
    """Raises ValueError unless ``strategy`` is one of `STRATEGIES`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement {strategy!r}: one of {', '.join(STRATEGIES)}")


def undirected_csr(graph: DynamicGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The live slots of ``graph`` and their undirected adjacency as CSR (``xadj``,
    ``adjncy``) over positions in those slots: each edge ``u -> v`` is listed at both ends,
    so a pair of opposite edges is listed twice (it is two edges to cut)."""
    live = graph.vertex_slots()
    position = np.zeros(graph.num_slots, np.int64)
    position[live] = np.arange(len(live))
    s, d, _ = graph.edge_slots()
    s, d, n = position[s], position[d], len(live)
    pairs = np.concatenate([s * n + d, d * n + s])  # both directions, one key each
    del s, d
    pairs.sort()  # by (from, to): one sort of int64 keys beats a lexsort of two columns
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(pairs // n, minlength=n), out=xadj[1:])
    adjncy = pairs % n
    return live, xadj, adjncy


def metis_parts(graph: DynamicGraph, parts: int) -> np.ndarray:
    """Partition of each slot of ``graph`` by METIS over its undirected live edges (-1 for
    free slots)."""
    import pymetis

    out = np.full(graph.num_slots, -1, np.int64)
    if parts == 1 or graph.num_vertices <= parts:
        live = graph.vertex_slots()
        out[live] = np.arange(len(live)) % parts
        return out
    live, xadj, adjncy = undirected_csr(graph)
    _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))
    out[live] = membership
    return out


StreamRule = Literal["fennel", "ldg"]
StreamOrder = Literal["id", "bfs"]
FENNEL_GAMMA = 1.5  # Fennel's cost exponent: a partition of size s costs alpha * s^gamma
SLACK = 1.1  # a streamed partition holds at most SLACK * n / P vertices (Fennel's nu)


def stream_parts(graph: DynamicGraph, parts: int, rule: StreamRule = "fennel",
                 order: StreamOrder = "id") -> np.ndarray:
    """Partition of each slot of ``graph`` (-1 for free slots) in one pass over its live
    vertices, in ``order``: ascending id, or breadth first over the undirected edges
    (roots in id order). Each vertex goes to the partition ``rule`` scores highest for
    its ``c_q`` neighbors already in partition q of ``s_q`` vertices, among those below
    the capacity ``C = ceil(SLACK * n / P)`` (ties: the fewest vertices, then the lowest
    q): Fennel's ``c_q - alpha * gamma * s_q^(gamma - 1)`` with ``alpha = sqrt(P) * m /
    n^gamma`` (m undirected edges), or LDG's ``c_q * (1 - s_q / C)``."""
    live, xadj, adjncy = undirected_csr(graph)
    n = len(live)
    out = np.full(graph.num_slots, -1, np.int64)
    if n == 0:
        return out
    sequence = np.argsort(graph.ext[live])
    if order == "bfs":
        sequence = _breadth_first(xadj, adjncy, sequence)
    capacity = int(np.ceil(SLACK * n / parts))
    alpha = np.sqrt(parts) * (len(adjncy) / 2) / n ** FENNEL_GAMMA
    out[live] = _stream(xadj, adjncy, sequence, parts, capacity, rule == "fennel", alpha,
                        FENNEL_GAMMA)
    return out


@njit(cache=True)
def _breadth_first(xadj, adjncy, roots):
    """The vertices of the CSR ``xadj``/``adjncy`` breadth first, a new search from each
    of ``roots`` (all the vertices) not reached yet, in their order."""
    n = len(roots)
    seen = np.zeros(n, np.bool_)
    out = np.empty(n, np.int64)
    head = tail = 0
    for r in roots:
        if seen[r]:
            continue
        seen[r] = True
        out[tail] = r
        tail += 1
        while head < tail:
            v = out[head]
            head += 1
            for k in range(xadj[v], xadj[v + 1]):
                u = adjncy[k]
                if not seen[u]:
                    seen[u] = True
                    out[tail] = u
                    tail += 1
    return out


@njit(cache=True)
def _stream(xadj, adjncy, sequence, parts, capacity, fennel, alpha, gamma):
    """`stream_parts`'s pass: the partition of each vertex of the CSR ``xadj``/``adjncy``,
    placed in the order ``sequence``."""
    part = np.full(len(sequence), -1, np.int64)
    load = np.zeros(parts, np.int64)
    near = np.zeros(parts, np.float64)
    for v in sequence:
        near[:] = 0.0
        for k in range(xadj[v], xadj[v + 1]):
            q = part[adjncy[k]]
            if q >= 0:
                near[q] += 1.0
        best, top = -1, -np.inf
        for q in range(parts):
            if load[q] >= capacity:
                continue
            if fennel:
                score = near[q] - alpha * gamma * load[q] ** (gamma - 1.0)
            else:
                score = near[q] * (1.0 - load[q] / capacity)
            if score > top or (score == top and load[q] < load[best]):
                best, top = q, score
        part[v] = best
        load[best] += 1
    return part


def initial_owners(graph: DynamicGraph, parts: int, strategy: Strategy) -> np.ndarray:
    """The partition of each slot of ``graph`` (-1 for free slots) by ``strategy``:
    `metis_parts`, ``id % P`` or `stream_parts`."""
    check_strategy(strategy)
    if strategy == "metis":
        return metis_parts(graph, parts)
    if strategy == "stream":
        return stream_parts(graph, parts)
    out = np.full(graph.num_slots, -1, np.int64)
    live = graph.vertex_slots()
    out[live] = graph.ext[live] % parts
    return out


class Placement:
    def __init__(self, part: np.ndarray, holders: np.ndarray, num_partitions: int,
                 strategy: Strategy = "metis", refresh_every: int = 500_000) -> None:
        check_strategy(strategy)
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
        """Owners for the graph as it is (`initial_owners`), and the ghosts its edges
        imply."""
        part = initial_owners(graph, num_partitions, strategy)
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
        coordinator's ``graph``) into each partition's batch, placing the vertices it added."""
        self._fit(graph.num_slots)
        self._since_refresh += updates
        if self._since_refresh >= self.refresh_every:
            degrees = graph.in_degree[graph.vertex_slots()]
            self.high_cut = 2.0 * float(degrees.mean()) if len(degrees) else 0.0
            self._since_refresh = 0
        placed = self._place(graph, diff)
        out = graph.out.arrays
        e = diff.edges
        (owner, op, a, b, w, xfrom, ghost_src, ghost_at, drop_src, drop_at) = _items(
            e.src, e.dst, e.before, e.after, diff.removed, diff.added, placed, diff.changed,
            self.part, self.holders, self._load, out[0], out[1], out[3])
        n = self.num_partitions
        read, bounds, xbounds, *columns = _split(owner, op, a, b, w, xfrom, n, graph.ext,
                                                 graph.x)
        assert read == (len(b), len(w), len(xfrom)), "items and their columns out of step"
        op, a, b, w, xrow, xs = columns
        ext = graph.ext  # (ghosts go to their holder, (un)subscriptions to the owner)
        ghosts = _by_partition(*_grouped(ghost_at, ghost_src, self.part[ghost_src], n, ext))
        subscribed = _by_partition(*_grouped(self.part[ghost_src], ghost_src, ghost_at, n,
                                             ext))
        unsubscribed = _by_partition(*_grouped(self.part[drop_src], drop_src, drop_at, n,
                                               ext))
        cut, xcut = bounds.tolist(), xbounds.tolist()  # (Python ints slice quicker)
        return [Routed(UpdateBatch.unchecked(
            op[cut[q]:cut[q + 1]], a[cut[q]:cut[q + 1]], b[cut[q]:cut[q + 1]],
            w[cut[q]:cut[q + 1]], xrow[cut[q]:cut[q + 1]], xs[xcut[q]:xcut[q + 1]]),
            *ghosts[q], *subscribed[q], *unsubscribed[q]) for q in range(n)]

    def _place(self, graph: DynamicGraph, diff: GraphDiff) -> np.ndarray:
        """Owners for the vertices ``diff`` added (sorted: `GraphDiff`)."""
        if self.strategy == "hash":
            return graph.ext[diff.added] % self.num_partitions
        e = diff.edges
        return _alg1(e.src, e.dst, e.after, diff.added, graph.in_degree, self.high_cut,
                     self.part, self._load)

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
    edges, the slot ``xfrom`` whose features added vertices and new features carry) as
    each partition's columns of an `UpdateBatch`, partitions one after the other and
    each's items in the given order: how many of ``b``, ``w`` and ``xfrom`` it read, the
    bounds of each partition's items and of its feature rows, then op, a, b (external
    ids; 0 where absent), w, xrow (into the partition's rows) and x."""
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
    x_out = np.empty((xbounds[-1], x.shape[1]), np.float32)  # (each row written below)
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
            copy_row(x_out, r, x, xfrom[kx])
            kx += 1
    return (kb, kw, kx), bounds, xbounds, op_out, a_out, b_out, w_out, xrow, x_out


@njit(cache=True)
def _grouped(to, slots, other, parts, ext):
    """Pairs (``slots``, ``other`` partition) grouped by the partition each goes ``to``,
    in order within each: the bounds of each partition's, the external ids, the other
    partitions."""
    bounds = np.zeros(parts + 1, np.int64)
    for q in to:
        bounds[q + 1] += 1
    bounds = np.cumsum(bounds)
    at = bounds[:-1].copy()
    ids, others = np.empty(len(to), np.int64), np.empty(len(to), np.int64)
    for k in range(len(to)):
        i = at[to[k]]
        at[to[k]] += 1
        ids[i], others[i] = ext[slots[k]], other[k]
    return bounds, ids, others


def _by_partition(bounds: np.ndarray, ids: np.ndarray, others: np.ndarray
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each partition's pairs of `_grouped`'s."""
    return [(ids[i:j], others[i:j]) for i, j in itertools.pairwise(bounds.tolist())]


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
        flag = holder_bit(p)
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
        flag = holder_bit(p)
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
def _first_neighbors(src, dst, after, added):
    """For each of the vertices ``added`` (sorted), the first neighbor, in the order of
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
def _alg1(src, dst, after, added, in_degree, high_cut, part, load):
    """Alg. 1's owners for the vertices ``added`` (sorted) by the net edge changes ``src
    -> dst`` (existing after the batch where ``after`` is not NaN): the owner of a
    vertex's first neighbor (`_first_neighbors`) whose ``in_degree`` is above
    ``high_cut``; else, in turn, the least-loaded partition counting those (``load``: the
    vertices per partition before the batch; not changed)."""
    first = _first_neighbors(src, dst, after, added)
    out = np.full(len(added), -1, np.int64)
    load = load.copy()
    for i in range(len(added)):
        if first[i] >= 0 and in_degree[first[i]] > high_cut:
            out[i] = part[first[i]]
            load[out[i]] += 1
    for i in range(len(added)):
        if out[i] < 0:
            out[i] = np.argmin(load)
            load[out[i]] += 1
    return out


@njit(cache=True)
def _items(src, dst, before, after, removed, added, placed, changed, part, holders, load,
           start, deg, nbr):
    """The routed items of a batch whose net edge changes are ``src -> dst`` (weights
    ``before`` / ``after``, NaN where absent), that removed the vertices ``removed`` and
    added ``added`` (owners ``placed``) and changed the features of ``changed``: the
    placement (``part``, ``holders``, ``load``) updated for them, and the items for
    `_split` in the order every graph accepts: edge deletions between live vertices,
    weight updates, the removed vertices at their owner and every holder (a vertex's in
    partition order), ghosts no edge needs any more (`_release`, by the out-adjacency
    ``start``/``deg``/``nbr`` after the batch), the added vertices, the feature changes
    (at the owner and every partition holding the vertex before and after the batch: a
    ghost's features come with the batch, not through the exchange), the new ghosts
    (`_hold`, with their features) and the new edges. Returns owner, op and a of each
    item, b of the edges, w of the added and updated ones, the feature sources of the
    vertex items, then the new ghosts and the dropped ones (slot, partition)."""
    m = len(src)
    gone = np.sort(removed.astype(np.int64))
    dst_part = np.empty(m, np.int64)  # before the batch's removals: where each edge lived
    src_lives, dst_lives = np.empty(m, np.bool_), np.empty(m, np.bool_)
    for k in range(m):
        dst_part[k] = part[dst[k]]
        src_lives[k] = sorted_position(gone, np.int64(src[k])) < 0
        dst_lives[k] = sorted_position(gone, np.int64(dst[k])) < 0
    gone_part, gone_holders = part[removed], holders[removed]
    for v in removed:
        load[part[v]] -= 1
        part[v], holders[v] = -1, 0
    for i in range(len(added)):
        holders[added[i]] = 0
        part[added[i]] = placed[i]
        load[placed[i]] += 1
    had, has = ~np.isnan(before), ~np.isnan(after)
    new = np.flatnonzero(has & ~had)
    new_src = src[new].astype(np.int64)
    held_before = holders[changed]
    new_owner = np.empty(len(new), np.int64)
    for i in range(len(new)):
        new_owner[i] = part[dst[new[i]]]
    ghost_src, ghost_at = _hold(new_src, new_owner, part, holders)
    lost = np.flatnonzero(had & ~has & src_lives)
    drop_src, drop_at = _release(src[lost].astype(np.int64), dst_part[lost], part, holders,
                                 start, deg, nbr)
    parts = len(load)
    featured = len(added) + parts * len(changed) + len(ghost_src)
    size = 2 * m + parts * len(removed) + len(drop_src) + featured
    owner, op, a = np.empty(size, np.int64), np.empty(size, np.int8), np.empty(size, np.int64)
    b, w = np.empty(m, np.int64), np.empty(m, np.float32)
    xfrom = np.empty(featured, np.int64)
    n = nb = nw = nx = 0
    for k in range(m):  # deletions between live vertices (the rest: cascades)
        if had[k] and not has[k] and src_lives[k] and dst_lives[k]:
            owner[n], op[n], a[n], b[nb] = part[dst[k]], DELETE_EDGE, src[k], dst[k]
            n, nb = n + 1, nb + 1
    for k in range(m):
        if had[k] and has[k]:
            owner[n], op[n], a[n] = part[dst[k]], UPDATE_EDGE, src[k]
            b[nb], w[nw] = dst[k], after[k]
            n, nb, nw = n + 1, nb + 1, nw + 1
    for i in range(len(removed)):
        for q in range(parts):
            if q == gone_part[i] or _holds(gone_holders[i], q):
                owner[n], op[n], a[n] = q, DELETE_VERTEX, removed[i]
                n += 1
    for i in range(len(drop_src)):
        owner[n], op[n], a[n] = drop_at[i], DELETE_VERTEX, drop_src[i]
        n += 1
    for v in added:
        owner[n], op[n], a[n], xfrom[nx] = part[v], ADD_VERTEX, v, v
        n, nx = n + 1, nx + 1
    for i in range(len(changed)):
        v = changed[i]
        for q in range(parts):
            if q == part[v] or (_holds(held_before[i], q) and _holds(holders[v], q)):
                owner[n], op[n], a[n], xfrom[nx] = q, UPDATE_FEATURES, v, v
                n, nx = n + 1, nx + 1
    for i in range(len(ghost_src)):
        owner[n], op[n], a[n], xfrom[nx] = ghost_at[i], ADD_VERTEX, ghost_src[i], ghost_src[i]
        n, nx = n + 1, nx + 1
    for i, k in enumerate(new):
        owner[n], op[n], a[n] = new_owner[i], ADD_EDGE, src[k]
        b[nb], w[nw] = dst[k], after[k]
        n, nb, nw = n + 1, nb + 1, nw + 1
    return (owner[:n], op[:n], a[:n], b[:nb], w[:nw], xfrom[:nx], ghost_src, ghost_at,
            drop_src, drop_at)


@njit(cache=True, inline="always")
def holder_bit(q):
    """Partition ``q``'s bit in a holder mask, in a kernel (`bit` outside one)."""
    return np.uint64(1) << np.uint64(q)


@njit(cache=True, inline="always")
def _holds(mask, q) -> bool:
    """Whether the holder mask ``mask`` includes partition ``q``."""
    return (mask & holder_bit(q)) != 0
