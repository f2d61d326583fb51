"""The product of a few rows by a layer's weights in one numba loop: below ~2^18
multiply-adds (a handful of rows at bs=1, a few dozen at bs=10) a torch matmul's fixed cost
(paid on each call, two calls for a paired product) is most of a superstep's transform.
The loop's crossover with torch: `benchmarks/products.py`.

Owns this product only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

SMALL = 1 << 18  # multiply-adds at most, for the loop (torch's matmul above: it blocks)


@njit(cache=True)
def _paired_loop(h, wt, paired, out):
    d = wt.shape[1] // 2
    acc = np.empty(wt.shape[1], h.dtype)
    for i in range(h.shape[0]):
        width = 2 * d if i < paired else d
        acc[:width] = 0.0
        for k in range(h.shape[1]):
            v = h[i, k]
            for j in range(width):
                acc[j] += v * wt[k, j]
        if i < paired:
            out[2 * i] = acc[:d]
            out[2 * i + 1] = acc[d:]
        else:
            out[paired + i] = acc[:d]


def is_small(multiply_adds: int) -> bool:
    """Whether `paired_product` should take a product of so many multiply-adds (on the
    CPU: the caller's to check)."""
    return multiply_adds <= SMALL


def paired_product(h: Tensor, stacked_t: np.ndarray, paired: int) -> Tensor:
    """``h @ stacked_t`` for ``stacked_t`` = [rel | root] (in_dim x 2d, contiguous) laid out
    as `Layer.rel_root` returns it: rel and root of each of the first ``paired`` rows
    interleaved (rows 2i, 2i + 1), then rel alone of the rest (row ``paired + i``)."""
    out = np.empty((h.shape[0] + paired, stacked_t.shape[1] // 2), stacked_t.dtype)
    _paired_loop(h.numpy(), stacked_t, paired, out)
    return torch.from_numpy(out)
