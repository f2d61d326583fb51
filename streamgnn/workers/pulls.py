"""Recompute pulls: states a delta cannot fix in place, aggregated again from all the
vertex's in-neighbors. Whole states (`pull`): RC's every destination, a linear state
re-anchored once its rounding bound grew too large, an attention state whose own input
changed or whose denominator cancelled. Some columns only (`pull_columns`): max/min
where the last known carrier of a column left; also how max/min's ties are first
counted (`keep_ties`).

Owns these re-aggregations; must not import kafka or mpi4py, nor the superstep, fold,
messages or ghost-row parts of the shard.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch
from torch import Tensor

from streamgnn.models.aggr import Pull
from streamgnn.models.inference import aggregate, chunk_bounds
from streamgnn.models.layers import Layer
from streamgnn.models.rowops import in_row_sums
from streamgnn.workers.tables import Tables


def pull(tb: Tables, hop: int, layer: Layer, slots: np.ndarray) -> tuple[Tensor, int]:
    """Recompute the states of ``slots`` from all their in-neighbors; also returns how
    many distinct ghosts they read. A linear aggregation sums the rows of h and
    transforms the sums (its transform is linear without bias, so it commutes with
    them: `Layer.partial`), one row per pulled vertex instead of one per in-neighbor:
    where h is a stored table, summed in place (`_sums`), else from rows gathered
    (`_gathered`, which uploads what is stored here with its own indices)."""
    state, remote, stored = _sums(tb, hop, layer, slots) or _gathered(tb, hop, layer, slots)
    if tb.state[hop - 1] is None:  # (RC)
        return state, remote
    at, *up = stored
    if tb.z[hop - 1]:  # the pre-activation: aggregated, then the vertex's own terms
        count_at, slots_at, *features = up
        agg = layer.aggr.finalize(state, count_at)
        state = layer.preactivation(tb.h_rows(hop - 1, slots_at, *features), tb.ours(agg))
    tb.state[hop - 1][at] = state.to(tb.state[hop - 1].dtype)
    if tb.drift[hop - 1] is not None:
        tb.drift[hop - 1][at] = layer.aggr.fresh_drift(state)
    return state, remote


def _stored(tb: Tables, hop: int, slots: np.ndarray, count: np.ndarray
            ) -> list[np.ndarray]:
    """What `pull` uploads to store the states of ``slots`` (``count``: their in-degrees):
    nothing (RC), where the states are (`Tables.rows_at`), and where the shard keeps the
    pre-activation their in-degrees, the slots and what `Tables.h_rows` reads of them on
    the host."""
    if tb.state[hop - 1] is None:
        return []
    z = [count, slots, *tb.features_of(hop - 1, slots)] if tb.z[hop - 1] else []
    return [tb.rows_at(hop, slots), *z]


def _sums(tb: Tables, hop: int, layer: Layer, slots: np.ndarray
          ) -> tuple[Tensor, int, list[Tensor]] | None:
    """`pull`'s aggregation where it is a sum of rows of a table h^(hop-1) is read from
    (`Tables.h_table_of`), weighted by the edges' weights alone (a linear aggregation,
    not degree-normalised, whose t is not kept): summed where the rows and in-edges are
    stored (`in_row_sums`), then transformed. Returns the states, the distinct ghosts
    read and `_stored`'s arrays uploaded; None where the pull must gather rows."""
    if not layer.aggr.linear or layer.degree_normalised or tb.t[hop - 1] is not None:
        return None
    source = tb.h_table_of(hop - 1)
    if source is None:
        return None
    begin, end, src, w, remote = _in_edges(tb, slots)
    table, relu = source
    state = in_row_sums(table, relu, begin, end, src, w if layer.edge_weighted else None,
                        tb.dtype, tb.device)
    stored = _stored(tb, hop, slots, end - begin)
    return ((layer.transform(state) if layer.transforms else state), remote,
            tb.upload(*stored) if stored else [])


def _gathered(tb: Tables, hop: int, layer: Layer, slots: np.ndarray
              ) -> tuple[Tensor, int, list[Tensor]]:
    """`pull`'s aggregation from the rows of t its in-neighbors read, gathered (and
    transformed unless the sums will be), or read in place where t is kept; with the
    distinct ghosts read and `_stored`'s arrays, uploaded with the indices it reads."""
    g = tb.graph
    ptr, src, w = g.in_edges(slots)
    remote = _ghosts_read(tb, src)
    t = tb.t[hop - 1]
    raw = t is None and layer.aggr.linear and layer.transforms  # h summed, then transformed
    if t is not None:  # kept: read in place, by slot
        rows, read = slice(None), []  # rows: all slots
        src_at, pull_at = src, slots
    else:  # the rows the pull reads, transformed unless the sums will be
        rows = tb.sets.union(src, slots)
        read = [rows, *tb.features_of(hop - 1, rows)]
        src_at, pull_at = tb.sets.positions(rows, src), tb.sets.positions(rows, slots)
    weights = [g.in_weight[rows]] if layer.degree_normalised else []
    stored = _stored(tb, hop, slots, np.diff(ptr))
    up = tb.upload(*stored, src_at, w, pull_at, *weights, *read)  # in one copy
    stored, (src_at, w, pull_at, *up) = up[:len(stored)], up[len(stored):]
    scale = layer.source_scale(tb.ours(up.pop(0))) if weights else None
    if t is None:
        h = tb.h_rows(hop - 1, *up)
        t = h if raw else layer.transform(h)
    state = aggregate(layer, t, ptr, src_at, w.to(t.dtype), scale, pull_at)
    return (layer.transform(state) if raw else state), remote, stored


def pull_columns(tb: Tables, hop: int, layer: Layer, lost: Pull, slots: np.ndarray) -> int:
    """Re-aggregate the columns ``lost.cols`` of ``lost.dst`` (their rows of the states,
    `Tables.rows_at`, of ``slots`` on the host) from all their in-neighbors
    (`Aggregation.pull_columns`), reading their rows of t in place where t is h as stored
    (and, without ghosts to count, the in-edges where the graph keeps them); returns how
    many distinct ghosts they read."""
    table = None if layer.transforms else tb.h_table(hop - 1)
    begin, end, src, w, remote = _in_edges(tb, slots, listed=table is None)
    if table is None:  # t of the rows read
        rows = tb.sets.union(src)
        table = tb.t_rows_at(hop, layer, rows)
        src = tb.sets.positions(rows, src)
    layer.aggr.pull_columns(tb.state[hop - 1], tb.ties[hop - 1], lost, table, begin, end,
                            src, w if layer.edge_weighted else None)
    return remote


def keep_ties(tb: Tables) -> None:
    """Beside each state of an aggregation that keeps ties (max/min), the ties, counted
    where there are none yet."""
    for hop, (layer, state) in enumerate(zip(tb.layers, tb.state, strict=True), start=1):
        if state is not None and layer.aggr.ties_dtype and tb.ties[hop - 1] is None:
            tb.ties[hop - 1] = torch.zeros(state.shape, dtype=layer.aggr.ties_dtype,
                                           device=tb.device)
            _count_ties(tb, hop)


@torch.inference_mode()
def _count_ties(tb: Tables, hop: int, max_edges: int = 1 << 20) -> None:
    """Layer ``hop``'s ties of every vertex the shard owns: all their columns
    re-aggregated, vertices in chunks of at most ``max_edges`` in-edges."""
    owned = np.flatnonzero(tb.owned[:tb.graph.num_slots])
    width = tb.state[hop - 1].shape[1]
    for a, b in pairwise(chunk_bounds(tb.graph.in_degree[owned], max_edges).tolist()):
        cols = torch.ones((b - a, width), dtype=torch.bool, device=tb.device)
        pull_columns(tb, hop, tb.layers[hop - 1],
                     Pull(tb.index(tb.rows_at(hop, owned[a:b])), cols), owned[a:b])


def _in_edges(tb: Tables, slots: np.ndarray, listed: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The in-edges of ``slots`` as blocks: vertex i's sources are ``src[begin[i]:end[i]]``,
    weights alongside in ``w``; and how many distinct ghosts they name. Read where the
    graph stores them (no copy) unless ``listed`` (the blocks one after another,
    `DynamicGraph.in_edges`) or there are ghosts to count."""
    if tb.ghost is None and not listed:
        begin, end, src, w = tb.graph.in_blocks(slots)
        return begin, end, src, w, 0
    ptr, src, w = tb.graph.in_edges(slots)
    return ptr[:-1], ptr[1:], src, w, _ghosts_read(tb, src)


def _ghosts_read(tb: Tables, src: np.ndarray) -> int:
    """How many distinct ghosts the slots ``src`` name."""
    return 0 if tb.ghost is None else len(np.unique(src[tb.ghost[src]]))
