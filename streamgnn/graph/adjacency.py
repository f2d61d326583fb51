"""`Adjacency`: one direction of a dynamic graph's edges (out- or in-lists) as per-vertex
blocks with slack inside shared numpy arrays; the batch operations run in numba.

A vertex's neighbours live in ``nbr[start[v] : start[v] + deg[v]]`` (weights alongside in
``w``) with room for ``room[v]``; a full block moves to the end of the arrays with twice
the room, and the arrays are compacted when moved-out garbage dominates. Order inside a
block is not meaningful (deletion swaps in the last entry).

Owns the block layout only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_SLACK = 2  # spare entries per non-empty block after a compaction


@njit(cache=True, inline="always")
def _find(start, deg, nbr, u, v) -> int:
    s = start[u]
    for k in range(s, s + deg[u]):
        if nbr[k] == v:
            return k
    return -1


@njit(cache=True)
def _find_many(start, deg, nbr, us, vs, out):
    for i in range(len(us)):
        out[i] = _find(start, deg, nbr, us[i], vs[i])


@njit(cache=True)
def _insert_many(start, deg, room, nbr, w, end, us, vs, ws, first):
    """Append (u -> v, w) for i >= first; stop early when the arrays are full.
    Returns (next i to insert, new end)."""
    cap = len(nbr)
    for i in range(first, len(us)):
        u = us[i]
        if deg[u] == room[u]:
            new_room = max(4, 2 * room[u])
            if end + new_room > cap:
                return i, end
            s = start[u]
            for k in range(deg[u]):
                nbr[end + k] = nbr[s + k]
                w[end + k] = w[s + k]
            start[u] = end
            room[u] = new_room
            end += new_room
        p = start[u] + deg[u]
        nbr[p] = vs[i]
        w[p] = ws[i]
        deg[u] += 1
    return len(us), end


@njit(cache=True)
def _remove_many(start, deg, nbr, w, us, vs):
    """Remove edges known to be present."""
    for i in range(len(us)):
        u = us[i]
        p = _find(start, deg, nbr, u, vs[i])
        last = start[u] + deg[u] - 1
        nbr[p] = nbr[last]
        w[p] = w[last]
        deg[u] -= 1


@njit(cache=True)
def _set_many(start, deg, nbr, w, us, vs, ws):
    for i in range(len(us)):
        w[_find(start, deg, nbr, us[i], vs[i])] = ws[i]


@njit(cache=True)
def _gather(start, deg, nbr, w, vertices, ptr, out_nbr, out_w):
    for i in range(len(vertices)):
        s, p = start[vertices[i]], ptr[i]
        for k in range(ptr[i + 1] - p):
            out_nbr[p + k] = nbr[s + k]
            out_w[p + k] = w[s + k]


@njit(cache=True)
def _weight_sums(start, deg, w, vertices, out):
    for i in range(len(vertices)):
        s = start[vertices[i]]
        acc = 0.0
        for k in range(s, s + deg[vertices[i]]):
            acc += w[k]
        out[i] = acc


@njit(cache=True)
def _compact(start, deg, room, nbr, w, new_nbr, new_w, slack):
    end = 0
    for v in range(len(start)):
        s, d = start[v], deg[v]
        for k in range(d):
            new_nbr[end + k] = nbr[s + k]
            new_w[end + k] = w[s + k]
        start[v] = end
        room[v] = d + (slack if d > 0 else 0)
        end += room[v]
    return end


class Adjacency:
    """One direction of the edges: ``neighbours(v)`` are out-neighbours for the out side."""

    def __init__(self, vertex_capacity: int, edge_capacity: int = 0) -> None:
        self.start = np.zeros(vertex_capacity, np.int64)
        self.deg = np.zeros(vertex_capacity, np.int32)
        self.room = np.zeros(vertex_capacity, np.int32)
        self.nbr = np.zeros(edge_capacity, np.int32)
        self.w = np.zeros(edge_capacity, np.float32)
        self.end = 0

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
        adj.end = len(nbr)
        return adj

    def grow_vertices(self, capacity: int) -> None:
        for name in ("start", "deg", "room"):
            old = getattr(self, name)
            new = np.zeros(capacity, old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)

    @property
    def num_edges(self) -> int:
        return int(self.deg.sum())

    def find(self, us: np.ndarray, vs: np.ndarray) -> np.ndarray:
        """Array position of each edge u -> v, -1 where absent."""
        out = np.empty(len(us), np.int64)
        _find_many(self.start, self.deg, self.nbr, us, vs, out)
        return out

    def insert(self, us: np.ndarray, vs: np.ndarray, ws: np.ndarray) -> None:
        """Add edges known to be absent."""
        done = 0
        while done < len(us):
            done, self.end = _insert_many(self.start, self.deg, self.room, self.nbr, self.w,
                                          self.end, us, vs, ws, done)
            if done < len(us):
                self._make_room(len(us) - done)

    def remove(self, us: np.ndarray, vs: np.ndarray) -> None:
        """Remove edges known to be present."""
        _remove_many(self.start, self.deg, self.nbr, self.w, us, vs)

    def set_weights(self, us: np.ndarray, vs: np.ndarray, ws: np.ndarray) -> None:
        _set_many(self.start, self.deg, self.nbr, self.w, us, vs, ws)

    def gather(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Neighbour lists of ``vertices`` concatenated: (ptr, nbr, w), CSR-style."""
        vertices = np.ascontiguousarray(vertices, np.int64)
        ptr = np.zeros(len(vertices) + 1, np.int64)
        np.cumsum(self.deg[vertices], out=ptr[1:])
        nbr = np.empty(ptr[-1], np.int32)
        w = np.empty(ptr[-1], np.float32)
        _gather(self.start, self.deg, self.nbr, self.w, vertices, ptr, nbr, w)
        return ptr, nbr, w

    def weight_sums(self, vertices: np.ndarray) -> np.ndarray:
        """Sum of block weights per vertex, accumulated in float64."""
        out = np.empty(len(vertices), np.float64)
        _weight_sums(self.start, self.deg, self.w, np.ascontiguousarray(vertices, np.int64), out)
        return out

    def clear(self, vertices: np.ndarray) -> None:
        """Forget the (already emptied) blocks of deleted vertices."""
        self.deg[vertices] = 0
        self.room[vertices] = 0

    def _make_room(self, pending: int) -> None:
        """Compact into arrays with half again the space the blocks need."""
        used = int(self.deg.sum()) + _SLACK * int((self.deg > 0).sum())
        capacity = (3 * (used + 2 * pending)) // 2 + 64
        new_nbr = np.zeros(capacity, np.int32)
        new_w = np.zeros(capacity, np.float32)
        self.end = _compact(self.start, self.deg, self.room, self.nbr, self.w, new_nbr, new_w,
                            _SLACK)
        self.nbr, self.w = new_nbr, new_w

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.start, self.deg, self.room, self.nbr, self.w))
