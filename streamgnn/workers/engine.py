"""`Engine`: exact incremental GNN inference (RIPPLE++). Keeps every layer's embedding of
every vertex and each layer's aggregation state; a batch of updates is applied to the
graph and then pushed through L supersteps, each touching only vertices whose inputs
changed.

Superstep l, for sources whose h^{l-1} changed (and, for degree-normalised layers, whose
in-degree changed): every message that stops arriving (old value, old edge) and every
message that starts arriving (new value, new edge) is sent, combined per destination and
folded into the stored states by the aggregation (``apply_delta``); destinations it cannot
fix that way (max losing its maximum, attention at a vertex whose own input changed or
whose denominator cancelled) are pulled: their state is recomputed from all
in-neighbours. Then h^l is recomputed for the destinations and for vertices whose own
h^{l-1} changed. ``recompute=True`` is the RC baseline: the same affected region, every
destination pulled, no states kept.

Owns per-layer state and propagation; must not import kafka or mpi4py (the exchange is
behind `Partition`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from streamgnn.datasets import GraphData
from streamgnn.errors import InvalidUpdateError, NonFiniteEmbeddingError
from streamgnn.graph import DynamicGraph, GraphDiff, pair_keys
from streamgnn.models import decompose
from streamgnn.models.inference import aggregate, layerwise_states
from streamgnn.models.layers import Layer
from streamgnn.updates import Update, UpdateBatch, ValueLimits
from streamgnn.workers.deltas import linear_delta_messages
from streamgnn.workers.partition import Outbox, Partition, SinglePartition
from streamgnn.workers.slotsets import SlotSets


@dataclass
class ApplyResult:
    """What a batch changed: ``changed_labels`` maps external id -> (old, new) predicted
    label (old is None for a vertex the batch added); ``recomputed``/``pulled`` count the
    vertices per layer whose embedding was recomputed / whose state was re-aggregated;
    ``rejected`` holds the errors of updates a ``skip_invalid`` batch left out."""

    changed_labels: dict[int, tuple[int | None, int]]
    rejected: list[InvalidUpdateError] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    pulled: list[int] = field(default_factory=list)


@dataclass
class _Changed:
    """Vertices whose h^{l-1} changed in this batch, and the old rows of those that had
    one (vertices the batch added have none)."""

    slots: np.ndarray
    old_slots: np.ndarray
    old_rows: Tensor


@dataclass
class _Step:
    """One superstep's outcome: the recomputed ``region`` with its rows ``before`` (None at
    the last layer, whose old rows only mattered for labels: the engine keeps those) and
    ``after``; ``fresh`` marks region vertices the batch added (no meaningful before)."""

    region: np.ndarray
    before: Tensor | None
    after: Tensor
    fresh: np.ndarray

    def changed(self) -> _Changed:
        """The vertices whose embedding really changed: the next superstep's sources."""
        moved = _rows_differ(self.after, self.before) | self.fresh
        had_old = moved & ~self.fresh
        return _Changed(self.region[moved], self.region[had_old], self.before.index_select(
            0, torch.from_numpy(np.flatnonzero(had_old)).to(self.before.device)))


@dataclass
class _BatchEdges:
    """The batch's net edge changes and what follows from them, shared by all supersteps."""

    src: np.ndarray
    dst: np.ndarray
    before: np.ndarray           # weights, 0 where absent
    after: np.ndarray
    had: np.ndarray
    has: np.ndarray
    keys: np.ndarray             # sorted (src << 32 | dst) of the changed pairs
    degree_changed: np.ndarray   # live vertices whose in-edges changed
    empty_before: np.ndarray     # live destinations that had no in-edge before the batch


class Engine:
    """Exact incremental inference of a PyG model over a dynamic graph (DESIGN.md)."""

    def __init__(self, model: torch.nn.Module, graph: DynamicGraph, device: str = "cpu",
                 recompute: bool = False, partition: Partition | None = None,
                 progress: bool = False) -> None:
        self._attach(model, graph, device, partition)
        hs, self.state = layerwise_states(self.layers, graph, device, progress=progress,
                                          dtype=self.dtype)
        if recompute:  # RC re-aggregates from scratch: it keeps no states
            self.state = [None] * len(self.layers)
        self.h: list[Tensor | None] = [None, *hs[1:]]  # h[0] lives in the graph
        self._labels = hs[-1].argmax(dim=-1).cpu().numpy()  # predicted class per slot
        with torch.inference_mode():
            self.root = [layer.root(h) if layer.caches_root and not recompute else None
                         for layer, h in zip(self.layers, hs, strict=False)]
            self.t = [layer.transform(h) if layer.caches_t and not recompute else None
                      for layer, h in zip(self.layers, hs, strict=False)]
        self._in_weight = graph.in_weight.copy()  # in-degrees the states were built with

    def _attach(self, model: torch.nn.Module, graph: DynamicGraph, device: str,
                partition: Partition | None) -> None:
        self.layers: list[Layer] = decompose(model.to(device))
        self.graph = graph
        self.device = torch.device(device)
        self.partition = partition or SinglePartition()
        self.sets = SlotSets(len(graph.alive))
        self.dtype = next(model.parameters()).dtype  # float32, or float64 for checks
        self._poisoned: str | None = None  # why the state can no longer be trusted

    @classmethod
    def from_pyg(cls, model: torch.nn.Module, data: GraphData, device: str = "cpu",
                 limits: ValueLimits | None = None, **kwargs) -> Engine:
        """Bootstrap: load ``data`` and compute every layer's state (layer-wise). The
        graph accepts feature values and weights within ``limits`` (default `ValueLimits`)."""
        return cls(model, DynamicGraph.from_data(data, limits), device, **kwargs)

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything the engine knows beside the model, as plain arrays (what a checkpoint
        holds): the graph as laid out (``graph/...``, so a restored engine repeats this one
        bit for bit), and per layer k its embeddings ``h/k``, aggregation states
        ``state/k``, kept root terms ``root/k`` and transforms ``t/k`` where it keeps them."""
        out = {f"graph/{k}": a for k, a in self.graph.to_arrays().items()}
        for name in ("h", "state", "root", "t"):
            for k, rows in enumerate(getattr(self, name)):
                if rows is not None:
                    out[f"{name}/{k}"] = rows.cpu().numpy()
        out["in_weight"] = self._in_weight
        return out

    @classmethod
    def restore(cls, model: torch.nn.Module, snapshot: dict[str, np.ndarray],
                device: str = "cpu", partition: Partition | None = None) -> Engine:
        """The engine `snapshot` was taken of, with ``model`` (the same weights)."""
        graph = DynamicGraph.from_arrays({k.removeprefix("graph/"): a for k, a in
                                          snapshot.items() if k.startswith("graph/")})
        engine = cls.__new__(cls)
        engine._attach(model, graph, device, partition)
        for name in ("h", "state", "root", "t"):
            setattr(engine, name, [
                None if (a := snapshot.get(f"{name}/{k}")) is None
                else torch.from_numpy(np.array(a)).to(device)
                for k in range(engine.num_layers + (name == "h"))])
        engine._in_weight = np.array(snapshot["in_weight"])
        engine._labels = engine.h[-1].argmax(dim=-1).cpu().numpy()
        return engine

    # ---------------------------------------------------------------- reads
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def lookup(self, ids, layer: int = -1) -> np.ndarray:
        """Embeddings of ``ids`` at ``layer`` (0: features, -1: the output)."""
        layer = layer % (self.num_layers + 1)
        slots = self.graph.slots(ids)
        return self._rows(layer, self._index(slots)).cpu().numpy()

    def label(self, ids) -> np.ndarray:
        """Predicted class of ``ids``: argmax of the output layer."""
        return self.lookup(ids, -1).argmax(axis=1)

    def vertex_ids(self) -> np.ndarray:
        return self.graph.vertex_ids()

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.graph.edges()

    # ---------------------------------------------------------------- batches
    @torch.inference_mode()
    def apply(self, batch: Sequence[Update] | UpdateBatch, skip_invalid: bool = False
              ) -> ApplyResult:
        """Apply one batch (updates, or their columns; in order, atomically) and bring every
        embedding up to date.
        A bad update raises its `InvalidUpdateError` and nothing is applied; with
        ``skip_invalid`` it is left out and listed in ``ApplyResult.rejected``.
        A batch that drives an embedding to NaN or inf raises `NonFiniteEmbeddingError`
        and leaves the engine unusable (every later call raises it): restore a snapshot."""
        if self._poisoned is not None:
            raise NonFiniteEmbeddingError(self._poisoned)
        diff = self.graph.apply(batch, skip_invalid)
        self.sets.fit(len(self.graph.alive))
        self._fit_capacity()
        edges = self._batch_edges(diff)
        added = diff.added.astype(np.int64)
        removed = diff.removed.astype(np.int64)
        changed = _Changed(np.concatenate([diff.changed, diff.added]).astype(np.int64),
                           diff.changed.astype(np.int64),
                           self._tensor(diff.changed_x_before).to(self.dtype))
        removed_rows = self._tensor(diff.removed_x).to(self.dtype)
        for state in self.state:  # a reused slot holds a deleted vertex's state
            if state is not None and len(added):
                state[self._index(added)] = 0
        is_added = np.zeros(self.graph.num_slots, bool)
        is_added[added] = True
        result = ApplyResult({}, diff.rejected)
        for hop, layer in enumerate(self.layers, start=1):
            step = self._superstep(hop, layer, changed, removed, removed_rows, is_added, edges,
                                   result)
            if not bool(torch.isfinite(step.after).all()):
                self._poisoned = (f"a batch of {len(batch)} updates drove layer {hop} "
                                  "embeddings to NaN or inf; restore the engine from a snapshot")
                raise NonFiniteEmbeddingError(self._poisoned)
            if hop < self.num_layers:
                changed = step.changed()
                removed_rows = self.h[hop].index_select(0, self._index(removed))
        result.changed_labels = self._label_changes(step)
        touched = self.sets.union(edges.degree_changed, added)
        self._in_weight[touched] = self.graph.in_weight[touched]
        return result

    def _superstep(self, hop: int, layer: Layer, changed: _Changed, removed: np.ndarray,
                   removed_rows: Tensor, is_added: np.ndarray, edges: _BatchEdges,
                   result: ApplyResult) -> _Step:
        g = self.graph
        sources = changed.slots
        if layer.degree_normalised:
            sources = self.sets.union(sources, edges.degree_changed)
        # Unchanged out-edges of the sources (the changed pairs are sent separately).
        at, v1, w1 = g.out_edges_except(sources, edges.keys)
        region = self.sets.union(v1, edges.dst, changed.slots, alive=g.alive)
        if not len(region):
            result.recomputed.append(0)
            result.pulled.append(0)
            nothing = self.h[hop][:0]
            return _Step(region, nothing, nothing, is_added[region])

        if self.state[hop - 1] is None:  # RC
            pull = region
        else:
            outbox = self._messages(hop, layer, sources, at, v1, w1, changed, removed,
                                    removed_rows, edges, region)
            outbox = self.partition.exchange(hop, outbox)
            pull = self._apply_delta(hop, layer, outbox, edges)
            if layer.aggr.destination_dependent:
                pull = self.sets.union(pull, changed.slots, alive=g.alive)
        pulled = self._pull(hop, layer, pull) if len(pull) else None

        index = self._index(region)
        # Without stored states, the pull covered the whole region.
        state = pulled if self.state[hop - 1] is None else self.state[hop - 1].index_select(
            0, index)
        count = self._index(g.in_degree[region])
        agg = layer.aggr.finalize(state, count).to(self.dtype)
        root = self.root[hop - 1]
        if root is None:
            rows = self._rows(hop - 1, index)
            t = self._t(hop, layer, index) if layer.self_transform else None
            new = layer.update(rows, agg, t, self._weight(g.in_weight, region))
        else:  # only vertices whose own input changed need their root term again
            own = self._index(changed.slots)
            root[own] = layer.root(self._rows(hop - 1, own))
            new = layer.finish(layer.combine_root(agg, root.index_select(0, index)))
        before = self.h[hop].index_select(0, index) if hop < self.num_layers else None
        self.h[hop][index] = new
        result.recomputed.append(len(region))
        result.pulled.append(len(pull))
        return _Step(region, before, new, is_added[region])

    def _messages(self, hop: int, layer: Layer, sources: np.ndarray, at: np.ndarray,
                  v1: np.ndarray, w1: np.ndarray, changed: _Changed, removed: np.ndarray,
                  removed_rows: Tensor, edges: _BatchEdges, region: np.ndarray) -> Outbox:
        """Messages that stop and start arriving in the region: along the unchanged edges
        ``sources[at] -> v1`` (weights ``w1``) and along the changed edges. Linear
        aggregations get them combined per destination into one delta each."""
        sets = self.sets
        slots = sets.union(sources, edges.src, removed)  # sources, and a row for every old row
        t, old = self._source_rows(hop, layer, slots, changed, removed, removed_rows)
        live = self.graph.alive[edges.dst]  # messages to deleted vertices are moot
        has, had = edges.has & live, edges.had & live
        at1 = sets.positions(slots, sources)[at]
        at2 = sets.positions(slots, edges.src)
        if layer.aggr.linear:  # one message per row of t it carries
            scale_new, scale_old = self._source_scales(layer, slots)
            rows, coef, local = linear_delta_messages(
                old, at1, v1, w1, at2, edges.dst, edges.before, edges.after, has, had,
                layer.edge_weighted, scale_new, scale_old, region, sets.scratch)
            combined = layer.aggr.combine(t, rows, coef, local, len(region))
            return Outbox(self._index(region), combined, self._index(region[:0]), combined[:0])

        t_new, t_old = t[:len(slots)], t.index_select(0, self._index(old))
        dst_new, dst_old = edges.dst[has], edges.dst[had]
        t_dst = self._destination_rows(hop, layer, region, v1, dst_new, dst_old)
        at1, at2, w1 = self._index(at1), self._index(at2), self._tensor(w1).to(self.dtype)
        has_t, had_t = self._tensor(has), self._tensor(had)
        after = self._tensor(edges.after).to(self.dtype)
        before = self._tensor(edges.before).to(self.dtype)
        return Outbox(self._index(np.concatenate([v1, dst_new])),
                      torch.cat([layer.delta_messages(t_new, at1, w1, t_dst[0]),
                                 layer.delta_messages(t_new, at2[has_t], after[has_t],
                                                      t_dst[1])]),
                      self._index(np.concatenate([v1, dst_old])),
                      torch.cat([layer.delta_messages(t_old, at1, w1, t_dst[0]),
                                 layer.delta_messages(t_old, at2[had_t], before[had_t],
                                                      t_dst[2])]))

    def _source_rows(self, hop: int, layer: Layer, slots: np.ndarray, changed: _Changed,
                     removed: np.ndarray, removed_rows: Tensor) -> tuple[Tensor, np.ndarray]:
        """t of the message sources ``slots``, in one transform: rows ``0..len(slots)``
        after the batch, then those before it of the sources whose input changed; and
        ``old``: the row holding each source's t before the batch."""
        olds = np.concatenate([changed.old_slots, removed])
        t = layer.transform(torch.cat([self._rows(hop - 1, self._index(slots)),
                                       changed.old_rows, removed_rows]))
        old = np.arange(len(slots))
        old[self.sets.positions(slots, olds)] = np.arange(len(slots), len(slots) + len(olds))
        kept = self.t[hop - 1]
        if kept is not None:  # the sources include every vertex whose input changed
            kept[self._index(changed.slots)] = t.index_select(
                0, self._index(self.sets.positions(slots, changed.slots)))
        return t, old

    def _source_scales(self, layer: Layer, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The per-source message factor after and before the batch (degree-normalised
        layers; ones otherwise), in float64."""
        if not layer.degree_normalised:
            ones = np.ones(len(slots))
            return ones, ones
        return tuple(layer.source_scale(torch.from_numpy(w[slots])).numpy()
                     for w in (self.graph.in_weight, self._in_weight))

    def _destination_rows(self, hop: int, layer: Layer, region: np.ndarray,
                          *dst_sets: np.ndarray) -> list[Tensor | None]:
        """For destination-dependent aggregations, what the messages need of each one's
        destination (``Layer.destination_part`` of its current t: a destination whose
        input changed is pulled anyway)."""
        if not layer.aggr.destination_dependent:
            return [None] * len(dst_sets)
        part = layer.destination_part(self._t(hop, layer, self._index(region)))
        return [part[self._index(self.sets.positions(region, d))] for d in dst_sets]

    def _apply_delta(self, hop: int, layer: Layer, outbox: Outbox,
                     edges: _BatchEdges) -> np.ndarray:
        pull = layer.aggr.apply_delta(self.state[hop - 1], outbox.new_msg, outbox.new_dst,
                                      outbox.old_msg, outbox.old_dst,
                                      self._index(edges.empty_before))
        return pull.cpu().numpy()

    def _pull(self, hop: int, layer: Layer, pull: np.ndarray):
        """Recompute the states of ``pull`` from all their in-neighbours."""
        g = self.graph
        ptr, src, w = g.in_edges(pull)
        if self.t[hop - 1] is not None:  # kept: read in place, by slot
            rows, t = slice(None), self.t[hop - 1]  # rows: all slots
            src_at, pull_at = src, pull
        else:  # transform the rows the pull reads
            rows = self.sets.union(src, pull)
            t = self._t(hop, layer, self._index(rows))
            src_at, pull_at = self.sets.positions(rows, src), self.sets.positions(rows, pull)
        scale = (layer.source_scale(self._weight(g.in_weight, rows))
                 if layer.degree_normalised else None)
        state = aggregate(layer, t, ptr, self._index(src_at), self._tensor(w).to(t.dtype),
                          scale, self._index(pull_at))
        if self.state[hop - 1] is not None:
            self.state[hop - 1][self._index(pull)] = state.to(self.state[hop - 1].dtype)
        return state

    # ---------------------------------------------------------------- helpers
    def _batch_edges(self, diff: GraphDiff) -> _BatchEdges:
        g, e = self.graph, diff.edges
        src, dst = e.src.astype(np.int64), e.dst.astype(np.int64)
        had, has = ~np.isnan(e.before), ~np.isnan(e.after)
        degree_changed = self.sets.union(dst, alive=g.alive)
        live = g.alive[dst]
        gained = np.bincount(self.sets.positions(degree_changed, dst[has & ~had]),
                             minlength=len(degree_changed))
        lost = np.bincount(self.sets.positions(degree_changed, dst[had & ~has & live]),
                           minlength=len(degree_changed))
        old_degree = g.in_degree[degree_changed] - gained + lost
        return _BatchEdges(src, dst, np.where(had, e.before, 0), np.where(has, e.after, 0),
                           had, has, np.sort(pair_keys(src, dst)), degree_changed,
                           degree_changed[old_degree == 0])

    def _label_changes(self, last: _Step) -> dict[int, tuple[int | None, int]]:
        new = _argmax_rows(last.after)
        old = self._labels[last.region]
        self._labels[last.region] = new
        differs = (new != old) | last.fresh
        changes = dict(zip(self.graph.ext[last.region[differs]].tolist(),
                           zip(old[differs].tolist(), new[differs].tolist())))
        for v in self.graph.ext[last.region[last.fresh]].tolist():
            changes[v] = (None, changes[v][1])  # added by the batch: no old label
        return changes

    def _t(self, hop: int, layer: Layer, index: Tensor) -> Tensor:
        """t of the vertices ``index`` at superstep ``hop``: kept, or transformed from
        their h^(hop-1)."""
        kept = self.t[hop - 1]
        if kept is None:
            return layer.transform(self._rows(hop - 1, index))
        return kept.index_select(0, index)

    def _rows(self, layer: int, index: Tensor) -> Tensor:
        if layer == 0:
            rows = self.graph.x.take(index.cpu().numpy(), axis=0)
            return torch.from_numpy(rows).to(self.device, self.dtype)
        return self.h[layer].index_select(0, index)

    def _index(self, slots: np.ndarray) -> Tensor:
        index = torch.from_numpy(slots if slots.dtype == np.int64 else slots.astype(np.int64))
        return index if self.device.type == "cpu" else index.to(self.device)

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _weight(self, in_weight: np.ndarray, slots: np.ndarray) -> Tensor:
        return torch.from_numpy(in_weight[slots]).to(self.device, self.dtype)

    def _fit_capacity(self) -> None:
        """Grow the per-vertex tensors with the graph."""
        need = self.graph.num_slots
        have = self.h[-1].shape[0]
        if need <= have:
            return
        size = max(need, have * 5 // 4)
        self.h = [None, *(_grown(h, size) for h in self.h[1:])]
        self.state = [None if s is None else _grown(s, size) for s in self.state]
        self.root = [None if r is None else _grown(r, size) for r in self.root]
        self.t = [None if t is None else _grown(t, size) for t in self.t]
        self._labels = np.concatenate([self._labels,
                                       np.zeros(size - len(self._labels), np.int64)])
        if len(self._in_weight) < len(self.graph.in_weight):
            grown = np.zeros(len(self.graph.in_weight))
            grown[:len(self._in_weight)] = self._in_weight
            self._in_weight = grown


def _grown(t: Tensor, size: int) -> Tensor:
    out = t.new_zeros((size, *t.shape[1:]))
    out[:len(t)] = t
    return out


# Row reductions: numpy is quicker than torch on the small CPU tensors of a batch.
def _argmax_rows(t: Tensor) -> np.ndarray:
    return t.numpy().argmax(axis=1) if t.device.type == "cpu" else t.argmax(-1).cpu().numpy()


def _rows_differ(a: Tensor, b: Tensor) -> np.ndarray:
    if a.device.type == "cpu":
        return (a.numpy() != b.numpy()).any(axis=1)
    return (a != b).any(dim=-1).cpu().numpy()
