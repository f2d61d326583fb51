"""Row-wise scatter kernels on 2-D tensors, the inner loops of an aggregation's delta: a
gather-scale-scatter (``combine_rows``), an in-place row add (``add_rows_``) and max
(``max_rows_``), and a test whether rows reach the stored ones (``reaches_rows``).
Each has a numba loop for CPU tensors (quicker than torch's indexing ops on the few hundred
rows of a batch) and a torch version for other devices; tests hold the two to each other.

Owns these kernels only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor


@njit(cache=True)
def _combine_loop(t, rows, coef, dst, num):
    out = np.zeros((num, t.shape[1]), np.float64)
    for k in range(len(rows)):
        r, d, c = rows[k], dst[k], coef[k]
        for j in range(t.shape[1]):
            out[d, j] += c * t[r, j]
    return out


@njit(cache=True)
def _add_loop(state, index, rows):
    for i in range(len(index)):
        r = index[i]  # hoisted: numba then vectorises the inner loop
        for j in range(state.shape[1]):
            state[r, j] += rows[i, j]


def combine_rows_numba(t: Tensor, rows: np.ndarray, coef: np.ndarray, dst: np.ndarray,
                       num: int) -> Tensor:
    return torch.from_numpy(_combine_loop(t.numpy(), rows, coef, dst, num))


def combine_rows_torch(t: Tensor, rows: np.ndarray, coef: np.ndarray, dst: np.ndarray,
                       num: int) -> Tensor:
    msg = t[torch.from_numpy(rows).to(t.device)].double()
    msg *= torch.from_numpy(coef).to(t.device).unsqueeze(-1)
    return msg.new_zeros((num, t.shape[1])).index_add_(0, torch.from_numpy(dst).to(t.device),
                                                        msg)


def combine_rows(t: Tensor, rows: np.ndarray, coef: np.ndarray, dst: np.ndarray,
                 num: int) -> Tensor:
    """Messages ``coef[k] * t[rows[k]]`` summed per destination ``dst[k]`` in ``0..num``,
    in float64."""
    kernel = combine_rows_numba if t.device.type == "cpu" else combine_rows_torch
    return kernel(t, rows, coef, dst, num)


def add_rows_numba(state: Tensor, index: Tensor, rows: Tensor) -> None:
    _add_loop(state.numpy(), index.numpy(), rows.to(state.dtype).numpy())


def add_rows_torch(state: Tensor, index: Tensor, rows: Tensor) -> None:
    state.index_add_(0, index, rows.to(state.dtype))


def add_rows_(state: Tensor, index: Tensor, rows: Tensor) -> None:
    """``state[index[i]] += rows[i]``, in place (``index`` distinct)."""
    (add_rows_numba if state.device.type == "cpu" else add_rows_torch)(state, index, rows)


@njit(cache=True)
def _max_loop(state, index, rows):
    for i in range(len(index)):
        r = index[i]
        for j in range(state.shape[1]):
            state[r, j] = max(state[r, j], rows[i, j])


def max_rows_numba(state: Tensor, index: Tensor, rows: Tensor) -> None:
    _max_loop(state.numpy(), index.numpy(), rows.to(state.dtype).numpy())


def max_rows_torch(state: Tensor, index: Tensor, rows: Tensor) -> None:
    state.index_reduce_(0, index, rows.to(state.dtype), "amax", include_self=True)


def max_rows_(state: Tensor, index: Tensor, rows: Tensor) -> None:
    """``state[index[i]] = max(state[index[i]], rows[i])`` elementwise, in place (``index``
    may repeat)."""
    (max_rows_numba if state.device.type == "cpu" else max_rows_torch)(state, index, rows)


@njit(cache=True)
def _reaches_loop(state, index, rows, tol):
    out = np.zeros(len(index), np.bool_)
    for i in range(len(index)):
        r = index[i]
        for j in range(state.shape[1]):
            if rows[i, j] >= state[r, j] - tol * abs(state[r, j]):
                out[i] = True
                break
    return out


def reaches_rows_numba(state: Tensor, index: Tensor, rows: Tensor, tol: float) -> Tensor:
    return torch.from_numpy(_reaches_loop(state.numpy(), index.numpy(), rows.numpy(), tol))


def reaches_rows_torch(state: Tensor, index: Tensor, rows: Tensor, tol: float) -> Tensor:
    current = state.index_select(0, index)
    return (rows >= current - tol * current.abs()).any(dim=-1)


def reaches_rows(state: Tensor, index: Tensor, rows: Tensor, tol: float) -> Tensor:
    """Per row i, whether ``rows[i]`` reaches ``state[index[i]]`` (within the relative
    ``tol``) in some column."""
    kernel = reaches_rows_numba if state.device.type == "cpu" else reaches_rows_torch
    return kernel(state, index, rows, tol)
