"""Kernels of the max aggregation (min keeps the max of the negated messages: ``sign``
-1). A state row holds each column's max over a destination's in-edges; beside it,
``ties`` (uint8) holds per column how many of those in-edges are known to carry the max:
a lower bound, saturating at 255, and 0 only where there is no in-edge.
- ``fold_max_``: fold messages that start arriving into state rows in place (a larger
  message takes the column with one tie, an equal one adds a tie) and messages that stop
  arriving (a message at the max removes a tie), returning the columns where the last
  known carrier of the max may have left: only re-aggregating those columns can fix them.
  Messages come as rows of a table times a factor, computed in the table's dtype as the
  layer computes them.
- ``pull_max_columns_``: re-aggregate given columns of given destinations from all their
  in-edges, read where they are stored, each message ``sign * factor * table[source]``
  read from the table in place, counting the ties exactly;
- ``max_and_ties``: a max and its ties from messages on the device (whole states: a
  planned batch's recompute, `workers/pulls.py`; and the torch pull of columns).
Numba loops for CPU tensors (one pass per destination over its messages or in-edges, no
per-message tensors); torch versions for other devices. Tests hold each pair to each
other and to re-aggregating from scratch.

Owns these kernels only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange
from torch import Tensor

from streamgnn.cores import block_costs, block_work, chunk_rows, row_loop
from streamgnn.models.rowops import block_edges, by_destination
from streamgnn.models.transfer import upload
from streamgnn.prefetch import AHEAD, prefetch_row

MAX_TIES = 255  # uint8: more carriers are counted as this many (a lower bound)


@njit(cache=True)
def _fold_loop(state, ties, t, region, new_rows, new_factor, new_at, old_rows, old_factor,
               old_at, sign, tol):
    d, num = state.shape[1], len(region)
    new_ptr, new_order = by_destination(new_at, num)
    old_ptr, old_order = by_destination(old_at, num)
    lost_at = np.empty(num, np.int64)
    cols = np.zeros((min(num, len(old_at)), d), np.bool_)
    n = 0
    for g in range(num):  # branch-free inner loops: the outcomes are unpredictable
        if g + AHEAD < num:
            prefetch_row(state, region[g + AHEAD])
            prefetch_row(ties, region[g + AHEAD])
        s_row, ties_row = state[region[g]], ties[region[g]]
        for k in range(new_ptr[g], new_ptr[g + 1]):  # arriving
            i = new_order[k]
            row, f = t[new_rows[i]], t.dtype.type(sign * new_factor[i])
            for j in range(d):
                m, s, c = f * row[j], s_row[j], ties_row[j]  # the layer's message, rounded
                ties_row[j] = 1 if m > s else (c + 1 if m == s and c < MAX_TIES else c)
                s_row[j] = max(m, s)
        if old_ptr[g + 1] == old_ptr[g]:
            continue
        lost = cols[n]
        for k in range(old_ptr[g], old_ptr[g + 1]):  # leaving, after the arrivals
            i = old_order[k]
            row, f = t[old_rows[i]], t.dtype.type(sign * old_factor[i])
            for j in range(d):
                m, s = f * row[j], s_row[j]
                # within tol but not equal: maybe the carrier computed in another order
                near = m >= s - tol * abs(s)
                gone = near and m == s and ties_row[j] >= 2
                ties_row[j] -= gone
                lost[j] |= near and not gone
        if lost.any():
            lost_at[n] = g
            n += 1
    return region[lost_at[:n]], cols[:n]


def fold_max_numba(state: Tensor, ties: Tensor, t: Tensor, region: np.ndarray,
                   new: tuple[np.ndarray, np.ndarray, np.ndarray],
                   old: tuple[np.ndarray, np.ndarray, np.ndarray], sign: float,
                   tol: float) -> tuple[Tensor, Tensor]:
    dst, cols = _fold_loop(state.numpy(), ties.numpy(), t.numpy(), region, *new, *old, sign,
                           tol)
    return torch.from_numpy(dst), torch.from_numpy(cols)


def fold_max_torch(state: Tensor, ties: Tensor, t: Tensor, region: np.ndarray,
                   new: tuple[np.ndarray, np.ndarray, np.ndarray],
                   old: tuple[np.ndarray, np.ndarray, np.ndarray], sign: float,
                   tol: float) -> tuple[Tensor, Tensor]:
    def messages(rows: Tensor, factor: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
        msg = t.index_select(0, rows).to(state.dtype)
        msg *= factor.to(state.dtype).unsqueeze(-1)
        return dst, sign * msg

    def per_destination(dst: Tensor, flags: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        unique, at = torch.unique(dst, return_inverse=True)
        return unique, [torch.zeros((len(unique), state.shape[1]), dtype=torch.int32,
                                    device=state.device).index_add_(0, at, f.int())
                        for f in flags]

    (rows, factor, at), (old_rows, old_factor, old_at) = new, old
    uploaded = upload(state.device, rows, factor, region[at], old_rows, old_factor,
                      region[old_at])
    new_dst, new_msg = messages(*uploaded[:3])
    old_dst, old_msg = messages(*uploaded[3:])
    before = state.index_select(0, new_dst.unique())
    state.index_reduce_(0, new_dst, new_msg, "amax", include_self=True)
    at, (equal,) = per_destination(new_dst, [new_msg == state.index_select(0, new_dst)])
    raised = state.index_select(0, at) > before
    ties[at] = torch.where(raised, equal, ties.index_select(0, at).int() + equal).clamp_(
        max=MAX_TIES).to(ties.dtype)
    current = state.index_select(0, old_dst)
    reach = old_msg >= current - tol * current.abs()
    dst, (reaching, equal) = per_destination(old_dst, [reach, reach & (old_msg == current)])
    known = ties.index_select(0, dst).int()
    lost = (reaching > equal) | (equal >= known)  # a tie is left while known - equal >= 1
    ties[dst] = torch.where(lost, known, known - equal).to(ties.dtype)
    hit = lost.any(dim=1)
    return dst[hit], lost[hit]


def fold_max_(state: Tensor, ties: Tensor, t: Tensor, region: np.ndarray,
              new: tuple[np.ndarray, np.ndarray, np.ndarray],
              old: tuple[np.ndarray, np.ndarray, np.ndarray], sign: float,
              tol: float) -> tuple[Tensor, Tensor]:
    """Fold messages arriving (``new``) and leaving (``old``), each ``(rows, factor, at)``:
    ``sign * factor[k] * t[rows[k]]`` at destination ``region[at[k]]``, into ``state``
    and ``ties`` rows in place. A leaving message within the relative ``tol`` of the max
    removes a tie if equal to it, else loses the column, as does removing the last known
    tie. Returns the destinations that lost a column (slots, ascending) and a [n, d] bool
    of their lost columns."""
    kernel = fold_max_numba if state.device.type == "cpu" else fold_max_torch
    return kernel(state, ties, t, region, new, old, sign, tol)


@njit(cache=True, inline="always")
def _next_edge(begin, end, last, i, k):
    """The in-edge after in-edge ``k`` of destination ``i``, across destinations up to
    ``last`` (``i`` at ``last``: none)."""
    k += 1
    while i < last and k >= end[i]:
        i += 1
        if i < last:
            k = begin[i]
    return i, k


@row_loop
def _columns_loop(state, ties, dst, cols, table, begin, end, src, factor, weighted, sign,
                  chunks):
    d = state.shape[1]
    cost = block_costs(begin, end, 1)
    for chunk in prange(chunks):
        at = np.empty(d, np.int64)
        best = np.empty(d, state.dtype)
        count = np.empty(d, np.int64)
        first, last = chunk_rows(cost, chunks, chunk)
        # the row read AHEAD in-edges on, across destinations (most have fewer in-edges)
        ahead_i, ahead_k = first, (begin[first] - 1 if first < last else 0)
        for _ in range(AHEAD + 1):
            ahead_i, ahead_k = _next_edge(begin, end, last, ahead_i, ahead_k)
        for i in range(first, last):
            n = 0
            for j in range(d):
                if cols[i, j]:
                    at[n] = j
                    n += 1
            best[:n] = -np.inf if end[i] > begin[i] else 0.0  # no in-edge: 0, as in PyG
            count[:n] = 0
            for k in range(begin[i], end[i]):
                if ahead_i < last:
                    prefetch_row(table, src[ahead_k])
                    ahead_i, ahead_k = _next_edge(begin, end, last, ahead_i, ahead_k)
                row = table[src[k]]
                f = table.dtype.type(sign * factor[k] if weighted else sign)
                for c in range(n):  # a new max is rare after the first few: branches pay
                    m = f * row[at[c]]  # the layer's message, rounded
                    if m > best[c]:
                        best[c] = m
                        count[c] = 1
                    elif m == best[c]:
                        count[c] += 1
            s_row, ties_row = state[dst[i]], ties[dst[i]]
            for c in range(n):
                s_row[at[c]] = best[c]
                ties_row[at[c]] = min(count[c], MAX_TIES)


def pull_max_columns_numba(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor,
                           table: Tensor, begin: np.ndarray, end: np.ndarray,
                           src: np.ndarray, factor: np.ndarray | None, sign: float) -> None:
    weighted = factor is not None
    _columns_loop(block_work(begin, end, state.shape[1]), state.numpy(), ties.numpy(),
                  dst.numpy(), cols.numpy(), table.numpy(), begin, end, src,
                  factor if weighted else np.zeros(0, np.float32), weighted, sign)


def pull_max_columns_torch(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor,
                           table: Tensor, begin: np.ndarray, end: np.ndarray,
                           src: np.ndarray, factor: np.ndarray | None, sign: float) -> None:
    edges, local = block_edges(begin, end)  # positions in src, and their destination
    local, read, *weights = upload(state.device, local, src[edges].astype(np.int64),
                                   *([] if factor is None else [factor[edges]]))
    msg = table.index_select(0, read).to(state.dtype)
    if weights:
        msg *= weights[0].to(state.dtype).unsqueeze(-1)
    best, equal = max_and_ties(sign * msg, local, len(dst))
    state[dst] = torch.where(cols, best, state.index_select(0, dst))
    ties[dst] = torch.where(cols, equal, ties.index_select(0, dst))


def max_and_ties(msg: Tensor, local: Tensor, num: int) -> tuple[Tensor, Tensor]:
    """Per destination 0..num, the max of each column over its rows of ``msg`` (row k's
    destination: ``local[k]``; 0 where it has none) and how many of them equal it
    (uint8, saturating at `MAX_TIES`), on ``msg``'s device."""
    best = msg.new_zeros((num, msg.shape[1])).index_reduce_(
        0, local, msg, "amax", include_self=False)  # rows with no in-edge stay 0
    equal = torch.zeros(best.shape, dtype=torch.int32, device=msg.device).index_add_(
        0, local, (msg == best.index_select(0, local)).int())
    return best, equal.clamp_(max=MAX_TIES).to(torch.uint8)


def pull_max_columns_(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor, table: Tensor,
                      begin: np.ndarray, end: np.ndarray, src: np.ndarray,
                      factor: np.ndarray | None, sign: float) -> None:
    """Columns ``cols[i]`` (bool) of ``state[dst[i]]`` re-aggregated, in place, as the
    max of ``sign * factor[k] * table[src[k]]`` over ``k`` in ``begin[i]:end[i]`` (the
    destination's in-edges; ``factor`` None: 1), 0 for no in-edge; and ``ties`` there:
    how many messages equal the max. ``dst`` distinct."""
    kernel = pull_max_columns_numba if state.device.type == "cpu" else pull_max_columns_torch
    kernel(state, ties, dst, cols, table, begin, end, src, factor, sign)
