"""A linear aggregation's superstep (sum, weighted sum, mean, GCN's normalised sum, GIN):
the messages that stop and start arriving, one per row of t they carry, folded into the
stored states (`SumAggregation.fold`). Where the shard keeps the pre-activation z, the
root terms of sources whose input changed fold into their own z as messages, and a
mean's z is first rescaled about its root term and bias where the in-degree changed
(`mean_rescaled`). On the CPU everything before the product is one kernel
(`linear_step_inputs`); elsewhere the same steps run one by one.

Owns the linear fold; must not import kafka or mpi4py, nor the superstep, pulls or
ghost-row parts of the shard.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.layers import Layer
from streamgnn.models.rowops import ones
from streamgnn.workers.batch import Batch
from streamgnn.workers.deltas import linear_delta_messages
from streamgnn.workers.linear_step import linear_step_inputs
from streamgnn.workers.messages import joined, message_sources, source_scales
from streamgnn.workers.tables import Tables


def fold(tb: Tables, b: Batch, hop: int, layer: Layer, sources: np.ndarray,
         at: np.ndarray, v1: np.ndarray, w1: np.ndarray, region: np.ndarray,
         count: np.ndarray, keep: bool) -> tuple[Tensor, np.ndarray, Tensor | None]:
    """Superstep ``hop`` of the batch ``b`` for a linear aggregation: the messages that
    stop and start arriving in the region (along the unchanged edges ``sources[at] ->
    v1``, weights ``w1``, and the changed edges), one per row of t they carry, folded into
    the states; returns the region's finalized states (``count``: in-degrees), their wear
    and with ``keep`` their states before (`SumAggregation.fold`). Where the shard keeps
    the pre-activation, the root terms of sources whose input changed fold in too; a
    mean's messages then arrive divided by the in-degree, and the z of a vertex whose
    in-degree went from d to d' is first rescaled by d / d' about its old root term and
    bias (`mean_rescaled`)."""
    changed, removed, edges = b.changed, b.removed, b.edges
    keeps_z = tb.z[hop - 1]
    mean_z = keeps_z and layer.aggr.name == "mean"
    rescaled, at_region, a = mean_rescaled(tb, b, region, count) if mean_z else (
        None, None, None)
    # the sources' root terms fold into their own z too
    own_slots = changed.slots[tb.owned[changed.slots]] if keeps_z else None
    dst_scale = (np.divide(1.0, count, out=np.zeros(len(count)), where=count > 0)
                 if mean_z else ones(len(region)))
    source = tb.h_table_of(hop - 1) if keeps_z and _one_kernel(tb.device) else None
    if source is not None:  # all but the product in one kernel
        table, relu = source
        h, paired, rows, coef, local, extra_old = linear_step_inputs(
            sources, at, v1, w1, edges.src, edges.dst, edges.before, edges.after,
            edges.has, edges.had, tb.graph.alive, changed.old_slots, removed,
            removed[:0] if rescaled is None else rescaled, own_slots, tb.sets.mark,
            tb.sets.scratch, region, dst_scale, layer.edge_weighted, table.numpy(),
            relu, joined([*changed.old_rows, b.removed_rows]).numpy())
        t = layer.rel_root(torch.from_numpy(h), paired)
    else:
        m = message_sources(tb, b, hop, layer, sources, at, rescaled, own_slots)
        scale_new, scale_old = source_scales(tb, layer, m.slots)
        rows, coef, local = linear_delta_messages(
            m.new, m.old, m.delta, m.at1, v1, w1, m.at2, edges.dst, edges.before,
            edges.after, m.has, m.had, layer.edge_weighted, scale_new, scale_old, region,
            dst_scale, tb.sets.scratch, m.own, own_slots, m.paired)
        t, extra_old = m.t, m.old[m.extra]
    scale = bias = None
    if mean_z and len(a):
        rows, coef, local, scale = root_messages(rows, coef, local, extra_old, at_region, a,
                                                 len(region))
        bias = layer.empty_preactivation().double().cpu().numpy()
    return layer.aggr.fold(tb.state[hop - 1], tb.drift[hop - 1], t, rows, coef, local,
                           tb.rows_at(hop, region), None if keeps_z else count, scale, bias,
                           keep)


def mean_rescaled(tb: Tables, b: Batch, region: np.ndarray, count: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A mean's z = S / d + r + b (S: the messages' sum, r: the root term, b: the
    bias) for the new in-degree d' is ``a z + (1 - a) (r + b)`` with a = d / d' (0
    when d' is 0). Returns the region's vertices to rescale so (their in-degree
    changed, they are not new and had an in-edge: z is r + b already otherwise),
    their positions in the region and their ``a``."""
    edges = b.edges
    at = tb.sets.find(region, edges.recounted)
    kept = (at >= 0) & (edges.count_before > 0) & ~b.added_among(edges.recounted, tb.sets)
    before = edges.count_before[kept].astype(np.float64)
    at = at[kept]
    now = count[at].astype(np.float64)
    return (edges.recounted[kept], at,
            np.divide(before, now, out=np.zeros(len(at)), where=now > 0))


def root_messages(rows: np.ndarray, coef: np.ndarray, local: np.ndarray,
                  extra_old: np.ndarray, at_region: np.ndarray, a: np.ndarray, size: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`mean_rescaled`'s rescaling about r + b as messages: the messages ``rows -> local``
    (coefficients ``coef``) followed by (1 - a) r from each rescaled vertex's old root
    term (row 2 i + 1 of the paired rows of t, `Layer.rel_root`, for its row before
    ``extra_old`` = i) into its position ``at_region`` in the region; and the scale of the
    region's ``size`` states (``a`` there, 1 elsewhere)."""
    scale = np.ones(size)
    scale[at_region] = a
    rows, coef, local = (np.concatenate(pair) for pair in zip(
        (rows, coef, local), (2 * extra_old + 1, 1.0 - a, at_region), strict=True))
    return rows, coef, local, scale


def _one_kernel(device: torch.device) -> bool:
    """Whether a superstep may run all before its product in one numba kernel
    (`linear_step_inputs`: tables on CPU)."""
    return device.type == "cpu"
