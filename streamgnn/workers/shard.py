"""`Shard`: one partition of the exact incremental engine (RIPPLE++). Keeps every layer's
embedding of the vertices it owns and each layer's aggregation state (`Tables`); a batch
of updates (already applied to its graph) is pushed through L supersteps, each touching
only vertices whose inputs changed (`superstep`).

Superstep l, for sources whose h^{l-1} changed (and, for degree-normalised layers, whose
in-degree changed): every message that stops arriving (old value, old edge) and every
message that starts arriving (new value, new edge) is sent, combined per destination and
folded into the stored states by the aggregation (`fold`, or ``apply_delta`` of the
messages `messages` builds); destinations it cannot fix that way are pulled (`pulls`):
their state is recomputed from all in-neighbors, whole (attention at a vertex whose own
input changed or whose denominator cancelled) or in the columns that need it (max/min
where the maximum may have left). Then h^l is recomputed for the destinations and for
vertices whose own h^{l-1} changed. ``recompute=True`` is the RC baseline: the same
affected region, every destination pulled, no states kept.

A sum or mean layer with a root term keeps its pre-activation z alone
(`Layer.keeps_preactivation`): no embeddings, no root terms; the root terms of vertices
whose input changed fold into their own z as messages (a mean's z is first rescaled about
its root term and bias where the in-degree changed), and h = `Layer.activate` of z
wherever a row is read.

Partitions: a shard's graph holds the vertices it owns, every edge into them, and *ghosts*:
copies of remote in-neighbors (their features, in-degree and every layer's row but the
last's as the owner stores it, h or z, never computed here; no states, no labels:
`Tables`). Between supersteps (`ghost_rows`) each
owner sends the rows of its vertices that changed to the shards holding them as ghosts,
so messages and pulls read every in-neighbor locally. Without ghosts (one partition)
nothing is sent. Shards in one process whose batches run planned skip the exchanges:
`planned_shards` runs them all together (`begin_together`, `finish_together`).

Owns a batch's BSP program (begin, the supersteps with the exchanges between them, the
label changes at the end), the shard's construction and its query reads; must not import
kafka or mpi4py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.models.inference import layer_by_layer
from streamgnn.models.layers import Layer
from streamgnn.models.rowops import argmax_rows, fill_rows_
from streamgnn.models.transfer import download, numpy_dtype
from streamgnn.npz import prefixed, under
from streamgnn.updates import DELETE_VERTEX, NO_X, UpdateBatch
from streamgnn.workers.batch import ApplyResult, Batch, BatchEdges, Changed
from streamgnn.workers.exchange import sizes, waited
from streamgnn.workers.ghost_rows import (
    begin_routed,
    incoming,
    layer_incoming,
    layer_outgoing,
    outgoing,
)
from streamgnn.workers.halo import begin_halo, let_go
from streamgnn.workers.labels import ChangedLabels, relabel_
from streamgnn.workers.placement import Routed
from streamgnn.workers.planned import Planned, plans
from streamgnn.workers.pulls import keep_ties
from streamgnn.workers.superstep import superstep
from streamgnn.workers.tables import Tables, keeps_z


@dataclass
class Deferred:
    """A shard's part of a query layer for a caller in this process, which uploads the
    shard's host ``arrays`` with its own: ``finish`` then computes the part where the shard
    holds its tables, from those arrays as tensors there (by the same names) and, for
    attention's partials, the destinations' parts (a tensor there, or None)."""

    arrays: dict[str, np.ndarray]
    finish: Callable[[dict[str, Tensor], Tensor | None], Tensor]


class Shard:
    """The vertices one partition owns (all of them when there is one), their per-layer
    state (``tables``) and the supersteps over them."""

    def __init__(self, layers: list[Layer], graph: DynamicGraph, hs: list[Tensor],
                 states: list[Tensor | None], device: torch.device, dtype: torch.dtype,
                 ghost: np.ndarray | None = None, holders: np.ndarray | None = None,
                 ghost_owner: np.ndarray | None = None) -> None:
        """``hs``: [h0, ..., hL] of every slot (ghosts' rows included); ``states`` per
        layer, or None (RC) (the shard takes both lists over); ``ghost``: which slots
        are ghosts (None: there are none); ``holders``: per slot, a bit per partition
        holding it as a ghost;
        ``ghost_owner``: per ghost slot, the partition owning it."""
        self._hold(Tables(layers, graph, hs, states, device, dtype, ghost, holders,
                          ghost_owner))

    @classmethod
    def from_arrays(cls, layers: list[Layer], arrays: dict[str, np.ndarray],
                    device: torch.device, dtype: torch.dtype,
                    graph: DynamicGraph | None = None) -> Shard:
        """The shard `arrays` came from; on ``graph`` if given (arrays without one). It
        adopts the arrays, which nothing else may hold."""
        shard = cls.__new__(cls)
        shard._hold(Tables.from_arrays(layers, arrays, device, dtype, graph))
        return shard

    def _hold(self, tables: Tables) -> None:
        """Take ``tables`` over: max/min's ties counted where there are none yet (arrays
        written before they were kept), then moved onto huge pages."""
        self.tables, self.layers, self.graph = tables, tables.layers, tables.graph
        self._batch: Batch | None = None
        self._planned: Planned | None = None  # the open batch, where it runs planned
        self.sent: list[int] = []      # the last batch's bytes per exchange ...
        self.received: list[int] = []
        self.busy: list[float] = []    # ... and its compute seconds between them
        self.ghost_feature_bytes = 0   # the last routed batch's features of ghosts (+ ids)
        self._sends_in_degrees = any(layer.degree_normalised for layer in self.layers)
        keep_ties(tables)
        tables.on_huge_pages()

    @staticmethod
    def cut(graph: DynamicGraph, owned: int, holders: np.ndarray, ghost_owner: np.ndarray
            ) -> dict[str, np.ndarray]:
        """A partition without layer state, as `bootstrap` takes it: ``graph`` holds the
        vertices it owns in its first ``owned`` slots and its ghosts after them, owned by
        ``ghost_owner``; ``holders`` marks per slot the partitions holding it."""
        ghost = np.zeros(len(graph.alive), bool)
        ghost[owned:graph.num_slots] = True
        return {**prefixed("graph/", graph.to_arrays()), "ghost": ghost, "holders": holders,
                "ghost_owner": ghost_owner}

    @classmethod
    def bootstrap(cls, layers: list[Layer], arrays: dict[str, np.ndarray],
                  device: torch.device, dtype: torch.dtype, recompute: bool, me: int,
                  partitions: int, progress: bool = False
                  ) -> Generator[list[np.ndarray], list[np.ndarray], Shard]:
        """Partition ``me``'s first state, computed where it lives: ``arrays`` is the shard
        without layer state (graph, ``ghost``, ``holders``, ``ghost_owner``, as `arrays`
        lays them out). A BSP program like `run`: after each layer but the last it yields
        the rows of its vertices other partitions hold as ghosts (as stored: z where the
        shard keeps it) and takes theirs, which the next layer reads; returns the shard
        (states kept unless ``recompute``)."""
        graph = DynamicGraph.from_arrays(under(arrays, "graph/"))
        ghost, holders, ghost_owner = arrays["ghost"], arrays["holders"], arrays["ghost_owner"]
        owned = graph.alive & ~ghost
        hs = [torch.from_numpy(graph.x[:graph.num_slots]).to(device, dtype)]
        states: list[Tensor | None] = []
        for out, state in layer_by_layer(layers, graph, str(device), progress=progress,
                                         dtype=dtype, keep_states=not recompute):
            if len(hs) < len(layers):
                layer = layers[len(hs) - 1]
                z = keeps_z(layer, state)
                table = state if z else out  # what ghosts hold of this layer
                incoming_rows = yield layer_outgoing(graph, holders, owned,
                                                     table.cpu().numpy(), me, partitions)
                layer_incoming(graph, incoming_rows, layer, table, out, z, device, dtype)
                del incoming_rows  # before the next layer's tables: GBs on a large graph
            hs.append(out)
            states.append(state)
        return cls(layers, graph, hs, states, device, dtype, ghost, holders, ghost_owner)

    def arrays(self, with_graph: bool = True) -> dict[str, np.ndarray]:
        """Everything the shard knows beside the model, as plain arrays (what a checkpoint
        holds: `Tables.arrays`)."""
        return self.tables.arrays(with_graph)

    @torch.inference_mode()
    def rows(self, slots: np.ndarray, layer: int) -> np.ndarray:
        """h^layer of ``slots`` (activated where the shard keeps the pre-activation), as
        host arrays in the engine's dtype. The features never cross to the device."""
        tb = self.tables
        if layer == 0:
            return tb.features_of(0, slots)[0].astype(numpy_dtype(tb.dtype), copy=False)
        work = self.rows_work(slots, layer)
        return download(work.finish(tb.uploaded(**work.arrays), None))[0]

    def rows_work(self, slots: np.ndarray, layer: int) -> Deferred:
        """`rows` for a caller in this process that uploads the arrays itself: at layer 0
        the features' rows (host, as stored), finished as they arrive; above, the rows'
        indices in the table holding them, finished on the tables' device."""
        tb = self.tables
        if layer == 0:
            return Deferred({"rows": tb.features_of(0, slots)[0]}, lambda up, _: up["rows"])
        index = tb.h_at(layer, slots).astype(np.int64, copy=False)
        return Deferred({"index": index}, lambda up, _: tb.h_rows(layer, up["index"]))

    def neighbors(self, ids: np.ndarray, out: bool, edges: bool) -> dict[str, np.ndarray]:
        """The in-edges (``out``: the out-edges) this partition keeps of vertices ``ids``:
        per id, ``count`` and (in-edges) the weighted in-degree ``in_weight``; with
        ``edges``, the other ends' ids ``nbr`` and the weights ``w``, id after id. An id
        it does not hold has none (a vertex's in-edges are all at its owner; its out-edges
        at the owner of each destination)."""
        g = self.graph
        slots = g.find(ids)
        held = slots >= 0
        count = np.zeros(len(ids), np.int64)
        count[held] = (g.out_degree if out else g.in_degree)[slots[held]]
        reply = {"count": count}
        if not out:
            reply["in_weight"] = np.where(held, g.in_weight[np.maximum(slots, 0)], 0.0)
        if edges:
            _, nbr, w = (g.out_edges if out else g.in_edges)(slots[held])
            reply.update(nbr=g.ext[nbr], w=w)
        return reply

    def high_in_degree(self, threshold: float) -> np.ndarray:
        """The ids of the vertices this partition owns with more in-edges than
        ``threshold`` (RIPPLE++'s high in-degree set, for `Directory.place`)."""
        g, n = self.graph, self.graph.num_slots
        return g.ext[np.flatnonzero(self.tables.owned[:n] & (g.in_degree[:n] > threshold))]

    @torch.inference_mode()
    def partials(self, hop: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                 num: int, dst_part: np.ndarray | None, slots: np.ndarray | None = None
                 ) -> np.ndarray:
        """A query's partial aggregates at layer ``hop`` (`partials_work`, with
        attention's destination parts ``dst_part`` as host rows), as a host array: its
        arrays go to the tables' device in one upload and the states come back in one
        download."""
        work = self.partials_work(hop, src, dst, w, num, slots, dst_part)
        return download(work.finish(self.tables.uploaded(**work.arrays), None))[0]

    def partials_work(self, hop: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                      num: int, slots: np.ndarray | None = None,
                      dst_part: np.ndarray | None = None) -> Deferred:
        """A query's partial aggregates at layer ``hop`` over edges from vertices this
        shard owns (external ids ``src``, or their ``slots`` in this shard's graph where
        the caller has them) to destinations ``dst`` in ``0..num`` (message factors
        ``w``), from the stored rows of h^(hop-1): `Layer.partial`, as work for the
        tables' device. Its host arrays: the edges (``src``, rows of the table read;
        ``dst``; ``w``), attention's destination parts ``dst_part`` where given here,
        and the table's source: the features ``x`` where they are read in place, or where
        the shard keeps no t and no table to read, the rows it transforms (their slots
        ``rows``, at the first layer with their ``features``). `Deferred.finish` takes
        the destination parts where they were not given here."""
        tb, layer = self.tables, self.layers[hop - 1]
        slots = self.graph.slots(src) if slots is None else slots
        arrays = {"dst": dst.astype(np.int64), "w": w.astype(np.float64, copy=False)}
        if dst_part is not None:
            arrays["dst_part"] = dst_part
        table, raw = tb.t[hop - 1], False
        if table is None:
            table, raw = (tb.h_table(hop - 1) if hop > 1 else None), True
        in_place = raw and hop == 1 and tb.features_in_place()
        if raw and ((table is None and not in_place)
                    or (layer.transforms and not layer.aggr.linear)):
            rows, slots = np.unique(slots, return_inverse=True)  # transform these rows
            arrays["rows"] = rows.astype(np.int64, copy=False)
            if features := tb.features_of(hop - 1, rows):
                arrays["features"] = features[0]
            raw = in_place = False
        elif in_place:
            arrays["x"] = self.graph.x
        arrays["src"] = slots.astype(np.int64, copy=False)

        def finish(up: dict[str, Tensor], dst_part: Tensor | None) -> Tensor:
            t = table
            if "rows" in up:
                t = layer.transform(tb.h_rows(hop - 1, up["rows"], up.get("features")))
            elif in_place:
                t = up["x"]
            part = up.get("dst_part") if dst_part is None else dst_part
            if part is not None:
                part = part.to(t.device, t.dtype)
            return layer.partial(t, up["src"], up["dst"], up["w"], num, part, raw)
        return Deferred(arrays, finish)

    def summary(self) -> dict:
        """Vertices owned, halo (ghost) vertices, and for the last batch the bytes sent and
        received per exchange, the compute seconds per step between them and the bytes of
        ghosts' features (and ids) its routed batch brought (instead of an exchange)."""
        alive, ghost = self.graph.alive[:self.graph.num_slots], self.tables.ghost
        halo = 0 if ghost is None else int((alive & ghost[:len(alive)]).sum())
        return {"vertices": int(alive.sum()) - halo, "halo": halo,
                "sent_bytes": list(self.sent), "received_bytes": list(self.received),
                "busy_s": list(self.busy), "ghost_feature_bytes": self.ghost_feature_bytes}

    # ---------------------------------------------------------------- one batch
    def run(self, diff: GraphDiff, me: int = 0, partitions: int = 1,
            routed: Routed | None = None
            ) -> Generator[list[np.ndarray], list[np.ndarray], Callable[[], ApplyResult]]:
        """The batch's BSP program on this shard (partition ``me`` of ``partitions``): a
        generator that, before each superstep, yields the packed buffers this shard sends
        every partition and is sent back those every partition sent it (`Exchange`); it
        returns what gives the shard's `ApplyResult` (a planned batch's copy back started,
        `Planned.finish`: what waits for it). One partition exchanges nothing, and the
        first superstep needs no exchange but for degree-normalised layers: the routed
        batch brought the ghosts' features. A share ``routed`` that changes nothing here begins
        the batch only when ghost rows come (the supersteps before had nothing to do: they
        are taken then); until they do, each superstep sends nothing and does nothing.
        Records the bytes sent and received per exchange and the compute time between
        them."""
        self.sent, self.received, self.busy = [], [], []
        start = time.perf_counter()
        idle = routed is not None and partitions > 1 and _changes_nothing(routed)
        if idle:
            self.ghost_feature_bytes = 0
        else:
            self._begin(diff, routed)
        try:
            for hop in range(1, len(self.layers) + 1):
                if partitions > 1:
                    out = (_sends_nothing(partitions) if idle
                           else outgoing(self.tables, self._batch, hop - 1, partitions, me))
                    self.busy.append(time.perf_counter() - start)
                    received = yield out
                    start = time.perf_counter()
                    self.sent.append(sum(map(len, out)))
                    self.received.append(sum(sizes(received)))  # (none waited for)
                    if idle and self.received[-1]:  # rows came: the batch begins here
                        idle = False
                        self._begin(diff, routed)
                        for before in range(1, hop):
                            self._step(before)
                    if not idle:
                        incoming(self.tables, self._batch, hop - 1, received)
                        start += waited(received)  # (busy: compute, not waiting)
                if not idle:
                    self._step(hop)
        except BaseException:
            self.abort()
            raise
        result = _ready(self._nothing_done(diff)) if idle else self._finish()
        self.busy.append(time.perf_counter() - start)
        return result

    def _nothing_done(self, diff: GraphDiff) -> ApplyResult:
        """What `_begin`, the supersteps and `_finish` give a batch that changed nothing
        here (``diff`` empty but for its rejections) and brought no ghost rows: no row
        rewritten, no label changed, every count 0."""
        nothing = [0] * len(self.layers)
        rewritten = [(_NO_SLOTS, self.graph.x[:0])]
        rewritten += [(_NO_SLOTS, self.tables.no_rows(layer.out_dim)[1])
                      for layer in self.layers]
        return ApplyResult(ChangedLabels.empty(), diff.rejected, recomputed=nothing,
                           pulled=list(nothing), remote_reads=list(nothing),
                           combined_messages=list(nothing), pulled_columns=list(nothing),
                           rewritten=rewritten)

    def run_routed(self, routed: Routed, me: int, partitions: int
                   ) -> Generator[list[np.ndarray], list[np.ndarray], ApplyResult]:
        """`run` for this shard's part of a batch as the coordinator split it (applying it to
        the shard's graph is part of the first step's compute)."""
        start = time.perf_counter()
        diff = self.graph.apply(routed.batch, skip_invalid=True, ghosts=True)
        applied = time.perf_counter() - start
        result = (yield from self.run(diff, me, partitions, routed))()
        start = time.perf_counter()
        self._close_routed(diff, result)
        self.busy[-1] += time.perf_counter() - start
        self.busy[0] += applied
        return result

    def begin_together(self, routed: Routed) -> tuple[GraphDiff, Planned]:
        """This shard's share ``routed`` of a batch that the shards in this process run
        planned together (`planned_shards`): applied to the graph and begun. Returns what
        it made on the graph and its plan, whose supersteps the caller plans, uploads and
        runs; `finish_together` closes it. No exchange: nothing sent, no bytes counted."""
        start = time.perf_counter()
        self.sent, self.received, self.ghost_feature_bytes = [], [], 0
        diff = self.graph.apply(routed.batch, skip_invalid=True, ghosts=True)
        self._begin(diff, routed, together=True)
        self.busy = [time.perf_counter() - start]
        return diff, self._planned

    def finish_together(self, diff: GraphDiff, host: list[np.ndarray]) -> ApplyResult:
        """Close the batch `begin_together` began (``diff``), with what it keeps copied
        back (``host``: `Planned.kept`)."""
        start = time.perf_counter()
        result = self._finish(host)()
        self._close_routed(diff, result)
        self.busy.append(time.perf_counter() - start)
        return result

    def abort(self) -> None:
        """Drop the open batch after a failure inside it: it hands no rows on."""
        self._batch = self.tables.recent = self._planned = None

    def _close_routed(self, diff: GraphDiff, result: ApplyResult) -> None:
        """A routed batch's part after its supersteps: the ghosts it let go of
        (`_release_ghosts`) and the edges it added, into ``result``."""
        result.released = self._release_ghosts(diff)
        e = diff.edges
        if len(e.src):
            result.edges_added = int(np.count_nonzero(~np.isnan(e.after))
                                     - np.count_nonzero(~np.isnan(e.before)))

    def _release_ghosts(self, diff: GraphDiff) -> tuple[np.ndarray, np.ndarray]:
        """Ghosts no edge here comes from any more (a deleted edge's source, or a ghost an
        edge added and the batch took away again), deleted from the graph: their ids and
        owners (told to the owners with the next batch)."""
        tb, g = self.tables, self.graph
        e = diff.edges
        if not (len(e.src) or len(diff.added)):  # (no edge deleted, no vertex added)
            return _NO_SLOTS, _NO_SLOTS
        idle = let_go(e.src, e.after, diff.added, g.alive, tb.ghost, g.out.deg, tb.sets.mark)
        if not len(idle):
            return idle, idle
        ids, owners = g.ext[idle].copy(), tb.ghost_owner[idle].astype(np.int64)
        gone = g.apply(UpdateBatch.unchecked(
            np.full(len(ids), DELETE_VERTEX, np.int8), ids, np.zeros_like(ids),
            np.zeros(len(ids), np.float32), np.full(len(ids), NO_X, np.int64),
            np.zeros((0, g.num_features), np.float32))).removed.astype(np.int64)
        none = gone[:0]
        begin_halo(g.id_table, gone, none, none, none, none, none, none, none, tb.ghost,
                   tb.ghost_owner, tb.holders, tb.owned, g.in_weight)
        return ids, owners

    def _begin(self, diff: GraphDiff, routed: Routed | None = None,
               together: bool = False) -> None:
        """Start a batch whose updates made ``diff`` on the graph; ``routed``: the coordinator's
        split of it for this partition, with the ghosts it added and who now holds what
        (`begin_routed`); ``together``: the batch runs planned with the other shards in
        this process (`planned_shards`), its plan made but not its supersteps'."""
        tb = self.tables
        tb.fit_capacity()
        added = diff.added.astype(np.int64)
        removed = diff.removed.astype(np.int64)
        subscribed = subscribers = removed[:0]
        if routed is not None:
            subscribed, subscribers, self.ghost_feature_bytes = begin_routed(
                tb, diff, routed, removed, added)
        tb.place(removed, added)
        planned = together or plans(tb)  # (its plan starts reused rows empty on the device)
        if len(added) and not planned:  # reused slots and rows: start empty
            for hop, layer in enumerate(self.layers, start=1):
                state, z = tb.state[hop - 1], tb.z[hop - 1]
                if state is not None:
                    tables = [t for t in (state, tb.drift[hop - 1], tb.ties[hop - 1])
                              if t is not None]
                    fill_rows_(tables, tb.added_rows(hop, added),
                               [layer.empty_preactivation() if z else None]
                               + [None] * (len(tables) - 1))
        changed = Changed(np.concatenate([diff.changed, diff.added]).astype(np.int64),
                          diff.changed.astype(np.int64),
                          [] if planned else [tb.as_rows(diff.changed_x_before)])
        features = np.sort(changed.slots)  # rewritten at layer 0: the features
        features = features[tb.owned[features]]
        result = ApplyResult(ChangedLabels.empty(), diff.rejected,
                             rewritten=[(features, self.graph.x[features])])
        removed_rows = (torch.empty(0, device=tb.device) if planned  # (its plan's own)
                        else tb.as_rows(diff.removed_x))
        self._batch = Batch(BatchEdges.of(self.graph, diff, tb.sets), added, removed,
                            removed_rows, changed, result, subscribed, subscribers)
        self._planned = None
        if planned:
            self._planned = Planned(tb, self._batch, diff.changed_x_before, diff.removed_x)
            if not together:  # (else every shard's is planned and uploaded at once)
                self._planned.plan_all()

    def _step(self, hop: int) -> None:
        """Superstep ``hop`` (1..L) of the open batch."""
        b, tb = self._batch, self.tables
        if self._planned is not None:
            self._planned.step(hop)
            return
        step = superstep(tb, b, hop)
        if not b.result.non_finite and not step.finite:
            b.result.non_finite = hop  # the other shards go on to the barrier: report at end
        tb.recent = step  # (the removed vertices' rows come from it)
        if hop < len(self.layers):
            b.changed = step.changed()
            b.removed_rows = (tb.h_rows(hop, tb.index(b.removed)) if len(b.removed)
                              else tb.no_rows(self.layers[hop - 1].out_dim)[0])

    def _finish(self, host: list[np.ndarray] | None = None) -> Callable[[], ApplyResult]:
        """Close the batch: its label changes and counts; ``host``: where it ran planned
        with other shards, what it keeps (`Planned.kept`), copied back with theirs. Returns
        what gives the result: where the batch ran planned alone, what waits for its copy
        back (`Planned.finish`)."""
        tb = self.tables
        b, last, self._batch, tb.recent = self._batch, tb.recent, None, None
        if self._planned is not None:
            planned, self._planned = self._planned, None
            self._count_in_weights(b)
            return planned.finish() if host is None else _ready(planned.finished(host))
        result, n = b.result, len(last.region)
        hops = result.rewritten[1:]  # the supersteps' rows, still where they were computed
        rows = [rows for _, rows in hops]
        on_cpu = tb.device.type == "cpu"
        labels = [] if on_cpu or not n else [last.after[:n].argmax(-1)]
        host = download(*rows, *labels)  # one copy back (the CPU's: the tensors' memory)
        result.rewritten[1:] = [(slots, r) for (slots, _), r in zip(hops, host[:len(rows)],
                                                                   strict=True)]
        if n:  # (else the batch changed no label here)
            new = argmax_rows(last.after[:n]) if on_cpu else host[-1]
            at, old = relabel_(tb.labels, tb.own_rows(last.region), new, last.fresh)
            result.changed_labels = ChangedLabels(self.graph.ext[last.region[at]], old, new[at])
        self._count_in_weights(b)
        return _ready(result)

    def _count_in_weights(self, b: Batch) -> None:
        """The in-degrees the states were built with, brought up to the batch ``b``."""
        for touched in (b.edges.degree_changed, b.added):
            if len(touched):
                self.tables.in_weight[touched] = self.graph.in_weight[touched]


def _ready(result: ApplyResult) -> Callable[[], ApplyResult]:
    """What gives ``result``, there already."""
    return lambda: result


def _changes_nothing(routed: Routed) -> bool:
    """Whether a partition's share of a batch has no update, no ghost and no change of who
    holds what."""
    return not (len(routed.batch) or len(routed.ghosts) or len(routed.subscribed)
                or len(routed.unsubscribed))


@functools.cache
def _sends_nothing(partitions: int) -> list[np.ndarray]:
    """An empty buffer for each partition (`outgoing` with nothing moved; read only)."""
    return [np.zeros(0, np.uint8)] * partitions


_NO_SLOTS = np.zeros(0, np.int64)  # no vertex (read only)
