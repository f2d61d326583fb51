"""`Shard`: one partition of the exact incremental engine (RIPPLE++). Keeps every layer's
embedding of the vertices it owns and each layer's aggregation state; a batch of updates
(already applied to its graph) is pushed through L supersteps, each touching only vertices
whose inputs changed.

Superstep l, for sources whose h^{l-1} changed (and, for degree-normalised layers, whose
in-degree changed): every message that stops arriving (old value, old edge) and every
message that starts arriving (new value, new edge) is sent, combined per destination and
folded into the stored states by the aggregation (``apply_delta``); destinations it cannot
fix that way are pulled: their state is recomputed from all in-neighbours, whole
(attention at a vertex whose own input changed or whose denominator cancelled) or in the
columns that need it (max/min where the maximum may have left). Then h^l is recomputed
for the destinations and for vertices whose own h^{l-1} changed. ``recompute=True`` is
the RC baseline: the same affected region, every destination pulled, no states kept.

A sum or mean layer with a root term keeps its pre-activation z alone
(`Layer.keeps_preactivation`): no embeddings, no root terms; the root terms of vertices
whose input changed fold into their own z as messages (a mean's z is first rescaled about
its root term and bias where the in-degree changed), and h = `Layer.activate` of z
wherever a row is read.

Partitions: a shard's graph holds the vertices it owns, every edge into them, and *ghosts*:
copies of remote in-neighbours (their features, in-degree and every layer's row as the
owner stores it, h or z, never computed here). Between supersteps (`_outgoing` /
`_incoming`) each owner sends the rows of its vertices that changed to the shards holding
them as ghosts, so messages and pulls read every in-neighbour locally. Without ghosts (one
partition) nothing is sent.

Owns per-layer state and propagation; must not import kafka or mpi4py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor

from streamgnn.allocator import huge_pages, lengthened
from streamgnn.errors import InvalidUpdateError
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.models.aggr import Pull, RowMessages
from streamgnn.models.inference import aggregate, chunk_bounds, layer_by_layer
from streamgnn.models.layers import Layer
from streamgnn.models.rowops import (
    activated_rows,
    argmax_rows,
    compare_rows,
    difference_table,
    fill_rows_,
    in_row_sums,
    merge_rows,
    ones,
    store_rows_,
    take_rows,
)
from streamgnn.npz import prefixed, under
from streamgnn.workers.deltas import edge_changes, linear_delta_messages, message_sources
from streamgnn.workers.exchange import Ghosts, pack, unpack
from streamgnn.workers.halo import begin_halo, rows_for, take_ghost_rows
from streamgnn.workers.labels import ChangedLabels, relabel_
from streamgnn.workers.linear_step import linear_step_inputs
from streamgnn.workers.placement import Routed, held_by
from streamgnn.workers.region import superstep_region
from streamgnn.workers.slotsets import SlotSets


@dataclass
class ApplyResult:
    """What a batch changed: ``changed_labels`` maps external id -> (old, new) predicted
    label (old is None for a vertex the batch added; `ChangedLabels`, held as columns);
    ``recomputed``/``pulled`` count the vertices per layer whose embedding was recomputed
    / whose state was re-aggregated (whole or in some columns; ``pulled_columns``: the
    (vertex, column) pairs of the latter);
    with partitions, ``remote_reads`` counts per layer the ghost rows the pulls read (what
    a design fetching remote rows on demand would request) and ``combined_messages`` the
    messages from ghosts, combined per destination and source partition (what a design
    combining messages at the sender would send);
    ``rejected`` holds the errors of updates a ``skip_invalid`` batch left out;
    ``rewritten`` lists per layer 1..L the rows of owned vertices the batch wrote, as
    (the shard's slots ascending, rows) (a shard's own report, empty from MPI ranks:
    `Engine.rewritten` merges them), and ``removed`` the ids the batch deleted (engine
    only)."""

    changed_labels: ChangedLabels
    rejected: list[InvalidUpdateError] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    pulled: list[int] = field(default_factory=list)
    remote_reads: list[int] = field(default_factory=list)
    combined_messages: list[int] = field(default_factory=list)
    non_finite: int = 0  # the first layer the batch drove to NaN or inf (0: none)
    pulled_columns: list[int] = field(default_factory=list)
    rewritten: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    removed: np.ndarray | None = None


@dataclass
class _Changed:
    """Vertices whose h^{l-1} changed in this batch, and the old rows of those that had
    one (vertices the batch added have none), in blocks (copied together once, where the
    superstep transforms them)."""

    slots: np.ndarray
    old_slots: np.ndarray
    old_rows: list[Tensor]


@dataclass
class _Step:
    """One superstep's outcome: the recomputed ``region`` and its new rows ``after``;
    ``fresh`` marks region vertices the batch added, ``moved`` those whose row changed
    (fresh ones included) and ``old_rows`` the rows replaced of those moved and not fresh
    (none at the last layer, whose old rows only mattered for labels: the shard keeps
    those); ``finite``: every new row is. Where the shard keeps the pre-activation,
    ``activated`` are the slots whose rows of h the superstep activated, the region's
    first (both runs ascending), and ``after`` has a row for each (the next superstep
    reads them)."""

    region: np.ndarray
    after: Tensor
    fresh: np.ndarray
    moved: np.ndarray
    old_rows: Tensor
    finite: bool = True
    activated: np.ndarray | None = None

    def changed(self) -> _Changed:
        """The vertices whose embedding really changed: the next superstep's sources."""
        return _Changed(self.region[self.moved], self.region[self.moved & ~self.fresh],
                        [self.old_rows])


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
    recounted: np.ndarray        # ... those whose number of in-edges changed
    count_before: np.ndarray     # ... and that number before the batch
    empty_before: np.ndarray     # live destinations that had no in-edge before the batch


@dataclass
class _Sources:
    """A superstep's message sources ``slots`` and a table ``t`` of their rows of t
    (`Shard._message_sources`): source i's after the batch is row ``new[i]``, before it row
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
class _RowMessages:
    """One superstep's messages for aggregations that are not linear, left as rows of the
    sources' ``t`` times a factor, to destinations in ``region`` (whose
    `Layer.destination_part` is ``part`` where messages depend on it), for the fold to
    read."""

    t: Tensor
    region: np.ndarray
    new: RowMessages
    old: RowMessages
    part: Tensor | None = None


@dataclass
class _Batch:
    """What one batch carries from superstep to superstep."""

    edges: _BatchEdges
    added: np.ndarray
    removed: np.ndarray
    removed_rows: Tensor
    changed: _Changed
    result: ApplyResult
    subscribed: np.ndarray   # owned slots another partition now holds as ghosts
    subscribers: np.ndarray  # ... and that partition
    step: _Step | None = None
    hop: int = 0  # the superstep ``step`` is of


class Shard:
    """The vertices one partition owns (all of them when there is one), their per-layer
    state and the supersteps over them."""

    def __init__(self, layers: list[Layer], graph: DynamicGraph, hs: list[Tensor],
                 states: list[Tensor | None], device: torch.device, dtype: torch.dtype,
                 ghost: np.ndarray | None = None, holders: np.ndarray | None = None,
                 ghost_owner: np.ndarray | None = None) -> None:
        """``hs``: [h0, ..., hL] of every slot (ghosts' rows included); ``states`` per
        layer, or None (RC) (the shard takes both lists over); ``ghost``: which slots
        are ghosts (None: there are none); ``holders``: per slot, a bit per partition
        holding it as a ghost;
        ``ghost_owner``: per ghost slot, the partition owning it."""
        self.layers, self.graph, self.device, self.dtype = layers, graph, device, dtype
        self.sets = SlotSets(len(graph.alive))
        self.state = states
        self.drift = [_fresh_drift(layer, s) for layer, s in zip(layers, states, strict=True)]
        self._labels = hs[-1].argmax(dim=-1).cpu().numpy()  # predicted class per slot
        self._z = [_keeps_z(layer, s) for layer, s in zip(layers, states, strict=True)]
        with torch.inference_mode():
            self.root = [layer.root(h) if layer.caches_root and s is not None else None
                         for layer, h, s in zip(layers, hs, states, strict=False)]
            self.t = [layer.transform(h) if layer.caches_t and s is not None else None
                      for layer, h, s in zip(layers, hs, states, strict=False)]
        # the shard takes the lists over: moved onto huge pages in place, each original
        # table goes as soon as it is copied (a products-like worker's are GBs)
        self.h: list[Tensor | None] = hs
        hs[0] = None  # h[0] lives in the graph
        for k, z in enumerate(self._z, start=1):
            if z:  # its rows are the pre-activation's, activated
                hs[k] = None
        self._in_weight = graph.in_weight.copy()  # in-degrees the states were built with
        self.ghost = ghost
        self.holders = holders
        self.ghost_owner = ghost_owner
        self._owned: np.ndarray | None = None  # alive & ~ghost, kept up to date
        self._batch: _Batch | None = None
        self.sent: list[int] = []      # the last batch's bytes per exchange ...
        self.received: list[int] = []
        self.busy: list[float] = []    # ... and its compute seconds between them
        self.ghost_feature_bytes = 0   # the last routed batch's features of ghosts (+ ids)
        self.ties: list[Tensor | None] = [None] * len(layers)
        self._keep_ties()
        self._tables_on_huge_pages()

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
        n = graph.num_slots
        hs = [torch.from_numpy(graph.x[:n]).to(device, dtype)]
        states: list[Tensor | None] = []
        for out, state in layer_by_layer(layers, graph, str(device), progress=progress,
                                         dtype=dtype, keep_states=not recompute):
            if len(hs) < len(layers):
                layer = layers[len(hs) - 1]
                keeps_z = _keeps_z(layer, state)
                table = state if keeps_z else out  # what ghosts hold of this layer
                rows = table.cpu().numpy()
                sent = []
                for q in range(partitions):
                    slots = np.flatnonzero(owned[:n] & held_by(holders[:n], q))
                    sent.append(pack(Ghosts(graph.ext[slots], rows[slots])) if q != me
                                else pack(None))
                incoming = yield sent
                del rows, sent  # before the next layer's tables: GBs on a large graph
                for g in map(unpack, incoming):
                    if g is not None:
                        index = torch.from_numpy(graph.slots(g.ids).astype(np.int64))
                        with torch.inference_mode():
                            got = torch.from_numpy(g.rows).to(device, dtype)
                            table[index.to(device)] = got
                            for a in range(0, len(index) if keeps_z else 0, 1 << 16):
                                rows = slice(a, a + (1 << 16))  # (a GB on a large graph)
                                out[index[rows].to(device)] = layer.activate(got[rows])
                del incoming
            hs.append(out)
            states.append(state)
        return cls(layers, graph, hs, states, device, dtype, ghost, holders, ghost_owner)

    def _tables_on_huge_pages(self) -> None:
        """The per-vertex tables, read a row at a time at random, moved onto 2 MB pages
        (CPU; `huge_pages`)."""
        if self.device.type != "cpu":
            return
        for name in ("h", "state", "ties", "root", "t"):
            tables = getattr(self, name)
            for k, rows in enumerate(tables):  # in place: each original goes once copied
                if rows is not None:  # (room to grow as much again: `_grown`)
                    tables[k] = torch.from_numpy(huge_pages(rows.contiguous().numpy(),
                                                            room=len(rows)))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def _sends_in_degrees(self) -> bool:
        """Whether a layer reads its sources' in-degrees (GCN's normalisation): then the
        ghosts' are exchanged before the first superstep."""
        return any(layer.degree_normalised for layer in self.layers)

    @property
    def owned(self) -> np.ndarray:
        """Per slot: a live vertex this shard owns."""
        if self.ghost is None:
            return self.graph.alive
        if self._owned is None or len(self._owned) != len(self.graph.alive):
            self._owned = self.graph.alive & ~self.ghost[:len(self.graph.alive)]
        return self._owned

    @torch.inference_mode()
    def rows(self, slots: np.ndarray, layer: int) -> np.ndarray:
        """h^layer of ``slots`` (activated where the shard keeps the pre-activation)."""
        return self._rows(layer, self._index(slots)).cpu().numpy()

    def _stored(self, layer: int) -> Tensor:
        """The table holding layer ``layer`` (1..L) per slot: h, or the pre-activation z
        where the shard keeps that instead (what ghosts are sent)."""
        return self.state[layer - 1] if self._z[layer - 1] else self.h[layer]

    @torch.inference_mode()
    def partials(self, hop: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                 num: int, dst_part: np.ndarray | None, slots: np.ndarray | None = None
                 ) -> np.ndarray:
        """A query's partial aggregates at layer ``hop`` over edges from vertices this
        shard owns (external ids ``src``, or their ``slots`` in this shard's graph where
        the caller has them) to destinations ``dst`` in ``0..num`` (message factors ``w``;
        attention: the destinations' parts ``dst_part``), from the stored rows of
        h^(hop-1): `Layer.partial`."""
        layer = self.layers[hop - 1]
        slots = (self.graph.slots(src) if slots is None else slots).astype(np.int64)
        table, raw = self.t[hop - 1], False
        if table is None:
            table, raw = self._h_table(hop - 1), True
        if table is None or (raw and layer.transforms and not layer.aggr.linear):
            rows, slots = np.unique(slots, return_inverse=True)  # transform these rows
            table, raw = self._t(hop, layer, self._index(rows)), False
        part = None if dst_part is None else self._tensor(dst_part).to(table.dtype)
        state = layer.partial(table, slots, dst.astype(np.int64), w.astype(np.float64), num,
                              part, raw)
        return state.cpu().numpy()

    def arrays(self, with_graph: bool = True) -> dict[str, np.ndarray]:
        """Everything the shard knows beside the model, as plain arrays (what a checkpoint
        holds): the graph as laid out (``graph/...``, so a restored shard repeats this one
        bit for bit; left out without ``with_graph``), and per layer k its embeddings
        ``h/k``, aggregation states ``state/k`` with sums' rounding bounds ``drift/k`` and
        max/min's ``ties/k``, kept root terms ``root/k`` and transforms ``t/k`` where it
        keeps them."""
        out = prefixed("graph/", self.graph.to_arrays()) if with_graph else {}
        for name in ("h", "state", "drift", "ties", "root", "t"):
            for k, rows in enumerate(getattr(self, name)):
                if rows is not None:
                    out[f"{name}/{k}"] = rows.cpu().numpy()
        out["in_weight"] = self._in_weight
        for name in ("ghost", "holders", "ghost_owner"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_arrays(cls, layers: list[Layer], arrays: dict[str, np.ndarray],
                    device: torch.device, dtype: torch.dtype,
                    graph: DynamicGraph | None = None) -> Shard:
        """The shard `arrays` came from; on ``graph`` if given (arrays without one). It
        adopts the arrays, which nothing else may hold."""
        shard = cls.__new__(cls)
        shard.layers, shard.device, shard.dtype = layers, device, dtype
        shard.graph = (graph if graph is not None
                       else DynamicGraph.from_arrays(under(arrays, "graph/")))
        shard.sets = SlotSets(len(shard.graph.alive))
        for name in ("h", "state", "drift", "ties", "root", "t"):
            setattr(shard, name, [
                None if (a := arrays.get(f"{name}/{k}")) is None
                else torch.from_numpy(a).to(device)
                for k in range(len(layers) + (name == "h"))])
        shard._in_weight = arrays["in_weight"]
        shard._z = [_keeps_z(layer, s) for layer, s in zip(layers, shard.state, strict=True)]
        if stale := [k for k, z in enumerate(shard._z, start=1) if z and f"h/{k}" in arrays]:
            raise ValueError(f"these arrays hold layer {stale[0]}'s embeddings beside its "
                             "state: written before sum and mean layers kept their "
                             "pre-activation alone; bootstrap the engine again")
        out = shard._stored(len(layers))
        out = layers[-1].activate(out) if shard._z[-1] else out
        shard._labels = out.argmax(dim=-1).cpu().numpy()
        shard.ghost, shard.holders, shard.ghost_owner = (
            arrays.get(name) for name in ("ghost", "holders", "ghost_owner"))
        shard._batch = None
        shard._owned = None
        shard.sent, shard.received, shard.busy = [], [], []
        shard._keep_ties()  # arrays written before max/min kept ties have none
        shard._tables_on_huge_pages()
        return shard

    # ---------------------------------------------------------------- one batch
    def _begin(self, diff: GraphDiff, routed: Routed | None = None) -> None:
        """Start a batch whose updates made ``diff`` on the graph; ``routed``: the router's
        split of it for this partition, with the ghosts it added and who now holds what
        (`begin_halo`)."""
        self.sets.fit(len(self.graph.alive))
        self._fit_capacity()
        added = diff.added.astype(np.int64)
        removed = diff.removed.astype(np.int64)
        subscribed = (removed[:0], removed[:0])
        if routed is not None:
            assert self.ghost is not None, "a routed batch goes to a partition's shard"
            r = routed
            unknown, slots = begin_halo(
                self.graph.id_table, removed, added, r.ghosts, r.ghost_owners, r.subscribed,
                r.subscribers, r.unsubscribed, r.unsubscribers, self.ghost, self.ghost_owner,
                self.holders, self.owned, self.graph.in_weight)
            if unknown >= 0:
                named = np.concatenate([r.ghosts, r.subscribed, r.unsubscribed])[unknown]
                raise RuntimeError(f"the router named vertex {named}, which this partition "
                                   "does not hold")
            subscribed = (slots, r.subscribers)
            ghost_rows = len(r.ghosts) + int(np.count_nonzero(self.ghost[diff.changed]))
            self.ghost_feature_bytes = ghost_rows * (8 + self.graph.x.itemsize
                                                     * self.graph.num_features)
        if len(added):  # reused slots: start empty
            for layer, rows, z in zip(self.layers, self.state, self._z, strict=True):
                if rows is not None:
                    fill_rows_(rows, added, layer.empty_preactivation() if z else None)
            for rows in (*self.drift, *self.ties):
                if rows is not None:
                    fill_rows_(rows, added, None)
        changed = _Changed(np.concatenate([diff.changed, diff.added]).astype(np.int64),
                           diff.changed.astype(np.int64),
                           [self._ours(self._tensor(diff.changed_x_before))])
        self._batch = _Batch(self._batch_edges(diff), added, removed,
                             self._ours(self._tensor(diff.removed_x)), changed,
                             ApplyResult(ChangedLabels.empty(), diff.rejected),
                             *subscribed)

    def _outgoing(self, hop: int, partitions: int, me: int) -> list[np.ndarray]:
        """Per partition, packed (`exchange.packed`; empty for none), the rows of layer
        ``hop`` as stored (z where the shard keeps it) it holds as ghosts and whose h
        changed in this batch (or that it began to hold). A ghost's z may lag its owner's
        where z moved and h did not: its activation is the same h, bit for bit. Features
        come with the routed batch: at layer 0 (degree-normalised layers only,
        `_sends_in_degrees`) the rows whose in-degree changed go, with it."""
        b = self._batch
        none = np.zeros(0, np.uint8)
        if self.holders is None:
            return [none] * partitions
        if hop == 0:
            moved, table, in_weight = (b.edges.degree_changed, torch.from_numpy(self.graph.x),
                                       self.graph.in_weight)
        else:
            moved, table, in_weight = b.changed.slots, self._stored(hop), None
        return [none if q == me else rows_for(
            q, moved, self.owned, self.holders, b.subscribed, b.subscribers, table,
            self.graph.ext, in_weight, self.sets.mark) for q in range(partitions)]

    def _incoming(self, hop: int, received: Sequence[Ghosts]) -> None:
        """Take the ghost rows of layer ``hop`` other shards sent (as `_outgoing` sends
        them): ghosts whose row differs join the next superstep's sources (with their old
        rows of h), new ghosts join as fresh."""
        received = [g for g in received if g is not None and len(g.ids)]
        if not received:
            return
        b = self._batch
        ids, rows = ((received[0].ids, received[0].rows) if len(received) == 1 else  # as sent
                     (np.concatenate([g.ids for g in received]),
                      np.concatenate([g.rows for g in received])))
        table = torch.from_numpy(self.graph.x) if hop == 0 else self._stored(hop)
        activation = (self.layers[hop - 1].elementwise if hop > 0 and self._z[hop - 1]
                      else "identity")  # h of a stored row
        c = b.changed
        unknown, slots, sources, old_slots, old = take_ghost_rows(
            self.graph.id_table, ids, rows, table, activation == "relu", b.added, c.slots,
            c.old_slots, self.sets.mark, self.sets.scratch)
        if unknown >= 0:
            raise RuntimeError(f"ghost rows sent for vertex {ids[unknown]}, which this "
                               "partition does not hold")
        if activation is None:
            old = self.layers[hop - 1].activate(old)
        b.changed = _Changed(sources, old_slots, [*c.old_rows, self._ours(old)])
        weights = [g.in_weight for g in received]
        if weights[0] is not None:  # (degree-normalised layers, before the first)
            w = np.concatenate(weights)
            degree = slots[self.graph.in_weight[slots] != w]
            self.graph.in_weight[slots] = w
            b.edges.degree_changed = self.sets.union(b.edges.degree_changed, degree)

    def run(self, diff: GraphDiff, me: int = 0, partitions: int = 1,
            routed: Routed | None = None
            ) -> Generator[list[np.ndarray], list[np.ndarray], ApplyResult]:
        """The batch's BSP program on this shard (partition ``me`` of ``partitions``): a
        generator that, before each superstep, yields the packed buffers this shard sends
        every partition and is sent back those every partition sent it (`Exchange`); it
        returns the shard's `ApplyResult`. One partition exchanges nothing, and the first
        superstep needs no exchange but for degree-normalised layers: the routed batch
        brought the ghosts' features. Records the bytes sent and received per exchange
        and the compute time between them."""
        self.sent, self.received, self.busy = [], [], []
        start = time.perf_counter()
        self._begin(diff, routed)
        try:
            for hop in range(1, self.num_layers + 1):
                if partitions > 1 and (hop > 1 or self._sends_in_degrees):
                    out = self._outgoing(hop - 1, partitions, me)
                    self.busy.append(time.perf_counter() - start)
                    received = yield out
                    start = time.perf_counter()
                    self.sent.append(sum(len(b) for b in out))
                    self.received.append(sum(len(b) for b in received))
                    self._incoming(hop - 1, [unpack(b) for b in received])
                self._step(hop)
        except BaseException:
            self._batch = None  # an aborted batch hands no rows on (`_activated`)
            raise
        result = self._finish()
        self.busy.append(time.perf_counter() - start)
        return result

    def run_routed(self, routed: Routed, me: int, partitions: int
                   ) -> Generator[list[np.ndarray], list[np.ndarray], ApplyResult]:
        """`run` for this shard's part of a batch as the router split it (applying it to
        the shard's graph is part of the first step's compute)."""
        start = time.perf_counter()
        diff = self.graph.apply(routed.batch)  # valid: the router's whole graph accepted it
        applied = time.perf_counter() - start
        result = yield from self.run(diff, me, partitions, routed)
        self.busy[0] += applied
        return result

    def summary(self) -> dict:
        """Vertices owned, halo (ghost) vertices, and for the last batch the bytes sent and
        received per exchange, the compute seconds per step between them and the bytes of
        ghosts' features (and ids) its routed batch brought (instead of an exchange)."""
        alive = self.graph.alive[:self.graph.num_slots]
        halo = 0 if self.ghost is None else int((alive & self.ghost[:len(alive)]).sum())
        return {"vertices": int(alive.sum()) - halo, "halo": halo,
                "sent_bytes": list(self.sent), "received_bytes": list(self.received),
                "busy_s": list(self.busy), "ghost_feature_bytes": self.ghost_feature_bytes}

    def _step(self, hop: int) -> None:
        """Superstep ``hop`` (1..L) of the open batch."""
        b = self._batch
        layer = self.layers[hop - 1]
        step = self._superstep(hop, layer, b.changed, b.removed, b.removed_rows,
                               b.edges, b.result)
        if not b.result.non_finite and not step.finite:
            b.result.non_finite = hop  # the other shards go on to the barrier: report at end
        b.step, b.hop = step, hop  # (the removed vertices' rows come from it)
        if hop < self.num_layers:
            b.changed = step.changed()
            b.removed_rows = (self._rows(hop, self._index(b.removed)) if len(b.removed)
                              else step.after[:0])  # (most batches remove no vertex)

    def _finish(self) -> ApplyResult:
        """Close the batch: its label changes and counts."""
        b, self._batch = self._batch, None
        b.result.changed_labels = self._label_changes(b.step)
        for touched in (b.edges.degree_changed, b.added):
            self._in_weight[touched] = self.graph.in_weight[touched]
        return b.result

    def _superstep(self, hop: int, layer: Layer, changed: _Changed, removed: np.ndarray,
                   removed_rows: Tensor, edges: _BatchEdges,
                   result: ApplyResult) -> _Step:
        g = self.graph
        sources = changed.slots
        if layer.degree_normalised:
            sources = self.sets.union(sources, edges.degree_changed)
        keeps_z, last = self._z[hop - 1], hop == self.num_layers
        owned = self.owned
        # the unchanged out-edges of the sources (the changed pairs are sent separately),
        # the region they and the changed edges reach, and the rows the next step reads
        at, v1, w1, region, count, fresh, ahead = superstep_region(
            g.out.arrays, np.asarray(sources, np.int64), edges.keys, edges.dst, changed.slots,
            owned, g.in_degree, self._batch.added, edges.src, removed, keeps_z and not last,
            self.sets.mark, self.sets.scratch)
        if not len(region):
            result.recomputed.append(0)
            result.pulled.append(0)
            result.pulled_columns.append(0)
            result.remote_reads.append(0)
            result.combined_messages.append(0)
            nothing, none = _no_rows(layer.out_dim, self.dtype, self.device)
            result.rewritten.append((region, none))
            return _Step(region, nothing, _NOT_ANY, _NOT_ANY, nothing)

        columns = None  # a pull of some columns only
        z_old = None  # the region's z before the batch, where z is kept (not at the last)
        if self.state[hop - 1] is None:  # RC: every destination pulled, no states kept
            pull = region
            pulled, remote = self._pull(hop, layer, pull)
            agg = layer.aggr.finalize(pulled, self._index(count)).to(self.dtype)
        elif layer.aggr.linear:  # messages fold into the states, read back in one pass
            agg, wear, z_old = self._fold(hop, layer, sources, at, v1, w1, changed, removed,
                                          removed_rows, edges, region, count,
                                          keep=keeps_z and not last)
            anchored = layer.aggr.re_anchored(wear)
            pull, remote = region[anchored], 0
            if len(pull):  # re-anchored: summed again from all in-neighbours
                pulled, remote = self._pull(hop, layer, pull)
                agg[self._index(anchored)] = (pulled if keeps_z else
                    layer.aggr.finalize(pulled, self._index(count[anchored]))).to(agg.dtype)
            agg = self._ours(agg)  # (in t's dtype)
        else:
            outbox = self._messages(hop, layer, sources, at, v1, w1, changed, removed,
                                    removed_rows, edges, region)
            lost = self._apply_delta(hop, layer, outbox, edges)
            pull, columns = ((lost.dst.cpu().numpy(), None) if lost.cols is None
                             else (region[:0], lost))
            if layer.aggr.destination_dependent:
                pull = self.sets.union(pull, changed.slots, alive=owned)
            remote = self._pull(hop, layer, pull)[1] if len(pull) else 0
            if columns is not None and len(columns.dst):
                remote += self._pull_columns(hop, layer, columns)
            agg = layer.aggr.finalize_stored(self.state[hop - 1], self._index(region),
                                             self._index(count))
            agg = agg.to(self.dtype)  # (a tensor, or packed attention states)
        activated = None
        if keeps_z:  # agg is z, stored already; h activated here, with rows read next
            activated = np.concatenate([region, ahead])
            after, moved, old_rows, finite = _compared(layer, z_old, agg,
                                                       self.state[hop - 1], ahead, fresh)
        else:
            root, index = self.root[hop - 1], self._index(region)
            if root is None:
                rows = self._rows(hop - 1, index)
                t = self._t(hop, layer, index) if layer.self_transform else None
                new = layer.update(rows, agg, t, self._weight(g.in_weight, region))
            else:  # only vertices whose own input changed need their root term again
                own = self._index(changed.slots)
                root[own] = layer.root(self._rows(hop - 1, own))
                new = layer.finish(layer.combine_root(agg, root.index_select(0, index)))
            moved, old_rows, finite = store_rows_(self.h[hop], region, new, fresh,
                                                  keep_old=not last)
            after = new
        result.recomputed.append(len(region))
        result.pulled.append(len(pull) + (0 if columns is None else len(columns.dst)))
        result.pulled_columns.append(0 if columns is None else _count(columns.cols))
        result.remote_reads.append(remote)
        result.combined_messages.append(self._combined_messages(sources, at, v1, edges))
        result.rewritten.append((region, after.numpy()[:len(region)] if self.device.type == "cpu"
                                 else after[:len(region)].cpu().numpy()))
        return _Step(region, after, fresh, moved, old_rows, finite, activated)

    def _fold(self, hop: int, layer: Layer, sources: np.ndarray, at: np.ndarray,
              v1: np.ndarray, w1: np.ndarray, changed: _Changed, removed: np.ndarray,
              removed_rows: Tensor, edges: _BatchEdges, region: np.ndarray,
              count: np.ndarray, keep: bool) -> tuple[Tensor, np.ndarray, Tensor | None]:
        """A linear aggregation's superstep: the messages that stop and start arriving in
        the region (along the unchanged edges ``sources[at] -> v1``, weights ``w1``, and
        the changed edges), one per row of t they carry, folded into the states; returns
        the region's finalized states (``count``: in-degrees), their wear and with
        ``keep`` their states before (`SumAggregation.fold`). Where the shard keeps the
        pre-activation, the root terms of sources whose input changed fold in too; a
        mean's messages then arrive divided by the in-degree, and the z of a vertex whose
        in-degree went from d to d' is first rescaled by d / d' about its old root term and
        bias (`_rescaled`)."""
        keeps_z = self._z[hop - 1]
        mean_z = keeps_z and layer.aggr.name == "mean"
        rescaled, at_region, a = self._rescaled(region, edges, count) if mean_z else (
            None, None, None)
        # the sources' root terms fold into their own z too
        own_slots = changed.slots[self.owned[changed.slots]] if keeps_z else None
        dst_scale = (np.divide(1.0, count, out=np.zeros(len(count)), where=count > 0)
                     if mean_z else ones(len(region)))
        source = self._h_table_of(hop - 1) if keeps_z and _one_kernel(self.device) else None
        if source is not None:  # all but the product in one kernel
            table, relu = source
            h, paired, rows, coef, local, extra_old = linear_step_inputs(
                sources, at, v1, w1, edges.src, edges.dst, edges.before, edges.after,
                edges.has, edges.had, self.graph.alive, changed.old_slots, removed,
                removed[:0] if rescaled is None else rescaled, own_slots, self.sets.mark,
                self.sets.scratch, region, dst_scale, layer.edge_weighted, table.numpy(),
                relu, _joined([*changed.old_rows, removed_rows]).numpy())
            t = layer.rel_root(torch.from_numpy(h), paired)
        else:
            m = self._message_sources(hop, layer, sources, at, changed, removed,
                                      removed_rows, edges, rescaled, own_slots)
            scale_new, scale_old = self._source_scales(layer, m.slots)
            rows, coef, local = linear_delta_messages(
                m.new, m.old, m.delta, m.at1, v1, w1, m.at2, edges.dst, edges.before,
                edges.after, m.has, m.had, layer.edge_weighted, scale_new, scale_old, region,
                dst_scale, self.sets.scratch, m.own, own_slots, m.paired)
            t, extra_old = m.t, m.old[m.extra]
        scale = bias = None
        if mean_z and len(a):  # rescaled about r + b: (1 - a) r as messages from old roots
            scale = np.ones(len(region))
            scale[at_region] = a
            roots = 2 * extra_old + 1
            rows, coef, local = (np.concatenate(pair) for pair in zip(
                (rows, coef, local), (roots, 1.0 - a, at_region), strict=True))
            bias = layer.empty_preactivation().double().cpu().numpy()
        return layer.aggr.fold(self.state[hop - 1], self.drift[hop - 1], t, rows, coef,
                               local, region, None if keeps_z else count, scale, bias, keep)

    def _rescaled(self, region: np.ndarray, edges: _BatchEdges, count: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A mean's z = S / d + r + b (S: the messages' sum, r: the root term, b: the
        bias) for the new in-degree d' is ``a z + (1 - a) (r + b)`` with a = d / d' (0
        when d' is 0). Returns the region's vertices to rescale so (their in-degree
        changed, they are not new and had an in-edge: z is r + b already otherwise),
        their positions in the region and their ``a``."""
        at = self.sets.find(region, edges.recounted)
        kept = (at >= 0) & (edges.count_before > 0) & ~self._added(edges.recounted)
        before = edges.count_before[kept].astype(np.float64)
        at = at[kept]
        now = count[at].astype(np.float64)
        return (edges.recounted[kept], at,
                np.divide(before, now, out=np.zeros(len(at)), where=now > 0))

    def _messages(self, hop: int, layer: Layer, sources: np.ndarray, at: np.ndarray,
                  v1: np.ndarray, w1: np.ndarray, changed: _Changed, removed: np.ndarray,
                  removed_rows: Tensor, edges: _BatchEdges, region: np.ndarray
                  ) -> _RowMessages:
        """Messages that stop and start arriving in the region, for aggregations that are
        not linear: one per edge, in both directions, as rows of the sources' t and edge
        weights (and, for destination-dependent ones, each region vertex's
        `Layer.destination_part`; a destination whose input changed is pulled anyway, so
        none is sent to it)."""
        m = self._message_sources(hop, layer, sources, at, changed, removed, removed_rows,
                                  edges)

        def messages(rows: np.ndarray, w: np.ndarray, dst: np.ndarray) -> RowMessages:
            if layer.aggr.destination_dependent:  # destinations whose input changed: pulled
                kept = self.sets.find(changed.slots, dst) < 0
                rows, w, dst = rows[kept], w[kept], dst[kept]
            factor = w if layer.edge_weighted else np.ones(len(w), np.float32)
            return RowMessages(rows, factor, self.sets.positions(region, dst))

        part = None
        if layer.aggr.destination_dependent:
            kept = self.t[hop - 1]  # kept: the region's parts alone, not their whole rows
            part = (layer.destination_part(kept)[self._index(region)]
                    if kept is not None else
                    layer.destination_part(self._t(hop, layer, self._index(region))))
        return _RowMessages(m.t, region, messages(
            m.new[np.concatenate([m.at1, m.at2[m.has]])],
            np.concatenate([w1, edges.after[m.has]]),
            np.concatenate([v1, edges.dst[m.has]])), messages(
            m.old[np.concatenate([m.at1, m.at2[m.had]])],
            np.concatenate([w1, edges.before[m.had]]),
            np.concatenate([v1, edges.dst[m.had]])), part)

    def _message_sources(self, hop: int, layer: Layer, sources: np.ndarray, at: np.ndarray,
                         changed: _Changed, removed: np.ndarray, removed_rows: Tensor,
                         edges: _BatchEdges, extra: np.ndarray | None = None,
                         own_slots: np.ndarray | None = None) -> _Sources:
        """The message sources of a superstep and their table of t (`_Sources`), in one
        transform, with the rows before the batch of the ``extra`` slots (a mean's
        rescaled vertices) and the root terms of the sources at ``own_slots``. Where the
        shard keeps the pre-activation, the table is `Layer.rel_root` of those rows (two
        rows of t each where a root term is read). Where t is kept it is read, not computed
        (`_kept_rows`)."""
        none = removed[:0]
        differences = (self.t[hop - 1] is None and layer.aggr.linear
                       and not layer.degree_normalised)
        (slots, at1, at2, has, had, own, extra_at, prior, new, old, delta, fresh, taken,
         moved, dest, paired) = message_sources(
            sources, at, edges.src, edges.dst, edges.has, edges.had, self.graph.alive,
            changed.old_slots, removed, none if extra is None else extra,
            none if own_slots is None else own_slots, differences, self.sets.mark,
            self.sets.scratch)
        old_rows = _joined([*changed.old_rows, removed_rows])  # h before, by ``prior``
        keeps_z = self._z[hop - 1]
        if differences:  # t of the rows messages read, and of h_new - h_old
            table, read, relu = self._h_source(hop - 1, np.concatenate([slots[fresh],
                                                                       slots[moved]]))
            rows = difference_table(table, read, relu, old_rows, prior[taken], prior[moved],
                                    dest)
            t = layer.rel_root(rows, paired) if keeps_z else layer.transform(rows)
        elif self.t[hop - 1] is not None:
            olds = np.concatenate([changed.old_slots, removed])
            t = self._kept_rows(hop, layer, slots, olds, changed)
        else:
            rows = torch.cat([self._rows(hop - 1, self._index(slots)), old_rows])
            t = layer.rel_root(rows, paired) if keeps_z else layer.transform(rows)
        return _Sources(slots, t, new, old, delta, has, had, at1, at2,
                        None if own_slots is None else own, extra_at, paired)

    def _kept_rows(self, hop: int, layer: Layer, slots: np.ndarray, olds: np.ndarray,
                   changed: _Changed) -> Tensor:
        """Where t is kept: rows of the sources ``slots`` after the batch, then before it
        (of ``olds``), read from it but for the sources whose input changed (the sources
        include all of them), whose new rows it then takes: the old rows subtracted are
        then the very values once added."""
        kept = self.t[hop - 1]
        t = kept.index_select(0, self._index(np.concatenate([slots, olds])))
        index = self._index(changed.slots)
        new = layer.transform(self._rows(hop - 1, index))
        t[self._index(self.sets.positions(slots, changed.slots))] = new
        kept[index] = new
        return t

    def _source_scales(self, layer: Layer, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The per-source message factor after and before the batch (degree-normalised
        layers; ones otherwise), in float64."""
        if not layer.degree_normalised:
            return ones(len(slots)), ones(len(slots))
        return tuple(layer.source_scale(torch.from_numpy(w[slots])).numpy()
                     for w in (self.graph.in_weight, self._in_weight))

    def _apply_delta(self, hop: int, layer: Layer, outbox: _RowMessages,
                     edges: _BatchEdges) -> Pull:
        return layer.aggr.apply_delta(self.state[hop - 1], self.ties[hop - 1], outbox.t,
                                      outbox.region, outbox.new, outbox.old,
                                      self._index(edges.empty_before), outbox.part)

    def _combined_messages(self, sources: np.ndarray, at: np.ndarray, v1: np.ndarray,
                           edges: _BatchEdges) -> int:
        if self.ghost is None:
            return 0
        return self.sets.remote_pairs(sources, at, v1, edges.src, edges.dst, edges.had,
                                      edges.has, self.owned, self.ghost, self.ghost_owner)

    def _pull(self, hop: int, layer: Layer, pull: np.ndarray) -> tuple[Tensor, int]:
        """Recompute the states of ``pull`` from all their in-neighbours; also returns how
        many distinct ghosts they read. A linear aggregation sums the rows of h and
        transforms the sums (its transform is linear without bias, so it commutes with
        them: `Layer.partial`), one row per pulled vertex instead of one per in-neighbour:
        where h is a stored table, summed in place (`_pull_sums`), else from rows gathered
        (`_pull_gathered`)."""
        state, count, remote = (self._pull_sums(hop, layer, pull)
                                or self._pull_gathered(hop, layer, pull))
        if self._z[hop - 1]:  # the pre-activation: aggregated, then the vertex's own terms
            agg = layer.aggr.finalize(state, self._index(count))
            state = layer.preactivation(self._rows(hop - 1, self._index(pull)),
                                        self._ours(agg))
        if self.state[hop - 1] is not None:
            self.state[hop - 1][self._index(pull)] = state.to(self.state[hop - 1].dtype)
            if self.drift[hop - 1] is not None:
                self.drift[hop - 1][self._index(pull)] = layer.aggr.fresh_drift(state)
        return state, remote

    def _pull_sums(self, hop: int, layer: Layer, pull: np.ndarray
                   ) -> tuple[Tensor, np.ndarray, int] | None:
        """`_pull`'s aggregation where it is a sum of rows of a table h^(hop-1) is read
        from (`_h_table_of`), weighted by the edges' weights alone (a linear aggregation,
        not degree-normalised, whose t is not kept): summed where the rows and in-edges
        are stored (`in_row_sums`), then transformed. Returns the states, the in-degrees
        and the distinct ghosts read; None where the pull must gather rows."""
        if not layer.aggr.linear or layer.degree_normalised or self.t[hop - 1] is not None:
            return None
        source = self._h_table_of(hop - 1)
        if source is None:
            return None
        begin, end, src, w, remote = self._in_edges(pull)
        table, relu = source
        state = in_row_sums(table, relu, begin, end, src, w if layer.edge_weighted else None,
                            self.dtype, self.device)
        return (layer.transform(state) if layer.transforms else state), end - begin, remote

    def _pull_gathered(self, hop: int, layer: Layer, pull: np.ndarray
                       ) -> tuple[Tensor, np.ndarray, int]:
        """`_pull`'s aggregation from the rows of t its in-neighbours read, gathered (and
        transformed unless the sums will be), or read in place where t is kept."""
        g = self.graph
        ptr, src, w = g.in_edges(pull)
        remote = self._ghosts_read(src)
        raw = False  # the rows aggregated are h, to be transformed after
        if self.t[hop - 1] is not None:  # kept: read in place, by slot
            rows, t = slice(None), self.t[hop - 1]  # rows: all slots
            src_at, pull_at = src, pull
        else:  # the rows the pull reads, transformed unless the sums will be
            rows = self.sets.union(src, pull)
            raw = layer.aggr.linear and layer.transforms
            index = self._index(rows)
            t = self._rows(hop - 1, index) if raw else self._t(hop, layer, index)
            src_at, pull_at = self.sets.positions(rows, src), self.sets.positions(rows, pull)
        scale = (layer.source_scale(self._weight(g.in_weight, rows))
                 if layer.degree_normalised else None)
        state = aggregate(layer, t, ptr, self._index(src_at), self._tensor(w).to(t.dtype),
                          scale, self._index(pull_at))
        return (layer.transform(state) if raw else state), np.diff(ptr), remote

    def _pull_columns(self, hop: int, layer: Layer, pull: Pull) -> int:
        """Re-aggregate the columns ``pull.cols`` of ``pull.dst`` from all their
        in-neighbours (`Aggregation.pull_columns`), reading their rows of t in place where
        t is h as stored (and, without ghosts to count, the in-edges where the graph keeps
        them); returns how many distinct ghosts they read."""
        slots = pull.dst.cpu().numpy()
        table = None if layer.transforms else self._h_table(hop - 1)
        begin, end, src, w, remote = self._in_edges(slots, listed=table is None)
        if table is None:  # t of the rows read
            rows = self.sets.union(src)
            table = self._t(hop, layer, self._index(rows))
            src = self.sets.positions(rows, src)
        layer.aggr.pull_columns(self.state[hop - 1], self.ties[hop - 1], pull, table, begin,
                                end, src, w if layer.edge_weighted else None)
        return remote

    def _keep_ties(self) -> None:
        """Beside each state of an aggregation that keeps ties (max/min), the ties, counted
        where there are none yet."""
        for hop, (layer, state) in enumerate(zip(self.layers, self.state, strict=True),
                                             start=1):
            if state is not None and layer.aggr.ties_dtype and self.ties[hop - 1] is None:
                self.ties[hop - 1] = torch.zeros(state.shape, dtype=layer.aggr.ties_dtype,
                                                 device=self.device)
                self._count_ties(hop)

    @torch.inference_mode()
    def _count_ties(self, hop: int, max_edges: int = 1 << 20) -> None:
        """Layer ``hop``'s ties of every vertex this shard owns: all their columns
        re-aggregated, vertices in chunks of at most ``max_edges`` in-edges."""
        owned = np.flatnonzero(self.owned[:self.graph.num_slots])
        width = self.state[hop - 1].shape[1]
        for a, b in pairwise(chunk_bounds(self.graph.in_degree[owned], max_edges).tolist()):
            cols = torch.ones((b - a, width), dtype=torch.bool, device=self.device)
            self._pull_columns(hop, self.layers[hop - 1], Pull(self._index(owned[a:b]), cols))

    # ---------------------------------------------------------------- helpers
    def _in_edges(self, slots: np.ndarray, listed: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """The in-edges of ``slots`` as blocks: vertex i's sources are
        ``src[begin[i]:end[i]]``, weights alongside in ``w``; and how many distinct ghosts
        they name. Read where the graph stores them (no copy) unless ``listed`` (the
        blocks one after another, `DynamicGraph.in_edges`) or there are ghosts to count."""
        if self.ghost is None and not listed:
            begin, end, src, w = self.graph.in_blocks(slots)
            return begin, end, src, w, 0
        ptr, src, w = self.graph.in_edges(slots)
        return ptr[:-1], ptr[1:], src, w, self._ghosts_read(src)

    def _ghosts_read(self, src: np.ndarray) -> int:
        """How many distinct ghosts the slots ``src`` name."""
        return 0 if self.ghost is None else len(np.unique(src[self.ghost[src]]))

    def _batch_edges(self, diff: GraphDiff) -> _BatchEdges:
        g, e = self.graph, diff.edges
        return _BatchEdges(*edge_changes(e.src, e.dst, e.before, e.after, g.alive,
                                         g.in_degree, self.sets.mark, self.sets.scratch))

    def _label_changes(self, last: _Step) -> ChangedLabels:
        new = argmax_rows(last.after[:len(last.region)])
        at, old = relabel_(self._labels, last.region, new, last.fresh)
        return ChangedLabels(self.graph.ext[last.region[at]], old, new[at])

    def _added(self, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` the open batch added (a lookup costing what the batch does,
        not a mask over every slot)."""
        added = self._batch.added
        if not len(added):  # most small batches add no vertex
            return np.zeros(len(slots), bool)
        return self.sets.find(added, slots) >= 0

    def _h_source(self, layer: int, slots: np.ndarray) -> tuple[Tensor, np.ndarray, bool]:
        """Where h^layer of ``slots`` is read: a table, its rows to read, and whether h is
        ReLU of them: `_h_table_of`'s table and the slots where there is one, else h of
        the slots, activated here (`_rows`)."""
        source = self._h_table_of(layer)
        if source is None:
            return self._rows(layer, self._index(slots)), np.arange(len(slots)), False
        return source[0], slots, source[1]

    def _h_table_of(self, layer: int) -> tuple[Tensor, bool] | None:
        """A table h^layer of every slot is read from, by slot, and whether h is ReLU of
        its rows: the features, h as stored, or z where the shard keeps it and the layer
        activates value by value (`Layer.elementwise`); None where h must be computed."""
        kind = ("identity" if layer == 0 or not self._z[layer - 1]
                else self.layers[layer - 1].elementwise)
        if kind is None:
            return None
        table = torch.from_numpy(self.graph.x) if layer == 0 else self._stored(layer)
        return table, kind == "relu"

    def _h_table(self, layer: int) -> Tensor | None:
        """h^layer of every vertex, rows by slot, as stored; for the features (layer 0)
        None unless they are already in the engine's dtype and device."""
        if layer > 0:
            return self.h[layer]  # None where the shard keeps the pre-activation
        x = torch.from_numpy(self.graph.x)
        return x if x.dtype == self.dtype and self.device.type == "cpu" else None

    def _t(self, hop: int, layer: Layer, index: Tensor) -> Tensor:
        """t of the vertices ``index`` at superstep ``hop``: kept, or transformed from
        their h^(hop-1)."""
        kept = self.t[hop - 1]
        if kept is None:
            return layer.transform(self._rows(hop - 1, index))
        return kept.index_select(0, index)

    def _rows(self, layer: int, index: Tensor) -> Tensor:
        """h^layer of the slots ``index``."""
        if layer == 0:
            rows = self.graph.x.take(index.cpu().numpy(), axis=0)
            return self._ours(torch.from_numpy(rows))
        if self._z[layer - 1]:
            return self._activated(layer, index)
        return self.h[layer].index_select(0, index)

    def _activated(self, layer: int, index: Tensor) -> Tensor:
        """h^layer of the slots ``index`` where the shard keeps z: `Layer.activate` of
        their rows, but for the rows the open batch's last superstep activated (of that
        layer, `_Step.activated`), which are taken as they are where the activation has
        products (GIN's would otherwise run again on a few rows; an activation value by
        value costs less than finding them)."""
        activate, z = self.layers[layer - 1].activate, self.state[layer - 1]
        if not index.shape[0]:
            return z.new_empty((0, self.layers[layer - 1].out_dim))
        b = self._batch
        if (b is None or b.hop != layer or b.step.activated is None
                or self.layers[layer - 1].elementwise is not None):
            return activate(z.index_select(0, index))
        after = b.step.after
        at = self.sets.find_in_runs(b.step.activated, len(b.step.region),
                                    index.cpu().numpy())
        missing = np.flatnonzero(at < 0)
        if not len(missing):
            return take_rows(after, at)
        rest = activate(z.index_select(0, index[self._index(missing)]))
        return merge_rows(after, at, rest)

    def _index(self, slots: np.ndarray) -> Tensor:
        index = torch.from_numpy(slots if slots.dtype == np.int64 else slots.astype(np.int64))
        return index if self.device.type == "cpu" else index.to(self.device)

    def _tensor(self, array: np.ndarray) -> Tensor:
        t = torch.from_numpy(np.ascontiguousarray(array))
        return t if self.device.type == "cpu" else t.to(self.device)

    def _ours(self, t: Tensor) -> Tensor:
        """``t`` in the engine's dtype and on its device: itself where it is already (a
        `Tensor.to` that changes nothing still costs a dispatch, several a batch)."""
        if t.dtype == self.dtype and t.device == self.device:
            return t
        return t.to(self.device, self.dtype)

    def _weight(self, in_weight: np.ndarray, slots: np.ndarray) -> Tensor:
        return self._ours(torch.from_numpy(in_weight[slots]))

    def _fit_capacity(self) -> None:
        """Grow the per-vertex tensors with the graph."""
        for name in ("_in_weight", "ghost", "holders", "ghost_owner"):
            old = getattr(self, name)
            if old is not None and len(old) < len(self.graph.in_weight):
                setattr(self, name, lengthened(old, len(self.graph.in_weight)))
        need = self.graph.num_slots
        have = len(self._labels)
        if need <= have:
            return
        size = max(need, have * 5 // 4)
        self.h = [None if h is None else _grown(h, size) for h in self.h]
        self.state = [None if s is None else _grown(s, size) for s in self.state]
        self.drift = [None if d is None else _grown(d, size) for d in self.drift]
        self.root = [None if r is None else _grown(r, size) for r in self.root]
        self.t = [None if t is None else _grown(t, size) for t in self.t]
        self.ties = [None if t is None else _grown(t, size) for t in self.ties]
        self._labels = lengthened(self._labels, size)


def _keeps_z(layer: Layer, state: Tensor | None) -> bool:
    """Whether a shard keeps the layer's pre-activation z as its only table: it keeps a
    state (not RC) and the layer `Layer.keeps_preactivation`."""
    return state is not None and layer.keeps_preactivation


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


@functools.cache
def _no_rows(width: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, np.ndarray]:
    """No rows of ``width`` columns, as a tensor and on the host: shared (a superstep
    that reaches no vertex returns them; creating them costs more than its other work)."""
    rows = torch.empty((0, width), dtype=dtype, device=device)
    return rows, rows.cpu().numpy()


def _one_kernel(device: torch.device) -> bool:
    """Whether a superstep may run all before its product in one numba kernel
    (`linear_step_inputs`: tables on CPU)."""
    return device.type == "cpu"


def _joined(parts: list[Tensor]) -> Tensor:
    """The rows of ``parts`` in one tensor: the only part with rows as it is."""
    full = [p for p in parts if p.shape[0]]
    return full[0] if len(full) == 1 else torch.cat(parts)


def _fresh_drift(layer: Layer, state: Tensor | None) -> Tensor | None:
    """Rounding bounds of states just computed from all in-neighbours, for aggregations
    whose deltas round (linear ones)."""
    if state is None or not layer.aggr.linear:
        return None
    return layer.aggr.fresh_drift(state)


def _grown(t: Tensor, size: int) -> Tensor:
    """``t`` with ``size`` rows, the new ones zero: on the CPU in place where its mapping
    has room (`lengthened`), else a copy."""
    if t.device.type == "cpu":
        return torch.from_numpy(lengthened(t.numpy(), size))
    out = t.new_zeros((size, *t.shape[1:]))
    out[:len(t)] = t
    return out


# A row reduction: numpy is quicker than torch on the small CPU tensors of a batch.
def _count(flags: Tensor) -> int:
    """How many of the bools are set."""
    if flags.device.type == "cpu":
        return int(np.count_nonzero(flags.numpy()))
    return int(flags.sum())
