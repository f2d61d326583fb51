"""`linear_step_inputs`: what a superstep of a layer kept as its pre-activation z needs
before its one product, in one numba call instead of three and the Python between them:
the message sources (`message_sources`), the rows of h the product transforms, gathered
from the features or from the previous layer's z and activated on the way
(`difference_table_into`), and the message list (`linear_delta_messages`).

Owns this composition only; must not import kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.models.rowops import difference_table_into
from streamgnn.workers.deltas import linear_delta_messages, message_sources


@njit(cache=True)
def linear_step_inputs(sources, at, v1, w1, src, dst, before, after, has, had, alive,
                       old_slots, removed, extra, own_slots, mark, scratch, region, dst_scale,
                       weighted, table, relu, old_rows):
    """For a superstep whose sources are ``sources`` (unchanged out-edges ``sources[at]
    -> v1``, weights ``w1``), the changed edges ``src -> dst`` (weights ``before`` /
    ``after``, ``has`` / ``had``), the vertices ``removed`` and the ``extra`` slots (a
    mean's rescaled vertices); h after the batch is row r of ``table``, ReLU'd where
    ``relu``, and h before it, of ``old_slots`` then ``removed``, the rows of ``old_rows``.
    The sources at ``own_slots`` fold their root terms into their own z (the product's
    first rows have a row of t and a root term each: `Layer.rel_root`); messages into the
    ``region`` are scaled by ``dst_scale``. ``mark`` / ``scratch``: `SlotSets`' own.
    Returns the rows the product transforms (in ``old_rows``' dtype) and how many of them
    have root terms, the messages (rows of t, coefficients, region positions) and the rows
    of the ``extra`` slots' h before the batch."""
    (slots, at1, at2, has_live, had_live, own, extra_at, prior, new, old, delta, fresh,
     taken, moved, dest, paired) = message_sources(sources, at, src, dst, has, had, alive,
                                                   old_slots, removed, extra, own_slots, True,
                                                   mark, scratch)
    read = np.concatenate((slots[fresh], slots[moved]))
    h = np.empty((len(read) + len(taken), old_rows.shape[1]), old_rows.dtype)
    difference_table_into(table, read, relu, old_rows, prior[taken], prior[moved], dest, h)
    ones = np.ones(len(slots))  # (no per-source factor: not degree-normalised)
    rows, coef, local = linear_delta_messages(
        new, old, delta, at1, v1, w1, at2, dst, before, after, has_live, had_live, weighted,
        ones, ones, region, dst_scale, scratch, own, own_slots, paired)
    return h, paired, rows, coef, local, old[extra_at]
