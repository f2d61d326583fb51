"""`Adjacency`: one direction of a dynamic graph's edges (out- or in-lists) as per-vertex
blocks with slack inside shared numpy arrays; single-edge operations are numba functions
that other kernels call, batch reads are vectorised.

A vertex's neighbors live in ``nbr[start[v] : start[v] + deg[v]]`` (weights alongside in
``w``) with room for ``room[v]``; a full block moves to the end of the arrays with
half again the room, and the arrays are compacted when they run out. Order inside a block is not
meaningful (deletion swaps in the last entry). A deleted vertex keeps its (empty) block
for whoever reuses its slot.

Owns the block layout only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.allocator import lengthened
from streamgnn.prefetch import AHEAD, prefetch

_MIN_ROOM = 4  # room of a block that moves, at least


@njit(cache=True, inline="always")
def _grown(room):
    return max(_MIN_ROOM, room + room // 2)


@njit(cache=True)
def find1(adj, u, v) -> int:
    """Array position of u's entry for v, or -1. ``adj`` is (start, deg, room, nbr, w, end)."""
    start, deg, _, nbr, _, _ = adj
    s = start[u]
    for k in range(s, s + deg[u]):
        if nbr[k] == v:
            return k
    return -1


@njit(cache=True)
def prefetch_head(adj, u) -> None:
    """Ask for u's block bounds (a hint, first of two)."""
    start, deg, room, _, _, _ = adj
    prefetch(start.ctypes.data + u * start.itemsize)
    prefetch(deg.ctypes.data + u * deg.itemsize)
    prefetch(room.ctypes.data + u * room.itemsize)


@njit(cache=True)
def prefetch_block(adj, u) -> None:
    """Ask for the start of u's block (second hint, once its bounds are cached)."""
    start, _, _, nbr, w, _ = adj
    prefetch(nbr.ctypes.data + start[u] * nbr.itemsize)
    prefetch(w.ctypes.data + start[u] * w.itemsize)


@njit(cache=True)
def has_room1(adj, u) -> bool:
    """Can u take one more entry without compacting the arrays?"""
    _, deg, room, nbr, _, end = adj
    return deg[u] < room[u] or end[0] + _grown(room[u]) <= len(nbr)


@njit(cache=True)
def insert1(adj, u, v, wt) -> None:
    """Append u -> v (absent, and ``has_room1`` holds)."""
    start, deg, room, nbr, w, end = adj
    if deg[u] == room[u]:
        new_room = _grown(room[u])
        s, e = start[u], end[0]
        for k in range(deg[u]):
            nbr[e + k] = nbr[s + k]
            w[e + k] = w[s + k]
        start[u] = e
        room[u] = new_room
        end[0] = e + new_room
    p = start[u] + deg[u]
    nbr[p] = v
    w[p] = wt
    deg[u] += 1


@njit(cache=True)
def remove1(adj, u, v) -> float:
    """Remove u -> v (present); returns its weight."""
    start, deg, _, nbr, w, _ = adj
    p = find1(adj, u, v)
    old = w[p]
    last = start[u] + deg[u] - 1
    nbr[p] = nbr[last]
    w[p] = w[last]
    deg[u] -= 1
    return old


@njit(cache=True)
def _find_many(adj, us, vs, out):
    for i in range(len(us)):
        out[i] = find1(adj, us[i], vs[i])


@njit(cache=True)
def _gather(adj, vertices, ptr, out_nbr, out_w):
    start, _, _, nbr, w, _ = adj
    for i in range(len(vertices)):
        if i + AHEAD < len(vertices):  # the block read AHEAD vertices on
            prefetch_block(adj, vertices[i + AHEAD])
        s, p = start[vertices[i]], ptr[i]
        for k in range(ptr[i + 1] - p):
            out_nbr[p + k] = nbr[s + k]
            out_w[p + k] = w[s + k]


@njit(cache=True)
def entries_except(adj, vertices, skip):
    """The entries of ``vertices`` (int64) in the adjacency arrays ``adj`` except the pairs
    whose `pair_keys` are in sorted ``skip`` (int64), COO-style: (position of the owner in
    ``vertices``, neighbor, weight). Where ``vertices`` ascend, one walk along ``skip``
    finds each one's skipped pairs; else a search each."""
    start, deg, _, nbr, w, _ = adj
    total = 0
    for i in range(len(vertices)):
        total += deg[vertices[i]]
    at = np.empty(total, np.int64)
    out_nbr = np.empty(total, np.int64)
    out_w = np.empty(total, np.float32)
    ascending = True  # then the skipped pairs' runs are found by one walk along them
    for i in range(1, len(vertices)):
        if vertices[i] <= vertices[i - 1]:
            ascending = False
            break
    n = j = 0
    for i in range(len(vertices)):
        if i + 2 * AHEAD < len(vertices):  # the block's bounds, then the block itself
            prefetch_head(adj, vertices[i + 2 * AHEAD])
        if i + AHEAD < len(vertices):
            prefetch_block(adj, vertices[i + AHEAD])
        u = vertices[i]
        # the skipped pairs out of u: a run of the sorted keys
        if ascending:
            while j < len(skip) and skip[j] < u << 32:
                j += 1
            lo = hi = j
            while hi < len(skip) and skip[hi] < (u + 1) << 32:
                hi += 1
        else:
            lo = np.searchsorted(skip, u << 32) if len(skip) else 0
            hi = np.searchsorted(skip, (u + 1) << 32) if lo < len(skip) else lo
        for k in range(start[u], start[u] + deg[u]):
            if lo < hi:
                key = (u << 32) | nbr[k]
                q = lo + np.searchsorted(skip[lo:hi], key)
                if q < hi and skip[q] == key:
                    continue
            at[n], out_nbr[n], out_w[n] = i, nbr[k], w[k]
            n += 1
    return at[:n], out_nbr[:n], out_w[:n]


@njit(cache=True)
def weight_sum1(adj, v) -> float:
    """Sum of ``v``'s block weights, accumulated in float64."""
    start, deg, _, _, w, _ = adj
    acc = 0.0
    for k in range(start[v], start[v] + deg[v]):
        acc += w[k]
    return acc


@njit(cache=True)
def _compact(adj, new_nbr, new_w):
    start, deg, room, nbr, w, _ = adj
    end = 0
    for v in range(len(start)):
        s, d = start[v], deg[v]
        for k in range(d):
            new_nbr[end + k] = nbr[s + k]
            new_w[end + k] = w[s + k]
        start[v] = end
        room[v] = d + d // 4
        end += room[v]
    return end


def pair_keys(owner: np.ndarray, nbr: np.ndarray) -> np.ndarray:
    """One int64 per (owner, neighbor) pair: owner << 32 | neighbor."""
    return (np.asarray(owner, np.int64) << 32) | np.asarray(nbr, np.int64)


class Adjacency:
    """One direction of the edges: ``neighbors(v)`` are out-neighbors for the out side."""

    def __init__(self, vertex_capacity: int) -> None:
        self.start = np.zeros(vertex_capacity, np.int64)
        self.deg = np.zeros(vertex_capacity, np.int32)
        self.room = np.zeros(vertex_capacity, np.int32)
        self.nbr = np.zeros(0, np.int32)
        self.w = np.zeros(0, np.float32)
        self.end = np.zeros(1, np.int64)

    @classmethod
    def from_sorted(cls, vertex_capacity: int, owner: np.ndarray, nbr: np.ndarray,
                    w: np.ndarray) -> Adjacency:
        """Bulk build from edges sorted by ``owner``; blocks are exactly full."""
        adj = cls(vertex_capacity)
        deg = np.bincount(owner, minlength=vertex_capacity).astype(np.int32)
        adj.deg[:] = deg
        adj.room[:] = deg
        adj.start[1:] = np.cumsum(deg[:-1], dtype=np.int64)
        adj.nbr = np.ascontiguousarray(nbr, np.int32)
        adj.w = np.ascontiguousarray(w, np.float32)
        adj.end[0] = len(nbr)
        return adj

    FIELDS = ("start", "deg", "room", "nbr", "w", "end")

    @classmethod
    def from_arrays(cls, arrays) -> Adjacency:
        """The adjacency whose `arrays` these are (adopted, not copied)."""
        adj = cls(0)
        for name, a in zip(cls.FIELDS, arrays, strict=True):
            setattr(adj, name, a)
        return adj

    @property
    def arrays(self) -> tuple:
        """The state as the tuple the numba functions take."""
        return self.start, self.deg, self.room, self.nbr, self.w, self.end

    def grow_vertices(self, capacity: int) -> None:
        for name in ("start", "deg", "room"):
            setattr(self, name, lengthened(getattr(self, name), capacity))

    @property
    def num_edges(self) -> int:
        return int(self.deg.sum())

    def find(self, us: np.ndarray, vs: np.ndarray) -> np.ndarray:
        """Array position of each edge u -> v, -1 where absent."""
        out = np.empty(len(us), np.int64)
        _find_many(self.arrays, np.ascontiguousarray(us, np.int64),
                   np.ascontiguousarray(vs, np.int64), out)
        return out

    def gather(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Neighbor lists of ``vertices`` concatenated: (ptr, nbr, w), CSR-style."""
        vertices = np.ascontiguousarray(vertices, np.int64)
        ptr = np.zeros(len(vertices) + 1, np.int64)
        np.cumsum(self.deg[vertices], out=ptr[1:])
        nbr = np.empty(ptr[-1], np.int32)
        w = np.empty(ptr[-1], np.float32)
        _gather(self.arrays, vertices, ptr, nbr, w)
        return ptr, nbr, w

    def make_room(self, pending: int) -> None:
        """Compact into arrays with a quarter more space than the blocks need, plus room
        for ``pending`` inserts."""
        used = int(self.deg.sum()) + int((self.deg // 4).sum())
        capacity = (5 * used) // 4 + 2 * pending + 64
        new_nbr = np.zeros(capacity, np.int32)
        new_w = np.zeros(capacity, np.float32)
        self.end[0] = _compact(self.arrays, new_nbr, new_w)
        self.nbr, self.w = new_nbr, new_w

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)
