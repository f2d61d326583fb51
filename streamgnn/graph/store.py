"""`DynamicGraph`: the mutable directed graph keyed by external ids: vertex slots, features,
in- and out-adjacency with weights, degrees, and atomic batches of the six update types.

Policy (what PyG computes on the exported graph): the graph is simple. A self-loop or a
second edge between the same ordered pair is rejected; layers that add self-loops (GCN,
GAT) add them themselves, as PyG does. Deleting a vertex deletes its edges. A deleted
vertex's slot is reused only after the batch that deleted it.

Owns graph state only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamgnn.allocator import lengthened
from streamgnn.datasets.graph_data import GraphData
from streamgnn.errors import (
    DuplicateEdgeError,
    DuplicateVertexError,
    FeatureDimensionError,
    InvalidUpdateError,
    NonFiniteValueError,
    OutOfRangeError,
    SelfLoopError,
    UnknownEdgeError,
    UnknownVertexError,
)
from streamgnn.graph.adjacency import Adjacency
from streamgnn.graph.batch import (
    BAD_DIMENSION,
    BAD_X,
    DUPLICATE_EDGE,
    DUPLICATE_VERTEX,
    NEED_ROOM_IN,
    NEED_ROOM_OUT,
    OK,
    SELF_LOOP,
    UNKNOWN_A,
    UNKNOWN_B,
    UNKNOWN_EDGE,
    apply_kernel,
    batch_sizes,
    net_kernel,
    undo_kernel,
)
from streamgnn.graph.idmap import IdMap, Slotted
from streamgnn.updates import (
    ADD_EDGE,
    ADD_VERTEX,
    DELETE_VERTEX,
    UPDATE_EDGE,
    UPDATE_FEATURES,
    Update,
    UpdateBatch,
    ValueLimits,
)


@dataclass
class EdgeLog:
    """Edge changes in slots: weight ``before``/``after``, NaN where the edge is absent;
    pairs in key order (by ``src``, then ``dst``: `pair_keys` ascending)."""

    src: np.ndarray
    dst: np.ndarray
    before: np.ndarray
    after: np.ndarray


@dataclass
class GraphDiff:
    """The net effect of one batch, in internal slots.

    ``edges`` holds each ordered pair whose weight or presence differs before vs after the
    batch. ``added`` (sorted) and ``removed`` are vertices alive only after / only before
    it (``removed_x`` their features from before it); ``changed`` (sorted) are vertices
    alive throughout whose features differ after the batch, with ``changed_x_before``.
    ``rejected``: the errors of the updates a ``skip_invalid`` batch left out (``index`` =
    position in the batch)."""

    edges: EdgeLog
    added: np.ndarray
    removed: np.ndarray
    removed_x: np.ndarray
    changed: np.ndarray
    changed_x_before: np.ndarray
    rejected: list[InvalidUpdateError]


class DynamicGraph(Slotted):
    """A simple directed graph with float32 features and edge weights, keyed by int64 ids."""

    def __init__(self, num_features: int, vertex_capacity: int = 1024) -> None:
        self.num_features = num_features
        self._ids = IdMap(vertex_capacity)
        self.alive = np.zeros(vertex_capacity, bool)
        # (on the heap, where a loaded dataset's freed rows are reused: a table with room
        # here raised products-like's peak by its 0.75 GB; its first growth moves it)
        self.x = np.zeros((vertex_capacity, num_features), np.float32)
        self.in_weight = np.zeros(vertex_capacity, np.float64)  # weighted in-degree
        self.out = Adjacency(vertex_capacity)
        self.inn = Adjacency(vertex_capacity)
        self._free = np.zeros(vertex_capacity, np.int32)   # stack of reusable slots
        self._limbo = np.zeros(0, np.int32)  # slots deleted by the open batch
        self._counts = np.zeros(4, np.int64)  # free top, limbo top, slots used, xsave rows
        self.limits = ValueLimits()

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_data(cls, data: GraphData, limits: ValueLimits | None = None) -> DynamicGraph:
        """Bulk load a snapshot; slot i holds ``data.ids[i]``. Values past ``limits``
        raise `OutOfRangeError` naming the first (later deltas on them would not be
        exact)."""
        n = data.num_vertices
        g = cls(data.num_features, vertex_capacity=max(n, 16))
        g.limits = limits or g.limits
        over = np.flatnonzero(np.abs(data.x).max(axis=1, initial=0) > g.limits.features)
        if len(over):
            raise OutOfRangeError(f"vertex {data.ids[over[0]]}: a feature value is beyond the "
                                  f"limit of +-{g.limits.features:g} (see ValueLimits)")
        over = np.flatnonzero(np.abs(data.weight) > g.limits.weights)
        if len(over):
            raise OutOfRangeError(f"edge ({data.src[over[0]]}, {data.dst[over[0]]}): weight "
                                  f"{data.weight[over[0]]:g} is beyond the limit of "
                                  f"+-{g.limits.weights:g} (see ValueLimits)")
        g._ids.insert(data.ids, np.arange(n, dtype=np.int32))
        g.alive[:n] = True
        g.x[:n] = data.x
        g._counts[2] = n
        s = data.positions(data.src).astype(np.int32)
        d = data.positions(data.dst).astype(np.int32)
        by_src = np.argsort(s, kind="stable")
        by_dst = np.argsort(d, kind="stable")
        g.out = Adjacency.from_sorted(len(g.ext), s[by_src], d[by_src], data.weight[by_src])
        g.inn = Adjacency.from_sorted(len(g.ext), d[by_dst], s[by_dst], data.weight[by_dst])
        g.in_weight[:n] = np.bincount(d, weights=data.weight, minlength=n)
        return g

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The graph as plain arrays, laid out as it is (a graph rebuilt by `from_arrays`
        repeats this one bit for bit): what a checkpoint holds."""
        cells, _, id_counts = self._ids.table
        arrays = {"ids_cells": cells, "ids_counts": id_counts, "ext": self.ext,
                  "alive": self.alive, "x": self.x, "in_weight": self.in_weight,
                  "free": self._free, "counts": self._counts,
                  "limits": np.array([self.limits.features, self.limits.weights])}
        for side, adj in (("out", self.out), ("inn", self.inn)):
            arrays.update({f"{side}_{k}": a for k, a in zip(Adjacency.FIELDS, adj.arrays,
                                                             strict=True)})
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> DynamicGraph:
        """The graph `to_arrays` gave (a batch is never open in one). It adopts the
        arrays, which nothing else may hold: a large graph read from a file or a message is
        not copied again."""
        g = cls(arrays["x"].shape[1], vertex_capacity=len(arrays["alive"]))
        g._ids.ext = arrays["ext"]
        g._ids.table = (arrays["ids_cells"], g._ids.ext, arrays["ids_counts"])
        for name in ("alive", "x", "in_weight"):
            setattr(g, name, arrays[name])
        g._free, g._counts = arrays["free"], arrays["counts"]
        g.limits = ValueLimits(*map(float, arrays["limits"]))
        g.out = Adjacency.from_arrays([arrays[f"out_{k}"] for k in Adjacency.FIELDS])
        g.inn = Adjacency.from_arrays([arrays[f"inn_{k}"] for k in Adjacency.FIELDS])
        return g

    # ---------------------------------------------------------------- queries
    @property
    def num_slots(self) -> int:
        return int(self._counts[2])

    @property
    def num_edges(self) -> int:
        return self.out.num_edges

    @property
    def in_degree(self) -> np.ndarray:
        return self.inn.deg

    @property
    def out_degree(self) -> np.ndarray:
        return self.out.deg

    @property
    def id_table(self) -> tuple:
        """The id map's table, for kernels that look ids up themselves
        (`idmap.get_many`)."""
        return self._ids.table

    def edge_slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All edges as (src slot, dst slot, weight), grouped by source."""
        v = self.vertex_slots()
        ptr, dst, w = self.out.gather(v)
        return np.repeat(v.astype(np.int32), np.diff(ptr)), dst, w

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All edges as (src id, dst id, weight)."""
        s, d, w = self.edge_slots()
        return self.ext[s], self.ext[d], w

    def has_edges(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> np.ndarray:
        return self.out.find(src_slots, dst_slots) >= 0

    def in_edges(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, src slots, weights) of the in-edges of ``vertices``, CSR-style."""
        return self.inn.gather(vertices)

    def in_blocks(self, vertices: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The in-edges of ``vertices`` where they are stored, without a copy: vertex i's
        sources are ``src[begin[i]:end[i]]``, their weights alongside in ``w``; valid
        until the graph next changes. Returns (begin, end, src, w)."""
        begin = self.inn.start[vertices]
        return begin, begin + self.inn.deg[vertices], self.inn.nbr, self.inn.w

    def out_edges(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, dst slots, weights) of the out-edges of ``vertices``, CSR-style."""
        return self.out.gather(vertices)

    def to_data(self) -> GraphData:
        """The current graph as a snapshot (vertices in slot order)."""
        v = self.vertex_slots()
        s, d, w = self.edges()
        return GraphData(ids=self.ext[v], src=s, dst=d, x=self.x[v], weight=w)

    def nbytes(self) -> dict[str, int]:
        """Bytes held, by part; ``structure`` excludes the feature matrix."""
        parts = {
            "id_map": self._ids.nbytes + self.alive.nbytes + self._free.nbytes,
            "out_adjacency": self.out.nbytes,
            "in_adjacency": self.inn.nbytes,
            "in_weight": self.in_weight.nbytes,
        }
        parts["structure"] = sum(parts.values())
        parts["features"] = self.x.nbytes
        return parts

    # ---------------------------------------------------------------- batches
    def apply(self, batch: Sequence[Update] | UpdateBatch, skip_invalid: bool = False,
              ghosts: bool = False) -> GraphDiff:
        """Apply ``batch`` (updates, or their columns) in order, atomically: on a bad update,
        everything the batch did is undone and the error (``index`` = the update's position)
        is raised. With ``skip_invalid`` a bad update is left out instead (each update is
        checked before it changes anything) and its error listed in ``GraphDiff.rejected``.
        ``ghosts``: the graph is a partition's, the batch its share (`apply_kernel`)."""
        return self._apply(batch, skip_invalid, ghosts, keep=True)

    def check(self, batch: UpdateBatch, ghosts: bool = False) -> InvalidUpdateError | None:
        """The error `apply` would raise for ``batch``, or None; the graph is left as it
        was either way."""
        try:
            self._apply(batch, False, ghosts, keep=False)
        except InvalidUpdateError as e:
            return e
        return None

    def _apply(self, batch: Sequence[Update] | UpdateBatch, skip_invalid: bool, ghosts: bool,
               keep: bool) -> GraphDiff | None:
        if not len(batch):  # (a partition's share of a batch that does not touch it)
            self._counts[3] = 0  # (the log's feature rows, as any batch starts them)
            return self.unchanged()
        enc = (batch.with_width(self.num_features) if isinstance(batch, UpdateBatch)
               else UpdateBatch.from_updates(batch, self.num_features))
        counts, cascade = batch_sizes(enc.op, enc.src, self._ids.table, self.out.deg,
                                      self.inn.deg)
        ghost_adds = int(counts[ADD_EDGE]) if ghosts else 0
        self._reserve(int(counts[ADD_VERTEX]) + ghost_adds)
        log, xsave = self._new_log(enc, counts, cascade + ghost_adds)
        args = (self._ids.table, self._verts, self.out.arrays, self.inn.arrays)
        limits = np.array([self.limits.features, self.limits.weights], np.float64)
        status, index = OK, 0
        rejected: list[InvalidUpdateError] = []
        while True:
            status, index = apply_kernel((enc.op, enc.src, enc.dst, enc.w, enc.xrow, enc.x), index,
                                         *args, log, xsave, limits, ghosts)
            if status in (NEED_ROOM_OUT, NEED_ROOM_IN):
                self._make_room(status, len(enc) - index)
                args = (self._ids.table, self._verts, self.out.arrays, self.inn.arrays)
            elif status != OK and skip_invalid:
                rejected.append(error_for(status, index, enc, self.num_features, self.limits))
                index += 1
            else:
                break
        if status != OK or not keep:
            while (undo := undo_kernel(*args, log, xsave)) != OK:
                self._make_room(undo, 1)
                args = (self._ids.table, self._verts, self.out.arrays, self.inn.arrays)
            self._release()
            if status != OK:
                raise error_for(status, index, enc, self.num_features, self.limits)
            return None
        diff = self._net(log, xsave, rejected)
        self._release()
        return diff

    def unchanged(self) -> GraphDiff:
        """The net effect of an empty batch: nothing, in the columns `apply` returns."""
        slots, weights = np.zeros(0, np.int32), np.zeros(0, np.float32)
        rows = np.zeros((0, self.num_features), np.float32)
        return GraphDiff(EdgeLog(slots, slots, weights, weights), slots, slots, rows, slots,
                         rows, [])

    def _reserve(self, adds: int) -> None:
        """Room for ``adds`` more vertices."""
        self._ids.reserve(adds)
        if self.num_slots + adds > len(self.ext):
            self._grow(max(len(self.ext) * 5 // 4, self.num_slots + adds))

    def _new_log(self, enc: UpdateBatch, counts: np.ndarray, cascade: int):
        """Log arrays big enough for the batch (`batch_sizes`: its updates per op code and
        the edges its vertex deletions can cascade to): every edge op, every feature
        change, every vertex op, and every edge a vertex deletion can cascade to."""
        size = len(enc.op) + int(counts[ADD_EDGE]) + int(cascade) + 1
        # (filled up to the log's count before anything reads them: not zeroed)
        log = (np.empty(size, np.int8), np.empty((size, 2), np.int64),
               np.empty((size, 2), np.float32), np.zeros(1, np.int64))
        self._counts[3] = 0
        self._limbo = np.zeros(int(counts[DELETE_VERTEX]), np.int32)
        return log, np.empty((int(counts[UPDATE_FEATURES]), self.num_features), np.float32)

    @property
    def _verts(self) -> tuple:
        return self.alive, self.x, self._free, self._limbo, self._counts

    def _make_room(self, status: int, pending: int) -> None:
        (self.out if status == NEED_ROOM_OUT else self.inn).make_room(pending)

    def _release(self) -> None:
        """Slots deleted in the batch become reusable once it is over."""
        free_top, limbo_top = int(self._counts[0]), int(self._counts[1])
        self._free[free_top:free_top + limbo_top] = self._limbo[:limbo_top]
        self._counts[0] += limbo_top
        self._counts[1] = 0

    def _grow(self, capacity: int) -> None:
        self._ids.grow_slots(capacity)
        for name in ("alive", "in_weight", "x", "_free"):
            setattr(self, name, lengthened(getattr(self, name), capacity))
        self.out.grow_vertices(capacity)
        self.inn.grow_vertices(capacity)

    def _net(self, log, xsave, rejected: list[InvalidUpdateError]) -> GraphDiff:
        """Net effect of the batch from its log; refreshes the weighted in-degree of every
        destination an edge entry touched."""
        src, dst, before, after, added, gone, gone_x, changed, changed_x = net_kernel(
            log, self.alive, self.x, xsave, self.inn.arrays, self.in_weight)
        return GraphDiff(EdgeLog(src, dst, before, after), added, gone, gone_x, changed,
                         changed_x, rejected)


def error_for(status: int, i: int, enc: UpdateBatch, num_features: int, limits: ValueLimits
           ) -> InvalidUpdateError:
    """The exception for a kernel status, naming the update's ids."""
    a, b, code = int(enc.src[i]), int(enc.dst[i]), int(enc.op[i])
    edge = f"edge ({a}, {b})"
    if status == UNKNOWN_A and code > UPDATE_EDGE:
        err = UnknownVertexError(f"vertex {a} is not in the graph")
    elif status in (UNKNOWN_A, UNKNOWN_B):
        err = UnknownVertexError(
            f"{edge}: vertex {a if status == UNKNOWN_A else b} is not in the graph")
    elif status == DUPLICATE_VERTEX:
        err = DuplicateVertexError(f"vertex {a} already exists")
    elif status == UNKNOWN_EDGE:
        err = UnknownEdgeError(f"{edge} is not in the graph")
    elif status == DUPLICATE_EDGE:
        err = DuplicateEdgeError(f"{edge} already exists (the graph keeps no parallel edges)")
    elif status == SELF_LOOP:
        err = SelfLoopError(f"{edge} is a self-loop (the graph keeps none)")
    elif status == BAD_DIMENSION:
        err = FeatureDimensionError(f"vertex {a}: {b} features, the graph has {num_features}")
    elif status == BAD_X:
        x = enc.x[enc.xrow[i]]
        err = (NonFiniteValueError(f"vertex {a}: features contain NaN or inf")
               if not np.isfinite(x).all() else OutOfRangeError(
                   f"vertex {a}: feature value {x[np.abs(x).argmax()]:.6g} is beyond the "
                   f"limit of +-{limits.features:g}"))
    else:
        err = (NonFiniteValueError(f"{edge}: weight {enc.w[i]} is not finite")
               if not np.isfinite(enc.w[i]) else OutOfRangeError(
                   f"{edge}: weight {enc.w[i]:.6g} is beyond the limit of +-{limits.weights:g}"))
    return err.at(i)


