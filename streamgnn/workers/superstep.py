"""One superstep of a batch on a shard (`superstep`): for sources whose h^{l-1} changed
(and, for degree-normalised layers, whose in-degree changed) the region their messages
reach (`superstep_region`); the messages folded into the states (`fold` for linear
aggregations, `Aggregation.apply_delta` of an `outbox` otherwise); destinations that
cannot be fixed that way pulled (`pulls`); then h^l recomputed for the region, stored,
and compared with the old rows (the next superstep's sources are those that moved). RC
(no states kept) pulls every destination.

Owns the order of these steps and the counts of `ApplyResult`; must not import kafka or
mpi4py, nor the ghost-row part of the shard.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.layers import Layer
from streamgnn.models.rowops import activated_rows, compare_rows, store_rows_, take_rows
from streamgnn.models.transfer import download
from streamgnn.workers.batch import ApplyResult, Batch, Step
from streamgnn.workers.fold import fold
from streamgnn.workers.messages import outbox
from streamgnn.workers.pulls import pull, pull_columns
from streamgnn.workers.region import NO_GHOSTS, superstep_region
from streamgnn.workers.tables import Tables


def superstep(tb: Tables, b: Batch, hop: int) -> Step:
    """Superstep ``hop`` (1..L) of the open batch ``b``; its counts go to ``b.result``."""
    g, layer, result = tb.graph, tb.layers[hop - 1], b.result
    changed, edges = b.changed, b.edges
    sources = changed.slots
    if layer.degree_normalised:
        sources = tb.sets.union(sources, edges.degree_changed)
    if not len(sources) and not len(edges.dst):  # no message: nothing to recompute
        return _reached_nothing(tb, layer, result, hop, _NO_SLOTS)
    keeps_z, last = tb.z[hop - 1], hop == len(tb.layers)
    owned = tb.owned
    # the unchanged out-edges of the sources (the changed pairs are sent separately),
    # the region they and the changed edges reach, and the rows the next step reads
    at, v1, w1, region, count, fresh, ahead, combined = superstep_region(
        g.out.arrays, np.asarray(sources, np.int64), edges.keys, edges.dst, changed.slots,
        owned, g.in_degree, b.added, edges.src, b.removed, keeps_z and not last,
        tb.sets.mark, tb.sets.scratch, edges.had, edges.has,
        *(NO_GHOSTS if tb.ghost is None else (tb.ghost, tb.ghost_owner)))
    if not len(region):
        return _reached_nothing(tb, layer, result, hop, region)

    columns = columns_of = None  # a pull of some columns only, its destinations on the host
    z_old = None  # the region's z before the batch, where z is kept (not at the last)
    root = tb.root[hop - 1]
    rc, linear = tb.state[hop - 1] is None, layer.aggr.linear
    stored = not (rc or linear)  # finalized from the stored states
    own = (None if keeps_z or root is None  # the owned ones' root terms again
           else changed.slots[owned[changed.slots]])
    features = [] if keeps_z else tb.features_of(hop - 1, region if own is None else own)
    by_row = tb.by_row("state", hop)  # the region's states at its rows, not its slots
    # the indices (and host rows) known now that the steps taken read, in one copy
    up = tb.uploaded(region=region if stored or not keeps_z else None,
                     rows=tb.rows_at(hop, region) if by_row and (stored or own is not None)
                     else None,
                     count=count if rc or stored else None,
                     empty=tb.rows_at(hop, edges.empty_before) if stored else None, own=own,
                     own_rows=tb.rows_at(hop, own) if by_row and own is not None else None,
                     weight=g.in_weight[region] if not keeps_z and own is None else None,
                     features=features[0] if features else None)
    region_at = up["region"]
    rows_at = region_at if up["rows"] is None else up["rows"]
    if rc:  # RC: every destination pulled, no states kept
        pulled_slots = region
        pulled, remote = pull(tb, hop, layer, pulled_slots)
        agg = layer.aggr.finalize(pulled, up["count"]).to(tb.dtype)
    elif linear:  # messages fold into the states, read back in one pass
        agg, wear, z_old = fold(tb, b, hop, layer, sources, at, v1, w1, region, count,
                                keep=keeps_z and not last)
        anchored = layer.aggr.re_anchored(wear)
        pulled_slots, remote = region[anchored], 0
        if len(pulled_slots):  # re-anchored: summed again from all in-neighbors
            pulled, remote = pull(tb, hop, layer, pulled_slots)
            anchored_at, anchored_count = tb.upload(anchored, count[anchored])
            agg[anchored_at] = (pulled if keeps_z else
                                layer.aggr.finalize(pulled, anchored_count)).to(agg.dtype)
        agg = tb.ours(agg)  # (in t's dtype)
    else:
        out = outbox(tb, b, hop, layer, sources, at, v1, w1, region, region_at)
        lost = layer.aggr.apply_delta(tb.state[hop - 1], tb.ties[hop - 1], out.t,
                                      tb.rows_at(hop, out.region), out.new, out.old,
                                      up["empty"], out.part)
        if lost.cols is None:  # (rows of the states: sorted as slots again)
            pulled_slots = np.sort(tb.slots_at(hop, download(lost.dst)[0]))
        else:  # its destinations and columns read back together
            pulled_slots, columns = region[:0], lost
            columns_of, cols = download(lost.dst, lost.cols)
            columns_of = tb.slots_at(hop, columns_of)
        if layer.aggr.destination_dependent:
            pulled_slots = tb.sets.union(pulled_slots, changed.slots, alive=owned)
        remote = pull(tb, hop, layer, pulled_slots)[1] if len(pulled_slots) else 0
        if columns is not None and len(columns_of):
            remote += pull_columns(tb, hop, layer, columns, columns_of)
        agg = layer.aggr.finalize_stored(tb.state[hop - 1], rows_at, up["count"])
        agg = agg.to(tb.dtype)  # (a tensor, or packed attention states)
    activated = None
    if keeps_z:  # agg is z, stored already; h activated here, with rows read next
        activated = np.concatenate([region, ahead])
        after, moved, old_rows, finite = _compared(layer, z_old, agg, tb.state[hop - 1],
                                                   ahead, fresh)
    else:
        if own is None:
            rows = tb.h_rows(hop - 1, region_at, up["features"])
            t = tb.t_rows(hop, layer, region_at, rows) if layer.self_transform else None
            new = layer.update(rows, agg, t, tb.ours(up["weight"]))
        else:  # only vertices whose own input changed need their root term again
            own_at = up["own"]
            own_rows_at = own_at if up["own_rows"] is None else up["own_rows"]
            root[own_rows_at] = layer.root(tb.h_rows(hop - 1, own_at, up["features"]))
            new = layer.finish(layer.combine_root(agg, root.index_select(0, rows_at)))
        moved, old_rows, finite = store_rows_(tb.h[hop], tb.h_at(hop, region), new, fresh,
                                              keep_old=not last)
        after = new
    result.record_step(  # the rows read back at the batch's end
        region, after[:len(region)], len(region),
        len(pulled_slots) + (0 if columns is None else len(columns_of)),
        0 if columns is None else int(np.count_nonzero(cols)), remote, combined)
    return Step(hop, region, after, fresh, moved, old_rows, finite, activated)


def _reached_nothing(tb: Tables, layer: Layer, result: ApplyResult, hop: int,
                     region: np.ndarray) -> Step:
    """The outcome of a superstep whose messages reach no vertex here (``region``
    empty), with its counts."""
    nothing = tb.no_rows(layer.out_dim)[0]
    result.record_step(region, nothing)
    return Step(hop, region, nothing, _NOT_ANY, _NOT_ANY, nothing)


def _compared(layer: Layer, z_old: Tensor | None, z: Tensor, table: Tensor,
              ahead: np.ndarray, fresh: np.ndarray) -> tuple[Tensor, np.ndarray, Tensor, bool]:
    """For a layer whose pre-activation is kept (``z`` of a region, stored already in
    ``table``): the region's rows of h followed by those of the slots ``ahead``, with
    `store_rows_`'s answer: which of the region's changed (all, at the last layer:
    ``z_old`` None) and the old rows of those that did and are not ``fresh``; whether every
    new row is finite. An activation value by value runs in the kernel that compares
    (`activated_rows`); any other activates all rows in one call."""
    kind = layer.elementwise
    if kind is not None:
        return activated_rows(z, table, ahead, kind == "relu", z_old, fresh)
    z_ahead = take_rows(table, ahead)
    n, m = z.shape[0], z.shape[0] + z_ahead.shape[0]  # (a tensor's len() is 5 Python calls)
    parts = [z] + ([z_ahead] if m > n else []) + ([] if z_old is None else [z_old])
    both = layer.activate(torch.cat(parts) if len(parts) > 1 else z)
    after, old = both[:m], (None if z_old is None else both[m:])
    moved, finite = compare_rows(old, after[:n], fresh)
    if old is None:
        return after, moved, after[:0], finite
    return after, moved, take_rows(old, np.flatnonzero(moved & ~fresh)), finite


_NOT_ANY = np.zeros(0, bool)  # no vertex marked (read only)
_NO_SLOTS = np.zeros(0, np.int64)  # no vertex (read only)
