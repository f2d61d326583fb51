"""Row-wise scatter kernels on 2-D tensors, the inner loops of a sum's delta: a
gather-scale-scatter (``combine_rows``) and an in-place row add (``add_rows_``).
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
