"""The message list of a linear aggregation's delta, built in one numba pass: for each
message, the row of ``cat(t_new, t_old)`` it carries, its coefficient and its
destination's position in the region. Unchanged edges out of changed sources send
``+w t_new - w t_old``; changed edges send ``+after t_new`` where they exist after the batch
and ``-before t_old`` where they existed before it.

Owns this index arithmetic only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def linear_delta_messages(num_sources, at, v1, w1, at2, dst, before, after, has, had,
                          weighted, region, scratch):
    """``at``/``v1``/``w1``: unchanged edges (source row, destination slot, weight);
    ``at2``/``dst``/``before``/``after``/``has``/``had``: changed edges (source row,
    destination slot, weights, whether they exist after/before and reach a live vertex).
    Source rows index t_new; ``num_sources`` is where t_old's rows start. ``scratch``: an
    int64 array as long as the slots. Returns (rows, coef, local)."""
    for i in range(len(region)):
        scratch[region[i]] = i
    size = 2 * len(at) + has.sum() + had.sum()
    rows = np.empty(size, np.int64)
    coef = np.empty(size, np.float64)
    local = np.empty(size, np.int64)
    k = 0
    for i in range(len(at)):
        c = w1[i] if weighted else 1.0
        d = scratch[v1[i]]
        rows[k], coef[k], local[k] = at[i], c, d
        rows[k + 1], coef[k + 1], local[k + 1] = at[i] + num_sources, -c, d
        k += 2
    for i in range(len(at2)):
        d = scratch[dst[i]]
        if has[i]:
            rows[k], coef[k], local[k] = at2[i], after[i] if weighted else 1.0, d
            k += 1
        if had[i]:
            rows[k], coef[k], local[k] = at2[i] + num_sources, -before[i] if weighted else -1.0, d
            k += 1
    return rows, coef, local
