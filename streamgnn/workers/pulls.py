"""Recompute pulls: states a delta cannot fix in place, aggregated again from all the
vertex's in-neighbors. Whole states (`pull`): RC's every destination, a linear state
re-anchored once its rounding bound grew too large, an attention state whose own input
changed or whose denominator cancelled; split into what is read on the host
(`pull_arrays`) and the reduction and store from rows and in-edges on the tables' device
(`pulled`), so a planned batch (`workers/planned.py`) runs the same pull inside its one
upload. Some columns only (`pull_columns`): max/min where the last known carrier of a
column left; also how max/min's ties are first counted (`keep_ties`).

Owns these re-aggregations; must not import kafka or mpi4py, nor the superstep, fold,
messages, planned or ghost-row parts of the shard.
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
    (`pull_arrays`, uploaded in one copy, then `pulled`)."""
    summed = _sums(tb, hop, layer, slots)
    if summed is not None:
        state, remote, up = summed
        return _store(tb, hop, layer, state, up), remote
    arrays, ptr, remote = pull_arrays(tb, hop, layer, slots)
    return pulled(tb, hop, layer, tb.uploaded(**arrays), ptr), remote


def _stored(tb: Tables, hop: int, slots: np.ndarray, count: np.ndarray
            ) -> dict[str, np.ndarray]:
    """What a pull uploads to store the states of ``slots`` (``count``: their in-degrees),
    by name: nothing (RC); where the states are (``at``, `Tables.rows_at`), the
    in-degrees, and where the shard keeps the pre-activation the slots (``own``) and
    what `Tables.h_rows` reads of them on the host (``own_features``)."""
    if tb.state[hop - 1] is None:
        return {}
    stored = {"at": tb.rows_at(hop, slots), "count": count}
    if tb.z[hop - 1]:
        stored["own"] = slots
        stored.update(zip(["own_features"], tb.features_of(hop - 1, slots), strict=False))
    return stored


def _store(tb: Tables, hop: int, layer: Layer, state: Tensor, up: dict[str, Tensor],
           ties: Tensor | None = None) -> Tensor:
    """Store pulled states (``state``, the aggregation's; with their ``ties`` where it
    keeps them) at the rows `_stored`'s arrays (uploaded: ``up``) name, with fresh
    rounding bounds; where the shard keeps the pre-activation it is what is stored.
    Returns what is stored (``state`` itself in RC, which stores nothing)."""
    if tb.state[hop - 1] is None:  # (RC)
        return state
    if tb.z[hop - 1]:  # the pre-activation: aggregated, then the vertex's own terms
        agg = layer.aggr.finalize(state, up["count"])
        state = layer.preactivation(tb.h_rows(hop - 1, up["own"], up.get("own_features")),
                                    tb.ours(agg))
    at = up["at"]
    tb.state[hop - 1][at] = state.to(tb.state[hop - 1].dtype)
    if tb.drift[hop - 1] is not None:
        tb.drift[hop - 1][at] = layer.aggr.fresh_drift(state)
    if ties is not None and tb.ties[hop - 1] is not None:
        tb.ties[hop - 1][at] = ties
    return state


def _sums(tb: Tables, hop: int, layer: Layer, slots: np.ndarray
          ) -> tuple[Tensor, int, dict[str, Tensor]] | None:
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
    return ((layer.transform(state) if layer.transforms else state), remote,
            tb.uploaded(**_stored(tb, hop, slots, end - begin)))


def pull_arrays(tb: Tables, hop: int, layer: Layer, slots: np.ndarray
                ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """What recomputing the states of ``slots`` from rows gathered reads on the host, by
    name, for the caller to upload with whatever else it uploads: `_stored`'s arrays;
    the in-edges' sources (``src_at``) and weights (``w``) and the pulled vertices
    (``pull_at``), as rows of the table of t read (kept t: by slot; else t of the rows
    ``rows`` of h^(hop-1), with their ``features`` at the first layer); the rows' weighted
    in-degrees (``in_weight``) for degree-normalised layers. Also the in-edges' bounds
    (vertex i's are ``ptr[i]:ptr[i+1]``) and how many distinct ghosts they name."""
    g = tb.graph
    ptr, src, w = g.in_edges(slots)
    arrays = _stored(tb, hop, slots, np.diff(ptr))
    if tb.t[hop - 1] is not None:  # kept: read in place, by slot
        rows, src_at, pull_at = slice(None), src, slots
    else:  # the rows of h^(hop-1) the pull reads (`pulled` transforms them or the sums)
        rows = tb.sets.union(src, slots)
        arrays["rows"] = rows
        arrays.update(zip(["features"], tb.features_of(hop - 1, rows), strict=False))
        src_at, pull_at = tb.sets.positions(rows, src), tb.sets.positions(rows, slots)
    arrays.update(src_at=src_at, w=w, pull_at=pull_at)
    if layer.degree_normalised:
        arrays["in_weight"] = g.in_weight[rows]
    return arrays, ptr, _ghosts_read(tb, src)


def pulled(tb: Tables, hop: int, layer: Layer, up: dict[str, Tensor],
           ptr: np.ndarray | None) -> Tensor:
    """The states `pull_arrays` planned, from its arrays uploaded (``up``), computed
    and stored (`_store`; returns what is stored). The rows read are transformed unless
    the sums will be (a linear aggregation: h summed, then transformed). Reduced by
    `aggregate`: with the in-edges' bounds ``ptr`` on the host, by the CPU's fused and
    sparse kernels where they apply; with ``ptr`` None (a planned batch, which reads
    nothing back between its upload and its download), on the device from each in-edge's
    destination ``up["local"]``, max/min's ties counted beside the states."""
    kept = tb.t[hop - 1]
    raw = kept is None and layer.aggr.linear and layer.transforms
    t = kept
    if kept is None:
        h = tb.h_rows(hop - 1, up["rows"], up.get("features"))
        t = h if raw else layer.transform(h)
    scale = layer.source_scale(tb.ours(up["in_weight"])) if "in_weight" in up else None
    state, ties = aggregate(layer, t, up["src_at"], up["w"], scale, up["pull_at"], ptr,
                            up.get("local"))
    return _store(tb, hop, layer, layer.transform(state) if raw else state, up, ties)


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
