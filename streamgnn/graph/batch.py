"""The batch kernel: validates and applies a batch of updates strictly in order inside
numba, writing an undo log; and the kernel that rolls a log back.

The log is one sequence of primitive changes (kind, i0, i1, f0, f1):
  EDGE  i0 -> i1 (slots), weight f0 before and f1 after (NaN: absent)
  VADD  slot i0 got external id i1          VDEL  slot i0 (id i1) was deleted
  FEAT  slot i0's old features are row i1 of ``xsave``
Owns these kernels (their input is an `UpdateBatch`); must not import torch, kafka or
mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.graph.adjacency import (
    find1,
    has_room1,
    insert1,
    prefetch_block,
    prefetch_head,
    remove1,
    weight_sum1,
)
from streamgnn.graph.idmap import del1, get1, prefetch_cell, prefetch_key, put1
from streamgnn.prefetch import prefetch_row
from streamgnn.updates import (
    ADD_EDGE,
    ADD_VERTEX,
    BAD_WIDTH,
    DELETE_EDGE,
    DELETE_VERTEX,
    UPDATE_EDGE,
    UPDATE_FEATURES,
)

EDGE, VADD, VDEL, FEAT = range(4)

# Status codes returned by apply_kernel with the index of the update they concern.
(OK, UNKNOWN_A, UNKNOWN_B, DUPLICATE_VERTEX, UNKNOWN_EDGE, DUPLICATE_EDGE, SELF_LOOP,
 BAD_DIMENSION, BAD_X, BAD_W, NEED_ROOM_OUT, NEED_ROOM_IN) = range(12)
# BAD_X / BAD_W: a feature value / weight that is NaN, inf or past the graph's limits.


@njit(cache=True)
def _row_within(x, r, limit) -> bool:
    """Whether every value of row ``r`` is finite and at most ``limit`` in size (a loop:
    no temporary arrays)."""
    for c in range(x.shape[1]):  # noqa: SIM110 (numba compiles no generator expression)
        if not abs(x[r, c]) <= limit:  # (NaN fails it too)
            return False
    return True


@njit(cache=True, inline="always")
def copy_row(to, i, source, j) -> None:
    """``to[i] = source[j]``, as a loop (a slice assignment costs numba views and an
    overlap check per row)."""
    for c in range(to.shape[1]):
        to[i, c] = source[j, c]


@njit(cache=True)
def _log(log, kind, i0, i1, f0, f1) -> None:
    kinds, ints, floats, n = log
    k = n[0]
    kinds[k] = kind
    ints[k, 0], ints[k, 1] = i0, i1
    floats[k, 0], floats[k, 1] = f0, f1
    n[0] = k + 1


@njit(cache=True, inline="always")
def take_slot(free, counts, used) -> int:
    """A slot: the last freed one (``counts[0]`` of them on the stack ``free``), else the
    next never used (``counts[used]`` so far)."""
    if counts[0] > 0:
        counts[0] -= 1
        return free[counts[0]]
    counts[used] += 1
    return counts[used] - 1


@njit(cache=True)
def _new_slot(ids, key, alive, free, counts, log) -> int:
    """A slot for vertex ``key`` (a freed one, else the next), mapped and logged."""
    u = take_slot(free, counts, 2)
    put1(ids, key, u)
    alive[u] = True
    _log(log, VADD, u, key, np.nan, np.nan)
    return u


@njit(cache=True)
def _drop_edge(out, inn, u, v, log) -> None:
    w = remove1(out, u, v)
    remove1(inn, v, u)
    _log(log, EDGE, u, v, w, np.nan)


@njit(cache=True, inline="always")
def _look_ahead(enc, i, ids, x, out, inn) -> None:
    """Memory hints for the updates ahead of update ``i``, in stages as each needs what
    the last brought: their ids' hash cells (16 on), the ids in those cells (8 on), their
    vertices' block bounds (4 on), the blocks and feature rows (2 on). Each update's
    lookups otherwise miss the cache one after the other, each waiting on the last."""
    op, a, b = enc[0], enc[1], enc[2]
    k = i + 16
    if k < len(op):
        prefetch_cell(ids, a[k])
        if op[k] <= UPDATE_EDGE:
            prefetch_cell(ids, b[k])
    k = i + 8
    if k < len(op):
        prefetch_key(ids, a[k])
        if op[k] <= UPDATE_EDGE:
            prefetch_key(ids, b[k])
    for k, last in ((i + 4, False), (i + 2, True)):
        if k >= len(op):
            continue
        u = get1(ids, a[k])
        v = get1(ids, b[k]) if op[k] <= UPDATE_EDGE else u
        if u < 0 or v < 0:
            continue
        if not last:
            prefetch_head(out, u)
            prefetch_head(inn, v)
        elif op[k] <= DELETE_VERTEX:
            prefetch_block(out, u)
            prefetch_block(inn, v)
        else:
            prefetch_row(x, u)


@njit(cache=True)
def batch_sizes(op, a, ids, out_deg, in_deg):
    """What a batch's log must hold room for: its updates per op code, and the edges of
    the existing vertices it deletes (each may cascade to all of them)."""
    counts = np.zeros(UPDATE_FEATURES + 1, np.int64)  # (the last op code)
    cascade = 0
    for i in range(len(op)):
        counts[op[i]] += 1
        if op[i] == DELETE_VERTEX:
            v = get1(ids, a[i])
            if v >= 0:
                cascade += out_deg[v] + in_deg[v]
    return counts, cascade


@njit(cache=True)
def apply_kernel(enc, first, ids, verts, out, inn, log, xsave, limits, ghosts=False):
    """Apply updates ``first..`` in order. ``enc`` = the `UpdateBatch` columns (op, a, b,
    w, xrow, x); ``ids`` the IdMap table; ``verts`` = (alive, x, free, limbo,
    counts[free_top, limbo_top, num_slots, xsave_n]); ``limits`` = (largest |feature|,
    largest |weight|). Returns (status, index): OK, an error
    for update ``index`` (nothing of it applied), or NEED_ROOM_* (the caller compacts and
    resumes at index). With ``ghosts`` the graph is one partition's (a `Directory`
    decided the vertex questions): an edge added from a vertex it does not hold adds that
    vertex as a ghost (features zero until its owner sends them), an edge deleted or
    updated from one is unknown, and the deletion of a vertex it does not hold is
    another partition's."""
    op, a, b, w, xrow, xnew = enc
    alive, x, free, limbo, counts = verts
    for i in range(first, len(op)):
        _look_ahead(enc, i, ids, x, out, inn)
        code = op[i]
        if code <= UPDATE_EDGE:
            u = get1(ids, a[i])
            if u < 0 and not ghosts:
                return UNKNOWN_A, i
            if u < 0 and code != ADD_EDGE:
                return UNKNOWN_EDGE, i
            if u < 0:
                u = _new_slot(ids, a[i], alive, free, counts, log)
                x[u] = 0.0
            v = get1(ids, b[i])
            if v < 0:
                return UNKNOWN_B, i
            if code != DELETE_EDGE and not abs(w[i]) <= limits[1]:
                return BAD_W, i
            if code == ADD_EDGE:
                if u == v:
                    return SELF_LOOP, i
                if find1(out, u, v) >= 0:
                    return DUPLICATE_EDGE, i
                if not has_room1(out, u):
                    return NEED_ROOM_OUT, i
                if not has_room1(inn, v):
                    return NEED_ROOM_IN, i
                insert1(out, u, v, w[i])
                insert1(inn, v, u, w[i])
                _log(log, EDGE, u, v, np.nan, w[i])
                continue
            p = find1(out, u, v)
            if p < 0:
                return UNKNOWN_EDGE, i
            if code == DELETE_EDGE:
                _drop_edge(out, inn, u, v, log)
            else:
                old = out[4][p]
                out[4][p] = w[i]
                inn[4][find1(inn, v, u)] = w[i]
                _log(log, EDGE, u, v, old, w[i])
        elif code == DELETE_VERTEX:
            u = get1(ids, a[i])
            if u < 0 and ghosts:
                continue
            if u < 0:
                return UNKNOWN_A, i
            while out[1][u] > 0:
                _drop_edge(out, inn, u, out[3][out[0][u]], log)
            while inn[1][u] > 0:
                _drop_edge(out, inn, inn[3][inn[0][u]], u, log)
            del1(ids, a[i])
            alive[u] = False
            limbo[counts[1]] = u
            counts[1] += 1
            _log(log, VDEL, u, a[i], np.nan, np.nan)
        else:
            r = xrow[i]
            if r == BAD_WIDTH:
                return BAD_DIMENSION, i
            if not _row_within(xnew, r, limits[0]):
                return BAD_X, i
            u = get1(ids, a[i])
            if code == ADD_VERTEX:
                if u >= 0:
                    return DUPLICATE_VERTEX, i
                u = _new_slot(ids, a[i], alive, free, counts, log)
                copy_row(x, u, xnew, r)
            else:
                if u < 0:
                    return UNKNOWN_A, i
                k = counts[3]
                copy_row(xsave, k, x, u)
                counts[3] += 1
                copy_row(x, u, xnew, r)
                _log(log, FEAT, u, k, np.nan, np.nan)
    return OK, len(op)


@njit(cache=True)
def undo_kernel(ids, verts, out, inn, log, xsave) -> int:
    """Roll back logged changes, newest first, and empty the log. Returns OK, or
    NEED_ROOM_* with the log cut to what is left (the caller compacts and calls again)."""
    alive, x, free, _, counts = verts
    kinds, ints, floats, n = log
    for k in range(n[0] - 1, -1, -1):
        kind, i0, i1 = kinds[k], ints[k, 0], ints[k, 1]
        if kind == EDGE:
            before, after = floats[k, 0], floats[k, 1]
            if np.isnan(before):
                remove1(out, i0, i1)
                remove1(inn, i1, i0)
            elif np.isnan(after):
                if not has_room1(out, i0):
                    n[0] = k + 1
                    return NEED_ROOM_OUT
                if not has_room1(inn, i1):
                    n[0] = k + 1
                    return NEED_ROOM_IN
                insert1(out, i0, i1, before)
                insert1(inn, i1, i0, before)
            else:
                out[4][find1(out, i0, i1)] = before
                inn[4][find1(inn, i1, i0)] = before
        elif kind == VADD:
            del1(ids, i1)
            alive[i0] = False
            free[counts[0]] = i0
            counts[0] += 1
        elif kind == VDEL:
            put1(ids, i1, i0)
            alive[i0] = True
            counts[1] -= 1
        else:
            copy_row(x, i0, xsave, i1)
    n[0] = 0
    return OK


@njit(cache=True)
def stable_order(keys):
    """The positions of the non-negative int64 ``keys`` in key order, equal keys in
    position order (as a stable argsort orders them): a radix sort, a byte at a time from
    the lowest, skipping bytes every key shares (quicker than numba's argsort)."""
    n = len(keys)
    order, spare = np.arange(n), np.empty(n, np.int64)
    counts = np.empty(257, np.int64)
    top = keys.max() if n else 0
    shift = 0
    while shift < 63 and top >> shift > 0:
        counts[:] = 0
        for i in range(n):
            counts[((keys[i] >> shift) & 255) + 1] += 1
        if counts.max() < n:
            for d in range(256):
                counts[d + 1] += counts[d]
            for i in range(n):
                p = order[i]
                d = (keys[p] >> shift) & 255
                spare[counts[d]] = p
                counts[d] += 1
            order, spare = spare, order
        shift += 8
    return order


@njit(cache=True)
def _firsts(keys):
    """Positions of the first occurrence of each distinct key (non-negative), in
    sorted-key order, and of the last one alongside."""
    order = stable_order(keys)
    first = np.empty(len(keys), np.int64)
    last = np.empty(len(keys), np.int64)
    n = 0
    for k in range(len(order)):
        if k == 0 or keys[order[k]] != keys[order[k - 1]]:
            first[n] = order[k]
            n += 1
        last[n - 1] = order[k]
    return first[:n], last[:n]


def find_sorted(sorted_keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each of ``values`` in ``sorted_keys`` (ascending) and whether it is
    there: a binary search each (`sorted_position` for one inside a kernel)."""
    if not len(sorted_keys):
        return np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return at, sorted_keys[at] == values


@njit(cache=True)
def sorted_position(sorted_values, x) -> int:
    """Where ``x`` is in ``sorted_values``; -1 where it is not."""
    j = np.searchsorted(sorted_values, x)
    return j if j < len(sorted_values) and sorted_values[j] == x else -1


@njit(cache=True, inline="always")
def _whole(x) -> bool:
    """Whether ``x`` is a whole number small enough that float64 sums of such are exact."""
    return abs(x) < 2.0 ** 50 and x == np.floor(x)


@njit(cache=True)
def net_kernel(log, alive, x, xsave, inn, in_weight):
    """The net effect of a logged batch, as slots and weights: ``src``/``dst`` (int32)
    of each pair whose weight or presence differs before vs after (pairs in key order),
    ``before``/``after`` its weights (NaN: absent); ``added`` (int32): slots added and
    alive, sorted; ``gone`` (int32): slots deleted that existed before, with ``gone_x``
    their features before the batch (from ``xsave`` where the batch updated them, else
    still in ``x``); ``changed`` (int32): slots alive throughout whose features differ
    after the batch (sorted), with ``changed_x`` those before it (features rewritten to
    the same values are left out). Brings ``in_weight`` (the weighted in-degree: the sum
    of the in-adjacency ``inn``'s block, in float64) up to date for every destination of
    a changed pair: by the pair's change where its weights and the sum are whole numbers
    (exact: most graphs have unit weights), else summed again."""
    kinds, ints, floats, count = log
    m = count[0]
    edge = np.flatnonzero(kinds[:m] == EDGE)
    keys = (ints[edge, 0] << 32) | ints[edge, 1]
    first, last = _firsts(keys)
    keep = np.empty(len(first), np.bool_)
    recount = np.empty(len(first), np.int64)
    r = 0
    for k in range(len(first)):
        b, a = floats[edge[first[k]], 0], floats[edge[last[k]], 1]
        keep[k] = not (b == a or (np.isnan(b) and np.isnan(a)))
        if keep[k]:
            v = ints[edge[first[k]], 1]
            b, a = 0.0 if np.isnan(b) else b, 0.0 if np.isnan(a) else a  # (NaN: absent)
            if _whole(b) and _whole(a) and _whole(in_weight[v]):
                in_weight[v] += a - b
            else:
                recount[r] = v
                r += 1
    for v in np.unique(recount[:r]):
        in_weight[v] = weight_sum1(inn, v)

    vadd = np.sort(ints[np.flatnonzero(kinds[:m] == VADD), 0])
    added = vadd[alive[vadd]]
    feat = np.flatnonzero(kinds[:m] == FEAT)
    feat_first, _ = _firsts(ints[feat, 0])
    feat_slot = ints[feat[feat_first], 0]
    feat_save = ints[feat[feat_first], 1]
    vdel = ints[np.flatnonzero(kinds[:m] == VDEL), 0]
    gone = np.empty(len(vdel), np.int32)
    gone_x = np.empty((len(vdel), x.shape[1]), x.dtype)
    ng = 0
    for s in vdel:
        if sorted_position(vadd, s) < 0:  # born in the batch: no net effect
            j = sorted_position(feat_slot, s)  # features the batch updated, or as they are
            gone[ng] = s
            if j >= 0:
                copy_row(gone_x, ng, xsave, feat_save[j])
            else:
                copy_row(gone_x, ng, x, s)
            ng += 1
    changed = np.empty(len(feat_slot), np.int32)
    changed_x = np.empty((len(feat_slot), x.shape[1]), xsave.dtype)
    n = 0
    for k in range(len(feat_slot)):
        v = feat_slot[k]
        if alive[v] and sorted_position(vadd, v) < 0:
            for c in range(x.shape[1]):  # rewritten to the same values: no change
                if xsave[feat_save[k], c] != x[v, c]:
                    changed[n] = v
                    copy_row(changed_x, n, xsave, feat_save[k])
                    n += 1
                    break
    first, last = edge[first[keep]], edge[last[keep]]
    return (ints[first, 0].astype(np.int32), ints[first, 1].astype(np.int32),
            floats[first, 0], floats[last, 1], added.astype(np.int32), gone[:ng],
            gone_x[:ng], changed[:n], changed_x[:n])
