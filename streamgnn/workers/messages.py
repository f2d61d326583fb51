"""A superstep's messages: its sources and their table of t (`message_sources`: after the
batch, before it, the difference of the two where t is linear), and for aggregations
that are not linear the messages that stop and start arriving, one per edge, as rows of
that table (`outbox`) for `Aggregation.apply_delta`. A linear aggregation's message list
is `deltas.linear_delta_messages`' (`fold`).

Owns the building of messages; must not import kafka or mpi4py, nor the superstep, fold,
pulls or ghost-row parts of the shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.aggr import RowMessages
from streamgnn.models.layers import Layer
from streamgnn.models.rowops import difference_table, ones
from streamgnn.workers.batch import Batch, Changed
from streamgnn.workers.deltas import message_sources as find_sources
from streamgnn.workers.tables import Tables


@dataclass
class Sources:
    """A superstep's message sources ``slots`` and a table ``t`` of their rows of t
    (`message_sources`): source i's after the batch is row ``new[i]``, before it row
    ``old[i]`` (``new[i]`` where it has no other), t of the difference row ``delta[i]``
    (-1: none; only for linear aggregations); -1 where no message reads it. Also the
    changed edges that exist after (``has``) and before (``had``) the batch into live
    vertices; the source positions of the unchanged edges (``at1``), changed ones
    (``at2``), sources whose root terms fold into their own z (``own``) and the extra
    slots (``extra``)."""

    slots: np.ndarray
    t: Tensor
    new: np.ndarray
    old: np.ndarray
    delta: np.ndarray
    has: np.ndarray
    had: np.ndarray
    at1: np.ndarray
    at2: np.ndarray
    own: np.ndarray | None
    extra: np.ndarray
    paired: int  # how many leading rows of h have a root-term row in t (`Layer.rel_root`)


@dataclass
class Outbox:
    """One superstep's messages for aggregations that are not linear, left as rows of the
    sources' ``t`` times a factor, to destinations in ``region`` (whose
    `Layer.destination_part` is ``part`` where messages depend on it), for the fold to
    read."""

    t: Tensor
    region: np.ndarray
    new: RowMessages
    old: RowMessages
    part: Tensor | None = None


def message_sources(tb: Tables, b: Batch, hop: int, layer: Layer, sources: np.ndarray,
                    at: np.ndarray, extra: np.ndarray | None = None,
                    own_slots: np.ndarray | None = None) -> Sources:
    """The message sources of superstep ``hop`` of the batch ``b`` and their table of t
    (`Sources`), in one transform, with the rows before the batch of the ``extra`` slots
    (a mean's rescaled vertices) and the root terms of the sources at ``own_slots``.
    Where the shard keeps the pre-activation, the table is `Layer.rel_root` of those rows
    (two rows of t each where a root term is read). Where t is kept it is read, not
    computed (`_kept_rows`)."""
    changed, removed, edges = b.changed, b.removed, b.edges
    none = removed[:0]
    differences = tb.t[hop - 1] is None and layer.aggr.linear and not layer.degree_normalised
    (slots, at1, at2, has, had, own, extra_at, prior, new, old, delta, fresh, taken,
     moved, dest, paired) = find_sources(
        sources, at, edges.src, edges.dst, edges.has, edges.had, tb.graph.alive,
        changed.old_slots, removed, none if extra is None else extra,
        none if own_slots is None else own_slots, differences, tb.sets.mark,
        tb.sets.scratch)
    old_rows = joined([*changed.old_rows, b.removed_rows])  # h before, by ``prior``
    keeps_z = tb.z[hop - 1]
    if differences:  # t of the rows messages read, and of h_new - h_old
        table, read, relu = tb.h_source(hop - 1, np.concatenate([slots[fresh],
                                                                 slots[moved]]))
        rows = difference_table(table, read, relu, old_rows, prior[taken], prior[moved],
                                dest)
        t = layer.rel_root(rows, paired) if keeps_z else layer.transform(rows)
    elif tb.t[hop - 1] is not None:
        olds = np.concatenate([changed.old_slots, removed])
        t = _kept_rows(tb, hop, layer, slots, olds, changed)
    else:
        rows = torch.cat([tb.h_rows_at(hop - 1, slots), old_rows])
        t = layer.rel_root(rows, paired) if keeps_z else layer.transform(rows)
    return Sources(slots, t, new, old, delta, has, had, at1, at2,
                   None if own_slots is None else own, extra_at, paired)


def _kept_rows(tb: Tables, hop: int, layer: Layer, slots: np.ndarray, olds: np.ndarray,
               changed: Changed) -> Tensor:
    """Where t is kept: rows of the sources ``slots`` after the batch, then before it
    (of ``olds``), read from it but for the sources whose input changed (the sources
    include all of them), whose new rows it then takes: the old rows subtracted are
    then the very values once added."""
    kept = tb.t[hop - 1]
    read, index, at, *features = tb.upload(
        np.concatenate([slots, olds]), changed.slots, tb.sets.positions(slots, changed.slots),
        *tb.features_of(hop - 1, changed.slots))
    t = kept.index_select(0, read)
    new = layer.transform(tb.h_rows(hop - 1, index, *features))
    t[at] = new
    kept[index] = new
    return t


def source_scales(tb: Tables, layer: Layer, slots: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The per-source message factor after and before the batch (degree-normalised
    layers; ones otherwise), in float64."""
    if not layer.degree_normalised:
        return ones(len(slots)), ones(len(slots))
    both = np.stack([tb.graph.in_weight[slots], tb.in_weight[slots]])  # host values alone
    scale = layer.source_scale(torch.from_numpy(both)).numpy()
    return scale[0], scale[1]


def outbox(tb: Tables, b: Batch, hop: int, layer: Layer, sources: np.ndarray,
           at: np.ndarray, v1: np.ndarray, w1: np.ndarray, region: np.ndarray,
           region_at: Tensor) -> Outbox:
    """Messages that stop and start arriving in the region, for aggregations that are
    not linear: one per edge, in both directions, as rows of the sources' t and edge
    weights (and, for destination-dependent ones, each region vertex's
    `Layer.destination_part`; a destination whose input changed is pulled anyway, so
    none is sent to it). ``region_at``: the region as an index on the tables' device."""
    m = message_sources(tb, b, hop, layer, sources, at)
    changed, edges = b.changed, b.edges

    def messages(rows: np.ndarray, w: np.ndarray, dst: np.ndarray) -> RowMessages:
        if layer.aggr.destination_dependent:  # destinations whose input changed: pulled
            kept = tb.sets.find(changed.slots, dst) < 0
            rows, w, dst = rows[kept], w[kept], dst[kept]
        factor = w if layer.edge_weighted else np.ones(len(w), np.float32)
        return RowMessages(rows, factor, tb.sets.positions(region, dst))

    part = None
    if layer.aggr.destination_dependent:
        kept = tb.t[hop - 1]  # kept: the region's parts alone, not their whole rows
        part = (layer.destination_part(kept)[region_at]
                if kept is not None else
                layer.destination_part(tb.t_rows_at(hop, layer, region)))
    return Outbox(m.t, region, messages(
        m.new[np.concatenate([m.at1, m.at2[m.has]])],
        np.concatenate([w1, edges.after[m.has]]),
        np.concatenate([v1, edges.dst[m.has]])), messages(
        m.old[np.concatenate([m.at1, m.at2[m.had]])],
        np.concatenate([w1, edges.before[m.had]]),
        np.concatenate([v1, edges.dst[m.had]])), part)


def joined(parts: list[Tensor]) -> Tensor:
    """The rows of ``parts`` in one tensor: the only part with rows as it is."""
    full = [p for p in parts if p.shape[0]]
    return full[0] if len(full) == 1 else torch.cat(parts)
