"""Placement: which partition owns each vertex at the start, and each partition's share
of a batch as the `Directory` decided it (`shares`).

Every edge lives with its destination's owner; an edge whose source another partition
owns makes that partition hold the source as a ghost (the owner then sends it the
source's rows). The initial owners come from METIS (pymetis) over the snapshot, from
one streamed pass over its vertices (``stream``), or from ``id % P`` (``hash``); new
vertices are placed by the directory (`Directory.place`).

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

Owns the initial placement and the cutting of a batch into shares; must not import torch,
kafka or mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numba import njit

from streamgnn.graph import DynamicGraph
from streamgnn.graph.directory import EVERY, STRATEGIES, Decided
from streamgnn.updates import (
    ADD_EDGE,
    UpdateBatch,
)

Strategy = Literal["metis", "hash", "stream"]


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
    positions: np.ndarray | None = None  # of ``batch``'s updates in the whole batch


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


@njit(cache=True, inline="always")
def holder_bit(q):
    """Partition ``q``'s bit in a holder mask, in a kernel (`bit` outside one)."""
    return np.uint64(1) << np.uint64(q)


def shares(decided: Decided, batch: UpdateBatch, parts: int,
           released: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[Routed]:
    """Each partition's share of a batch as the `Directory` decided it: its updates in
    batch order (its graph decides their edges: `DynamicGraph.apply` with ``ghosts``);
    as candidate ghosts, the sources of its added edges that another partition owns,
    with that owner; to each owner, the candidates it may now be holding for others
    (``subscribed``: it sends them their rows, whether or not they already held them);
    and ``released`` = (ids, owners, holders): ghosts the holders let go of in the last
    batch (``unsubscribed``)."""
    target, at = decided.target, decided.passed
    order, cut = _grouped(target, parts)  # by partition, then in batch order
    positions = at[order]
    taken = batch[positions]  # every share, one after the other (each a view of it)
    featured = np.concatenate([[0], np.cumsum(taken.xrow >= 0)])[cut].tolist()
    cross = np.flatnonzero((batch.op[at] == ADD_EDGE) & (decided.source_owner != target))
    wanted, wanted_cut = _grouped(target[cross], parts)
    owned, owned_cut = _grouped(decided.source_owner[cross], parts)
    wanted, owned = cross[wanted], cross[owned]
    let_go, let_go_cut = _grouped(released[1], parts)
    ghosts, ghost_owners = batch.src[at[wanted]], decided.source_owner[wanted]
    subscribed, subscribers = batch.src[at[owned]], target[owned]
    unsubscribed, unsubscribers = released[0][let_go], released[2][let_go]
    out = []
    for q in range(parts):
        rows, w = slice(cut[q], cut[q + 1]), slice(wanted_cut[q], wanted_cut[q + 1])
        o, r = slice(owned_cut[q], owned_cut[q + 1]), slice(let_go_cut[q], let_go_cut[q + 1])
        xrow = taken.xrow[rows]
        share = UpdateBatch.unchecked(
            taken.op[rows], taken.src[rows], taken.dst[rows], taken.w[rows],
            np.where(xrow >= 0, xrow - featured[q], xrow), taken.x[featured[q]:featured[q + 1]])
        out.append(Routed(share, ghosts[w], ghost_owners[w], subscribed[o], subscribers[o],
                          unsubscribed[r], unsubscribers[r], positions[rows]))
    return out


def _grouped(keys: np.ndarray, parts: int) -> tuple[np.ndarray, list[int]]:
    """Positions into ``keys`` (partitions, or `EVERY`: each of them) grouped by
    partition, in order within each, and each group's bounds."""
    out, bounds = _counting_sort(keys, parts)
    return out, bounds.tolist()


@njit(cache=True)
def _counting_sort(keys, parts):
    bounds = np.zeros(parts + 1, np.int64)
    every = 0
    for k in keys:
        if k == EVERY:
            every += 1
        else:
            bounds[k + 1] += 1
    for q in range(parts):
        bounds[q + 1] += bounds[q] + every
    out = np.empty(bounds[parts], np.int64)
    fill = bounds[:parts].copy()
    for i in range(len(keys)):
        k = keys[i]
        first, last = (0, parts) if k == EVERY else (k, k + 1)
        for q in range(first, last):
            out[fill[q]] = i
            fill[q] += 1
    return out, bounds
