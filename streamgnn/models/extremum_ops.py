"""Kernels of the max aggregation (min keeps the max of the negated messages: ``sign``
-1). A state row holds each column's max over a destination's in-edges; beside it,
``ties`` (uint8) holds per column how many of those in-edges are known to carry the max:
a lower bound, saturating at 255, and 0 only where there is no in-edge.
- ``fold_max_``: fold messages that start arriving into state rows in place (a larger
  message takes the column with one tie, an equal one adds a tie) and messages that stop
  arriving (a message at the max removes a tie), returning the columns where the last
  known carrier of the max may have left: only re-aggregating those columns can fix them;
- ``pull_max_columns_``: re-aggregate given columns of given destinations from all their
  in-edges, each message ``sign * factor * table[source]`` read from the table in place,
  counting the ties exactly.
Numba loops for CPU tensors; torch versions for other devices. Tests hold each pair to
each other and to re-aggregating from scratch.

Owns these kernels only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

MAX_TIES = 255  # uint8: more carriers are counted as this many (a lower bound)


@njit(cache=True)
def _fold_loop(state, ties, new_dst, new_msg, old_dst, old_msg, sign, tol):
    d = state.shape[1]
    for i in range(len(new_dst)):  # arriving
        r = new_dst[i]
        for j in range(d):
            m = sign * new_msg[i, j]
            if m > state[r, j]:
                state[r, j] = m
                ties[r, j] = 1
            elif m == state[r, j] and ties[r, j] < MAX_TIES:
                ties[r, j] += 1
    # Leaving, grouped by destination. A message within ``tol`` of the max but not equal
    # to it may be the carrier recomputed in another order: the column is lost.
    order = np.argsort(old_dst)
    dst = np.empty(len(old_dst), np.int64)
    cols = np.zeros((len(old_dst), d), np.bool_)
    n = 0
    for k in range(len(order)):
        i = order[k]
        r = old_dst[i]
        if n == 0 or dst[n - 1] != r:
            dst[n] = r
            n += 1
        for j in range(d):
            s = state[r, j]
            o = sign * old_msg[i, j]
            if o >= s - tol * abs(s):
                if o == s and ties[r, j] >= 2:
                    ties[r, j] -= 1
                else:
                    cols[n - 1, j] = True
    kept = 0
    for g in range(n):  # destinations that lost no column need nothing
        hit = False
        for j in range(d):
            hit |= cols[g, j]
        if hit:
            dst[kept] = dst[g]
            cols[kept] = cols[g]
            kept += 1
    return dst[:kept], cols[:kept]


def fold_max_numba(state: Tensor, ties: Tensor, new_dst: Tensor, new_msg: Tensor,
                   old_dst: Tensor, old_msg: Tensor, sign: float,
                   tol: float) -> tuple[Tensor, Tensor]:
    dst, cols = _fold_loop(state.numpy(), ties.numpy(), new_dst.numpy(), new_msg.numpy(),
                           old_dst.numpy(), old_msg.numpy(), sign, tol)
    return torch.from_numpy(dst), torch.from_numpy(cols)


def fold_max_torch(state: Tensor, ties: Tensor, new_dst: Tensor, new_msg: Tensor,
                   old_dst: Tensor, old_msg: Tensor, sign: float,
                   tol: float) -> tuple[Tensor, Tensor]:
    def per_destination(dst: Tensor, flags: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        unique, at = torch.unique(dst, return_inverse=True)
        return unique, [torch.zeros((len(unique), state.shape[1]), dtype=torch.int32,
                                    device=state.device).index_add_(0, at, f.int())
                        for f in flags]

    new_msg, old_msg = sign * new_msg, sign * old_msg
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


def fold_max_(state: Tensor, ties: Tensor, new_dst: Tensor, new_msg: Tensor,
              old_dst: Tensor, old_msg: Tensor, sign: float,
              tol: float) -> tuple[Tensor, Tensor]:
    """Fold ``sign * new_msg[i]`` arriving at ``new_dst[i]`` and ``sign * old_msg[i]``
    leaving ``old_dst[i]`` into ``state`` and ``ties`` rows in place; a leaving message
    within the relative ``tol`` of the max removes a tie if equal to it, else loses the
    column, as does removing the last known tie. Returns the destinations that lost a
    column (distinct, sorted) and a [n, d] bool of their lost columns."""
    kernel = fold_max_numba if state.device.type == "cpu" else fold_max_torch
    return kernel(state, ties, new_dst, new_msg, old_dst, old_msg, sign, tol)


@njit(cache=True)
def _columns_loop(state, ties, dst, cols, table, ptr, src, factor, weighted, sign):
    d = state.shape[1]
    at = np.empty(d, np.int64)
    best = np.empty(d, np.float64)
    count = np.empty(d, np.int64)
    for i in range(len(dst)):
        n = 0
        for j in range(d):
            if cols[i, j]:
                at[n] = j
                n += 1
        for c in range(n):
            best[c] = -np.inf if ptr[i + 1] > ptr[i] else 0.0  # no in-edge: 0, as in PyG
            count[c] = 0
        for k in range(ptr[i], ptr[i + 1]):
            u = src[k]
            f = sign * (np.float64(factor[k]) if weighted else 1.0)
            for c in range(n):
                # float64 holds the product of two float32 exactly: one rounding on store
                m = f * np.float64(table[u, at[c]])
                if m > best[c]:
                    best[c] = m
                    count[c] = 1
                elif m == best[c]:
                    count[c] += 1
        r = dst[i]
        for c in range(n):
            state[r, at[c]] = best[c]
            ties[r, at[c]] = min(count[c], MAX_TIES)


def pull_max_columns_numba(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor,
                           table: Tensor, ptr: np.ndarray, src: Tensor,
                           factor: Tensor | None, sign: float) -> None:
    weighted = factor is not None
    _columns_loop(state.numpy(), ties.numpy(), dst.numpy(), cols.numpy(), table.numpy(), ptr,
                  src.numpy(), factor.numpy() if weighted else np.zeros(0, np.float32),
                  weighted, sign)


def pull_max_columns_torch(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor,
                           table: Tensor, ptr: np.ndarray, src: Tensor,
                           factor: Tensor | None, sign: float) -> None:
    counts = torch.from_numpy(np.diff(ptr)).to(state.device)
    local = torch.repeat_interleave(torch.arange(len(dst), device=state.device), counts)
    msg = table.index_select(0, src).to(state.dtype)
    if factor is not None:
        msg *= factor.to(state.dtype).unsqueeze(-1)
    msg = sign * msg
    best = state.new_zeros((len(dst), state.shape[1])).index_reduce_(
        0, local, msg, "amax", include_self=False)  # rows with no in-edge stay 0
    equal = torch.zeros(best.shape, dtype=torch.int32, device=state.device).index_add_(
        0, local, (msg == best.index_select(0, local)).int())
    state[dst] = torch.where(cols, best, state.index_select(0, dst))
    ties[dst] = torch.where(cols, equal.clamp_(max=MAX_TIES).to(ties.dtype),
                            ties.index_select(0, dst))


def pull_max_columns_(state: Tensor, ties: Tensor, dst: Tensor, cols: Tensor,
                      table: Tensor, ptr: np.ndarray, src: Tensor, factor: Tensor | None,
                      sign: float) -> None:
    """Columns ``cols[i]`` (bool) of ``state[dst[i]]`` re-aggregated, in place, as the
    max of ``sign * factor[k] * table[src[k]]`` over ``k`` in ``ptr[i]:ptr[i+1]`` (the
    destination's in-edges; ``factor`` None: 1), 0 for no in-edge; and ``ties`` there:
    how many messages equal the max. ``dst`` distinct."""
    kernel = pull_max_columns_numba if state.device.type == "cpu" else pull_max_columns_torch
    kernel(state, ties, dst, cols, table, ptr, src, factor, sign)
