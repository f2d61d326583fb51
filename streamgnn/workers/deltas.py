"""The message list of a linear aggregation's delta, built in one numba pass: for each
message, the row of the sources' t it carries, its coefficient and its destination's
position in the region. With s the per-source factor (degree-normalised layers), unchanged
edges out of changed sources send ``+w s_new t_new - w s_old t_old`` (one message when
t did not change); changed edges send ``+after s_new t_new`` where they exist after the
batch and ``-before s_old t_old`` where they existed before it; each message is then
scaled by its destination's factor (a mean kept as the pre-activation: 1 / its in-degree).
A layer that keeps its pre-activation also adds, to each source whose input changed, its
new root term and subtracts its old one.

Owns this index arithmetic only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def linear_delta_messages(old, at, v1, w1, at2, dst, before, after, has, had, weighted,
                          scale_new, scale_old, region, dst_scale, scratch, own, own_slots):
    """Sources are numbered 0..len(old): source i's t after the batch is row i, before it
    row ``old[i]``; ``scale_new``/``scale_old`` its factor after/before.
    ``at``/``v1``/``w1``: unchanged edges (source, destination slot, weight);
    ``at2``/``dst``/``before``/``after``/``has``/``had``: changed edges (source,
    destination slot, weights, whether they exist after/before and reach a live vertex).
    ``dst_scale``: per region position, what messages to it are multiplied by.
    ``scratch``: an int64 array as long as the slots. ``own``: None, or the sources
    (positions, at slots ``own_slots`` in the region) whose root term changes: then each
    row r of t above stands for rows 2r (its message) and 2r+1 (its root term) of a table
    twice as long (`Layer.rel_root`), and each of those sources sends its own state its
    new root term (and minus its old one where it had a row before). Returns (rows,
    coef, local)."""
    for i in range(len(region)):
        scratch[region[i]] = i
    step = 1 if own is None else 2
    size = 2 * len(at) + has.sum() + had.sum() + (0 if own is None else 2 * len(own))
    rows = np.empty(size, np.int64)
    coef = np.empty(size, np.float64)
    local = np.empty(size, np.int64)
    k = 0
    for i in range(len(at)):
        d = scratch[v1[i]]
        a, c = at[i], (w1[i] if weighted else 1.0) * dst_scale[d]
        if old[a] == a:  # only the factor changed
            rows[k], coef[k], local[k] = step * a, c * (scale_new[a] - scale_old[a]), d
            k += 1
        else:
            rows[k], coef[k], local[k] = step * a, c * scale_new[a], d
            rows[k + 1], coef[k + 1], local[k + 1] = step * old[a], -c * scale_old[a], d
            k += 2
    for i in range(len(at2)):
        a, d = at2[i], scratch[dst[i]]
        if has[i]:
            rows[k] = step * a
            coef[k] = (after[i] if weighted else 1.0) * scale_new[a] * dst_scale[d]
            local[k] = d
            k += 1
        if had[i]:
            rows[k] = step * old[a]
            coef[k] = -(before[i] if weighted else 1.0) * scale_old[a] * dst_scale[d]
            local[k] = d
            k += 1
    if own is not None:
        for i in range(len(own)):
            a, d = own[i], scratch[own_slots[i]]
            rows[k], coef[k], local[k] = 2 * a + 1, 1.0, d
            k += 1
            if old[a] != a:
                rows[k], coef[k], local[k] = 2 * old[a] + 1, -1.0, d
                k += 1
    return rows[:k], coef[:k], local[:k]
