"""`DynamicGraph`: the mutable directed graph keyed by external ids: vertex slots, features,
in- and out-adjacency with weights, degrees, and atomic batches of the six update types.

Policy (what PyG computes on the exported graph): the graph is simple. A self-loop or a
second edge between the same ordered pair is rejected; layers that add self-loops (GCN,
GAT) add them themselves, as PyG does. Deleting a vertex deletes its edges.

Owns graph state only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from streamgnn.datasets.graph_data import GraphData
from streamgnn.errors import (
    DuplicateEdgeError,
    DuplicateVertexError,
    FeatureDimensionError,
    InvalidUpdateError,
    NonFiniteValueError,
    SelfLoopError,
    UnknownEdgeError,
    UnknownVertexError,
)
from streamgnn.graph.adjacency import Adjacency
from streamgnn.graph.idmap import IdMap
from streamgnn.updates import (
    AddEdge,
    AddVertex,
    DeleteEdge,
    DeleteVertex,
    Update,
    UpdateFeatures,
)

Undo = Callable[[], None]


@dataclass
class EdgeLog:
    """Edge changes in slots: weight ``before``/``after``, NaN where the edge is absent."""

    src: np.ndarray
    dst: np.ndarray
    before: np.ndarray
    after: np.ndarray

    @staticmethod
    def concat(logs: Sequence[EdgeLog]) -> EdgeLog:
        if not logs:
            e = np.empty(0, np.int32)
            f = np.empty(0, np.float32)
            return EdgeLog(e, e, f, f)
        return EdgeLog(*(np.concatenate([getattr(g, k) for g in logs])
                         for k in ("src", "dst", "before", "after")))


@dataclass
class GraphDiff:
    """The net effect of one batch, in internal slots.

    ``edges`` holds each ordered pair whose weight or presence differs before vs after the
    batch. ``added``/``removed`` are vertices alive only after/only before it (``removed_x``
    their last features); ``changed`` are vertices alive throughout whose features changed,
    with ``changed_x_before``."""

    edges: EdgeLog
    added: np.ndarray
    removed: np.ndarray
    removed_x: np.ndarray
    changed: np.ndarray
    changed_x_before: np.ndarray


class DynamicGraph:
    """A simple directed graph with float32 features and edge weights, keyed by int64 ids."""

    def __init__(self, num_features: int, vertex_capacity: int = 1024) -> None:
        self.num_features = num_features
        self._ids = IdMap(2 * vertex_capacity)
        self.ext = np.zeros(vertex_capacity, np.int64)
        self.alive = np.zeros(vertex_capacity, bool)
        self.x = np.zeros((vertex_capacity, num_features), np.float32)
        self.in_weight = np.zeros(vertex_capacity, np.float64)
        self.out = Adjacency(vertex_capacity)
        self.inn = Adjacency(vertex_capacity)
        self.num_slots = 0           # slots ever handed out (high-water mark)
        self._free: list[int] = []   # reusable slots
        self._limbo: list[int] = []  # slots deleted in the open batch, reusable after it

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_data(cls, data: GraphData) -> DynamicGraph:
        """Bulk load a snapshot; slot i holds ``data.ids[i]``."""
        n = data.num_vertices
        g = cls(data.num_features, vertex_capacity=max(n, 16))
        g._ids.insert(data.ids, np.arange(n, dtype=np.int32))
        g.ext[:n] = data.ids
        g.alive[:n] = True
        g.x[:n] = data.x
        g.num_slots = n
        s = data.positions(data.src).astype(np.int32)
        d = data.positions(data.dst).astype(np.int32)
        by_src = np.argsort(s, kind="stable")
        by_dst = np.argsort(d, kind="stable")
        g.out = Adjacency.from_sorted(len(g.ext), s[by_src], d[by_src], data.weight[by_src])
        g.inn = Adjacency.from_sorted(len(g.ext), d[by_dst], s[by_dst], data.weight[by_dst])
        g.in_weight[:n] = np.bincount(d, weights=data.weight, minlength=n)
        return g

    # ---------------------------------------------------------------- queries
    @property
    def num_vertices(self) -> int:
        return len(self._ids)

    @property
    def num_edges(self) -> int:
        return self.out.num_edges

    @property
    def in_degree(self) -> np.ndarray:
        return self.inn.deg

    @property
    def out_degree(self) -> np.ndarray:
        return self.out.deg

    def slots(self, ext) -> np.ndarray:
        """Internal slot of each external id; raises UnknownVertexError naming the first
        unknown one (``index`` is its position)."""
        slots = self._ids.get(np.atleast_1d(np.asarray(ext, np.int64)))
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            i = int(missing[0])
            bad = int(np.atleast_1d(ext)[i])
            raise UnknownVertexError(f"vertex {bad} is not in the graph", index=i)
        return slots

    def contains(self, ext) -> np.ndarray:
        return self._ids.get(np.atleast_1d(np.asarray(ext, np.int64))) >= 0

    def vertex_slots(self) -> np.ndarray:
        """Slots of the live vertices, ascending."""
        return np.flatnonzero(self.alive[:self.num_slots])

    def vertex_ids(self) -> np.ndarray:
        return self.ext[self.vertex_slots()]

    def edge_slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All edges as (src slot, dst slot, weight), grouped by source."""
        v = self.vertex_slots()
        ptr, dst, w = self.out.gather(v)
        src = np.repeat(v.astype(np.int32), np.diff(ptr))
        return src, dst, w

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All edges as (src id, dst id, weight)."""
        s, d, w = self.edge_slots()
        return self.ext[s], self.ext[d], w

    def has_edges(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> np.ndarray:
        return self._positions(src_slots, dst_slots) >= 0

    def in_edges(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, src slots, weights) of the in-edges of ``vertices``, CSR-style."""
        return self.inn.gather(vertices)

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
            "id_map": self._ids.nbytes + self.ext.nbytes + self.alive.nbytes,
            "out_adjacency": self.out.nbytes,
            "in_adjacency": self.inn.nbytes,
            "degrees": self.in_weight.nbytes,
        }
        parts["structure"] = sum(parts.values())
        parts["features"] = self.x.nbytes
        return parts

    # ---------------------------------------------------------------- batches
    def apply(self, batch: Sequence[Update]) -> GraphDiff:
        """Apply ``batch`` in order, atomically: on a bad update, everything the batch did is
        undone and the error (``index`` = the update's position) is raised."""
        undo: list[Undo] = []
        logs: list[EdgeLog] = []
        added: list[np.ndarray] = []
        removed: list[tuple[np.ndarray, np.ndarray]] = []
        changed: list[tuple[np.ndarray, np.ndarray]] = []
        try:
            for start, run in _runs(batch):
                try:
                    self._apply_run(run, undo, logs, added, removed, changed)
                except InvalidUpdateError as err:
                    raise err.at(start + (err.index or 0)) from None
        except BaseException:
            for step in reversed(undo):
                step()
            self._release()
            raise
        self._release()
        return self._net(logs, added, removed, changed)

    def _apply_run(self, run, undo, logs, added, removed, changed) -> None:
        kind = type(run[0])
        if kind is AddVertex:
            ids = np.array([u.id for u in run], np.int64)
            slots = self.add_vertices(ids, self._feature_rows(run, ids))
            added.append(slots)
            undo.append(lambda: self._drop_new_vertices(slots))
        elif kind is DeleteVertex:
            ids = np.array([u.id for u in run], np.int64)
            slots, x_old, log = self.delete_vertices(ids)
            logs.append(log)
            removed.append((slots, x_old))
            undo.append(lambda: self._restore_vertices(ids, slots, log))
        elif kind is UpdateFeatures:
            ids = np.array([u.id for u in run], np.int64)
            slots, x_old = self.update_features(ids, self._feature_rows(run, ids))
            changed.append((slots, x_old))
            undo.append(lambda: self.x.__setitem__(slots, x_old))
        else:
            src = np.array([u.src for u in run], np.int64)
            dst = np.array([u.dst for u in run], np.int64)
            if kind is AddEdge:
                log = self.add_edges(src, dst, np.array([u.weight for u in run], np.float32))
            elif kind is DeleteEdge:
                log = self.delete_edges(src, dst)
            else:
                log = self.update_edges(src, dst, np.array([u.weight for u in run], np.float32))
            logs.append(log)
            undo.append(lambda: self._revert_edges(log))

    def _feature_rows(self, run, ids: np.ndarray) -> np.ndarray:
        d = self.num_features
        for i, u in enumerate(run):
            if len(u.x) != d:
                raise FeatureDimensionError(
                    f"vertex {u.id}: {len(u.x)} features, the graph has {d}", index=i)
        return np.array([u.x for u in run], np.float32).reshape(len(run), d)

    # ---------------------------------------------------------------- vertex operations
    def add_vertices(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Add new vertices with features; returns their slots."""
        ids = np.asarray(ids, np.int64)
        x = self._check_features(ids, x)
        first_dup = _first_repeat(ids)
        if first_dup is not None:
            raise DuplicateVertexError(f"vertex {ids[first_dup]} is added twice", index=first_dup)
        exists = np.flatnonzero(self._ids.get(ids) >= 0)
        if len(exists):
            i = int(exists[0])
            raise DuplicateVertexError(f"vertex {ids[i]} already exists", index=i)
        slots = self._take_slots(len(ids))
        self._ids.insert(ids, slots)
        self.ext[slots] = ids
        self.alive[slots] = True
        self.x[slots] = x
        self.in_weight[slots] = 0.0
        return slots

    def delete_vertices(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, EdgeLog]:
        """Delete vertices and their edges; returns (slots, old features, removed edges)."""
        ids = np.asarray(ids, np.int64)
        first_dup = _first_repeat(ids)
        if first_dup is not None:
            raise UnknownVertexError(f"vertex {ids[first_dup]} is deleted twice", index=first_dup)
        slots = self.slots(ids)
        going = np.zeros(len(self.alive), bool)
        going[slots] = True
        optr, odst, _ = self.out.gather(slots)
        osrc = np.repeat(slots, np.diff(optr))
        iptr, isrc, _ = self.inn.gather(slots)
        idst = np.repeat(slots, np.diff(iptr))
        keep = ~going[isrc]  # edges between two deleted vertices are in the out-lists already
        log = self._remove_edges(np.concatenate([osrc, isrc[keep]]),
                                 np.concatenate([odst, idst[keep]]))
        self.out.clear(slots)
        self.inn.clear(slots)
        self._ids.remove(ids)
        self.alive[slots] = False
        self._limbo.extend(slots.tolist())
        return slots, self.x[slots].copy(), log

    def update_features(self, ids: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Replace features (the last row wins for a repeated id); returns (slots, old rows)."""
        ids = np.asarray(ids, np.int64)
        x = self._check_features(ids, x)
        slots = self.slots(ids)
        last = _last_occurrences(slots)
        slots, x = slots[last], x[last]
        old = self.x[slots].copy()
        self.x[slots] = x
        return slots, old

    # ---------------------------------------------------------------- edge operations
    def add_edges(self, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> EdgeLog:
        s, d = self._edge_slots(src, dst)
        w = self._check_weights(src, dst, w)
        loops = np.flatnonzero(s == d)
        if len(loops):
            i = int(loops[0])
            raise SelfLoopError(f"edge ({src[i]}, {dst[i]}) is a self-loop", index=i)
        first_dup = _first_repeat(_pair_keys(s, d))
        if first_dup is not None:
            i = first_dup
            raise DuplicateEdgeError(f"edge ({src[i]}, {dst[i]}) is added twice", index=i)
        exists = np.flatnonzero(self._positions(s, d) >= 0)
        if len(exists):
            i = int(exists[0])
            raise DuplicateEdgeError(f"edge ({src[i]}, {dst[i]}) already exists", index=i)
        self._insert_edges(s, d, w)
        return EdgeLog(s, d, np.full(len(s), np.nan, np.float32), w)

    def delete_edges(self, src: np.ndarray, dst: np.ndarray) -> EdgeLog:
        s, d = self._edge_slots(src, dst)
        first_dup = _first_repeat(_pair_keys(s, d))
        if first_dup is not None:
            i = first_dup
            raise UnknownEdgeError(f"edge ({src[i]}, {dst[i]}) is deleted twice", index=i)
        self._require_edges(src, dst, s, d)
        return self._remove_edges(s, d)

    def update_edges(self, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> EdgeLog:
        """Set weights (the last wins for a repeated pair)."""
        s, d = self._edge_slots(src, dst)
        w = self._check_weights(src, dst, w)
        pos = self._require_edges(src, dst, s, d)
        last = _last_occurrences(_pair_keys(s, d))
        s, d, w, pos = s[last], d[last], w[last], pos[last]
        before = self._weights_at(s, d, pos)
        self.out.set_weights(s, d, w)
        self.inn.set_weights(d, s, w)
        self._refresh_in_weight(d)
        return EdgeLog(s, d, before, w)

    # ---------------------------------------------------------------- internals
    def _check_features(self, ids: np.ndarray, x) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape != (len(ids), self.num_features):
            raise FeatureDimensionError(
                f"features of shape {x.shape} for {len(ids)} vertices; the graph has "
                f"{self.num_features} features", index=0)
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if len(bad):
            i = int(bad[0])
            raise NonFiniteValueError(f"vertex {ids[i]}: features contain NaN or inf", index=i)
        return x

    def _check_weights(self, src, dst, w) -> np.ndarray:
        w = np.asarray(w, np.float32).reshape(len(src))
        bad = np.flatnonzero(~np.isfinite(w))
        if len(bad):
            i = int(bad[0])
            raise NonFiniteValueError(
                f"edge ({src[i]}, {dst[i]}): weight {w[i]} is not finite", index=i)
        return w

    def _edge_slots(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        s, d = self._ids.get(src), self._ids.get(dst)
        bad = np.flatnonzero((s < 0) | (d < 0))
        if len(bad):
            i = int(bad[0])
            missing = src[i] if s[i] < 0 else dst[i]
            raise UnknownVertexError(
                f"edge ({src[i]}, {dst[i]}): vertex {missing} is not in the graph", index=i)
        return s, d

    def _positions(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Position in the out-arrays of each edge s -> d, -1 where absent."""
        return self.out.find(np.ascontiguousarray(s, np.int32), np.ascontiguousarray(d, np.int32))

    def _require_edges(self, src, dst, s, d) -> np.ndarray:
        pos = self._positions(s, d)
        missing = np.flatnonzero(pos < 0)
        if len(missing):
            i = int(missing[0])
            raise UnknownEdgeError(f"edge ({src[i]}, {dst[i]}) is not in the graph", index=i)
        return pos

    def _weights_at(self, s, d, pos=None) -> np.ndarray:
        return self.out.w[self._positions(s, d) if pos is None else pos].copy()

    def _insert_edges(self, s, d, w) -> None:
        self.out.insert(s, d, w)
        self.inn.insert(d, s, w)
        self._refresh_in_weight(d)

    def _remove_edges(self, s, d) -> EdgeLog:
        s = np.ascontiguousarray(s, np.int32)
        d = np.ascontiguousarray(d, np.int32)
        before = self._weights_at(s, d)
        self.out.remove(s, d)
        self.inn.remove(d, s)
        self._refresh_in_weight(d)
        return EdgeLog(s, d, before, np.full(len(s), np.nan, np.float32))

    def _refresh_in_weight(self, vertices: np.ndarray) -> None:
        v = np.unique(vertices)
        self.in_weight[v] = self.inn.weight_sums(v)

    def _revert_edges(self, log: EdgeLog) -> None:
        was, now = ~np.isnan(log.before), ~np.isnan(log.after)
        if (now & ~was).any():
            self._remove_edges(log.src[now & ~was], log.dst[now & ~was])
        both = was & now
        if both.any():
            s, d, w = log.src[both], log.dst[both], log.before[both]
            self.out.set_weights(s, d, w)
            self.inn.set_weights(d, s, w)
            self._refresh_in_weight(d)
        if (was & ~now).any():
            self._insert_edges(log.src[was & ~now], log.dst[was & ~now], log.before[was & ~now])

    def _drop_new_vertices(self, slots: np.ndarray) -> None:
        self._ids.remove(self.ext[slots])
        self.alive[slots] = False
        self._free.extend(slots.tolist())

    def _restore_vertices(self, ids: np.ndarray, slots: np.ndarray, log: EdgeLog) -> None:
        taken = set(slots.tolist())
        self._limbo = [v for v in self._limbo if v not in taken]
        self._ids.insert(ids, slots)
        self.alive[slots] = True
        self._revert_edges(log)

    def _take_slots(self, k: int) -> np.ndarray:
        reuse = [self._free.pop() for _ in range(min(k, len(self._free)))]
        fresh = k - len(reuse)
        if self.num_slots + fresh > len(self.ext):
            self._grow(max(2 * len(self.ext), self.num_slots + fresh))
        slots = np.array(reuse + list(range(self.num_slots, self.num_slots + fresh)), np.int32)
        self.num_slots += fresh
        return slots

    def _grow(self, capacity: int) -> None:
        for name in ("ext", "alive", "in_weight", "x"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)
        self.out.grow_vertices(capacity)
        self.inn.grow_vertices(capacity)

    def _release(self) -> None:
        self._free.extend(self._limbo)
        self._limbo = []

    def _net(self, logs, added, removed, changed) -> GraphDiff:
        log = EdgeLog.concat(logs)
        key = _pair_keys(log.src, log.dst)
        _, first = np.unique(key, return_index=True)
        last = _last_occurrences(key)
        last = last[np.argsort(key[last], kind="stable")]
        before, after = log.before[first], log.after[last]
        differs = ~((before == after) | (np.isnan(before) & np.isnan(after)))
        pick = first[differs]
        edges = EdgeLog(log.src[pick], log.dst[pick], before[differs], after[differs])

        empty_x = np.empty((0, self.num_features), np.float32)
        new = np.concatenate(added) if added else np.empty(0, np.int32)
        gone = np.concatenate([s for s, _ in removed]) if removed else np.empty(0, np.int32)
        gone_x = np.concatenate([x for _, x in removed]) if removed else empty_x
        ch = np.concatenate([s for s, _ in changed]) if changed else np.empty(0, np.int32)
        ch_x = np.concatenate([x for _, x in changed]) if changed else empty_x
        _, first_ch = np.unique(ch, return_index=True)
        ch, ch_x = ch[first_ch], ch_x[first_ch]

        # Features from before the batch for removed vertices updated earlier in it.
        updated_first = np.isin(gone, ch)
        gone_x[updated_first] = ch_x[np.searchsorted(ch, gone[updated_first])]
        born_here = np.isin(gone, new)
        gone, gone_x = gone[~born_here], gone_x[~born_here]
        new = new[self.alive[new]]
        stayed = ~np.isin(ch, new) & self.alive[ch]
        return GraphDiff(edges, new, gone, gone_x, ch[stayed], ch_x[stayed])


def _runs(batch: Sequence[Update]):
    """Maximal runs of consecutive updates of one type: (start index, list)."""
    start = 0
    for i in range(1, len(batch) + 1):
        if i == len(batch) or type(batch[i]) is not type(batch[start]):
            yield start, batch[start:i]
            start = i


def _pair_keys(s: np.ndarray, d: np.ndarray) -> np.ndarray:
    return (np.asarray(s, np.int64) << 32) | np.asarray(d, np.int64)


def _first_repeat(keys: np.ndarray) -> int | None:
    """Position of the first element equal to an earlier one, or None."""
    _, first = np.unique(keys, return_index=True)
    if len(first) == len(keys):
        return None
    seen = np.zeros(len(keys), bool)
    seen[first] = True
    return int(np.flatnonzero(~seen)[0])


def _last_occurrences(keys: np.ndarray) -> np.ndarray:
    """Positions of the last occurrence of each distinct key, ascending."""
    _, first_rev = np.unique(np.asarray(keys)[::-1], return_index=True)
    return np.sort(len(keys) - 1 - first_rev)
