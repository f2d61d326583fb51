"""`SlotSets`: sorted unions of vertex-slot sets and positions within them, the index work
of every superstep. Marks scratch arrays as long as the graph's slots (numba), so a union
costs the size of its inputs (or one scan of the marks, when that is less than a sort).

Owns these set operations only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.graph.batch import sorted_position


@njit(cache=True)
def union_marked(values, mark, alive, live_only):
    """The distinct ``values`` sorted (those ``alive`` only, with ``live_only``), found with
    ``mark`` (all false before and after; a length that is a multiple of 8)."""
    out = np.empty(len(values), np.int64)
    n = 0
    for x in values:
        if not mark[x] and (not live_only or alive[x]):
            mark[x] = True
            out[n] = x
            n += 1
    if n * 256 < len(mark):  # few: sort them (even with a scan at ~900 of 169K, ~7K of 2.45M)
        out = np.sort(out[:n])
        for x in out:
            mark[x] = False
        return out
    k = 0  # many: a scan of the marks, 8 at a time, is quicker than a sort
    words = mark.view(np.uint64)  # (marks come in multiples of 8: `SlotSets.fit`)
    for i in range(len(words)):
        if words[i]:
            for x in range(8 * i, 8 * i + 8):
                if mark[x]:
                    mark[x] = False
                    out[k] = x
                    k += 1
    return out[:n]


@njit(cache=True)
def _positions(members, queries, scratch):
    for i in range(len(members)):
        scratch[members[i]] = i
    out = np.empty(len(queries), np.int64)
    for j in range(len(queries)):
        out[j] = scratch[queries[j]]
    return out


@njit(cache=True)
def find_marked(members, queries, scratch, mark):
    """`SlotSets.find`'s kernel (int64 slots; numba kernels call it)."""
    for i in range(len(members)):
        scratch[members[i]] = i
        mark[members[i]] = True
    out = np.empty(len(queries), np.int64)
    for j in range(len(queries)):
        out[j] = scratch[queries[j]] if mark[queries[j]] else -1
    for i in range(len(members)):
        mark[members[i]] = False
    return out


@njit(cache=True)
def remote_pairs(sources, at, v1, src2, dst2, had, has, owned, ghost, owner, bits):
    """How many distinct (destination, ``owner`` of the source) pairs the edges
    ``sources[at] -> v1`` and the changed edges ``src2 -> dst2`` that existed (``had``) or
    exist (``has``) into an ``owned`` destination make, counting edges whose source is a
    ``ghost`` (owners in 0..63; ``bits``: int64 scratch, one per slot)."""
    for d in v1:
        bits[d] = 0
    for d in dst2:
        bits[d] = 0
    n = 0
    for k in range(len(at) + len(src2)):
        if k < len(at):
            s, d = sources[at[k]], v1[k]
        elif (had[k - len(at)] or has[k - len(at)]) and owned[dst2[k - len(at)]]:
            s, d = src2[k - len(at)], dst2[k - len(at)]
        else:
            continue
        if ghost[s]:
            tag = np.int64(1) << owner[s]
            if not bits[d] & tag:
                bits[d] |= tag
                n += 1
    return n


@njit(cache=True)
def _find_in_runs(members, split, queries):
    out = np.empty(len(queries), np.int64)
    for j in range(len(queries)):
        i = sorted_position(members[:split], queries[j])
        if i < 0:
            i = sorted_position(members[split:], queries[j])
            i = i + split if i >= 0 else i
        out[j] = i
    return out


def marked(size: int, slots: np.ndarray) -> np.ndarray:
    """A mask over ``size`` slots, true at ``slots`` (membership without sorting)."""
    mask = np.zeros(size, bool)
    mask[slots] = True
    return mask


class SlotSets:
    """Set operations on slots below ``size`` (grown with `fit`). ``scratch`` (int64, one
    per slot, contents meaningless between calls) and ``mark`` (bool, one per slot, all
    false between calls) may be borrowed by other kernels."""

    def __init__(self, size: int) -> None:
        self.mark = np.zeros(0, bool)
        self.scratch = np.zeros(0, np.int64)
        self.fit(size)

    def fit(self, size: int) -> None:
        """Make room for slots below ``size`` (the scratch arrays hold nothing between calls,
        so new ones do)."""
        if size > len(self.mark):
            size += -size % 8  # marks are scanned 8 at a time
            self.mark = np.zeros(size, bool)
            self.scratch = np.zeros(size, np.int64)

    def union(self, *sets: np.ndarray, alive: np.ndarray | None = None) -> np.ndarray:
        """Sorted union of ``sets`` (int64); with ``alive``, only slots where it is True."""
        values = np.concatenate(sets, dtype=np.int64)
        return union_marked(values, self.mark, self.mark if alive is None else alive,
                            alive is not None)

    def positions(self, members: np.ndarray, queries: np.ndarray) -> np.ndarray:
        """Position in ``members`` (distinct slots) of each query, all of which must be
        members."""
        return _positions(np.asarray(members, np.int64), np.asarray(queries, np.int64),
                          self.scratch)

    def find(self, members: np.ndarray, queries: np.ndarray) -> np.ndarray:
        """Position in ``members`` (distinct slots) of each query, -1 where it is not one."""
        return find_marked(np.asarray(members, np.int64), np.asarray(queries, np.int64),
                           self.scratch, self.mark)

    def find_in_runs(self, members: np.ndarray, split: int, queries: np.ndarray
                     ) -> np.ndarray:
        """`find` where ``members`` ascend before ``split`` and again from it: two binary
        searches a query where the queries are few (`find` marks every member)."""
        if 16 * len(queries) >= len(members):
            return self.find(members, queries)
        return _find_in_runs(np.asarray(members, np.int64), split,
                             np.asarray(queries, np.int64))
