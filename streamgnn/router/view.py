"""`ReadView`: what the REST API's vertex and neighbor reads serve (every layer's
embedding of every vertex, the labels from the output layer, every vertex's edges),
readable from any thread while the service loop applies the next batch.

The view keeps its own copy of the rows, one table per layer indexed by the engine's
slots (`Engine.index`), and its own id -> slot map. After each batch the loop calls `publish`
with the rows the batch rewrote (`Engine.rewritten`: the engine's own new rows, no
copy) and the vertices it removed: they are published at once as a small *overlay* (one
reference swap) together with the batch number; then the loop copies the overlay into
the tables. A reader takes the current overlay, gathers from the tables and
patches in the overlay's rows: the rows the copy is writing are exactly the ones the
overlay replaces, so a reader sees the state after one batch, whole, and never waits for
the copy or for a batch. Before the copy starts, the loop waits for the readers of the
overlay before (a reader holds one for the microseconds of a gather), whose base would
change under them.

With one partition, edges are read from the engine's own graph under `Engine.graph_lock`
(held by a batch only while it changes the graph); while a batch runs, its change
(`Engine.last_diff`) is taken back for the vertex read, so neighbors show the same state
as the rows. With partitions, edges live with their destinations' owners: the loop asks
them between batches (`engine_neighbors`).

Memory: one copy of every layer's rows at the graph's slot capacity (``nbytes``), an id
map, and one batch's rewritten rows; nothing grows with the number of updates.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from streamgnn.allocator import growable_zeros, lengthened
from streamgnn.errors import InvalidQueryError, UnknownVertexError
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.graph.batch import find_sorted
from streamgnn.graph.idmap import IdMap
from streamgnn.workers import ApplyResult, Engine


class EdgeList(NamedTuple):
    """A vertex's in- or out-neighbors (ids, in no order) and the edges' weights."""

    ids: np.ndarray
    weights: np.ndarray


class Neighbors(NamedTuple):
    """A vertex's in- and out-edges in the state after ``batch`` batches."""

    batch: int
    ins: EdgeList
    outs: EdgeList


class Rows(NamedTuple):
    """Rows of some vertices at ``layer`` (0..L) and their labels, from the state after
    ``batch`` batches."""

    batch: int
    layer: int
    rows: np.ndarray
    labels: np.ndarray


def layer_index(num_layers: int, layer: int) -> int:
    """``layer`` (negative: counted from the last) as 0..``num_layers``, or the
    `InvalidQueryError` naming the layers there are."""
    if not -(num_layers + 1) <= layer <= num_layers:
        raise InvalidQueryError(f"layer {layer}: the model has layers 0..{num_layers} (or "
                                f"-{num_layers + 1}..-1 counting from the last)")
    return layer % (num_layers + 1)


def engine_neighbors(engine: Engine, batch: int, id: int) -> Neighbors:
    """The same answer as `ReadView.neighbors`, from the engine itself (call it between
    two batches, on the loop's thread: the path where the edges live in partitions)."""
    ins = engine.in_edges([id])
    return Neighbors(batch, EdgeList(ins.src, ins.w), EdgeList(*engine.out_edges(id)))


def engine_rows(engine: Engine, batch: int, ids: np.ndarray, layer: int) -> Rows:
    """The same answer as `ReadView.read`, from the engine itself (call it between two
    batches, on the loop's thread: the path where the rows live on MPI ranks)."""
    at = layer_index(engine.num_layers, layer)
    rows = np.ascontiguousarray(engine.lookup(ids, at))
    labels = (rows if at == engine.num_layers else engine.lookup(ids, -1)).argmax(axis=1)
    return Rows(batch, at, rows, labels)


@dataclass(eq=False)
class ViewState:
    """The state after batch ``batch`` as a reader sees it: ``tables`` (rows of every slot,
    per layer) as of the batch before, or already this one where the loop's copy has
    reached, overlaid by what this batch changed: per layer the slots it rewrote
    (``keys``, ascending) and their rows after it (``rows``); the ids it removed and the
    ids it added (or moved to a new slot), both ascending, with the added ids' slots."""

    batch: int
    num_layers: int
    ids: IdMap
    tables: list[np.ndarray]
    keys: list[np.ndarray]
    rows: list[np.ndarray]
    removed: np.ndarray
    added: np.ndarray
    added_slots: np.ndarray
    readers: int = 0

    def read(self, ids: np.ndarray | list[int], layer: int) -> Rows:
        """Rows of ``ids`` at ``layer`` and their labels (argmax of the output layer).
        Raises `UnknownVertexError` naming the first id not in the graph, and
        `InvalidQueryError` for a layer the model lacks."""
        at = layer_index(self.num_layers, layer)
        slots = self._slots(np.atleast_1d(np.asarray(ids, np.int64)))
        rows = self._gather(slots, at)
        last = rows if at == self.num_layers else self._gather(slots, self.num_layers)
        return Rows(self.batch, at, rows, last.argmax(axis=1))

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        slots = self.ids.get(ids).astype(np.int64)
        slots[find_sorted(self.removed, ids)[1]] = -1
        at, hit = find_sorted(self.added, ids)
        slots[hit] = self.added_slots[at[hit]]
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            i = int(missing[0])
            raise UnknownVertexError(f"vertex {ids[i]} is not in the graph", index=i)
        return slots

    def _gather(self, slots: np.ndarray, layer: int) -> np.ndarray:
        out = self.tables[layer][slots]
        at, hit = find_sorted(self.keys[layer], slots)
        out[hit] = self.rows[layer][at[hit]]
        return out


class ReadView:
    """The vertex rows of an engine whose shards run in this process, as of the last
    batch published; `read` from any thread."""

    def __init__(self, engine: Engine, batch: int) -> None:
        """A copy of ``engine``'s rows, the state after ``batch`` batches (call it between
        two batches)."""
        graph = engine.index
        ids, slots = graph.vertex_ids(), graph.vertex_slots()
        self._ids = IdMap(len(graph.ext))
        self._ids.insert(ids, slots)
        tables = []
        for layer in range(engine.num_layers + 1):
            rows = engine.lookup(ids, layer)
            table = growable_zeros((len(graph.ext), rows.shape[1]), rows.dtype)
            table[slots] = rows
            tables.append(table)
        none = np.zeros(0, np.int64)
        self._current = ViewState(batch, engine.num_layers, self._ids, tables,
                                  [none] * len(tables), [t[:0] for t in tables], none, none,
                                  none)
        self._readers = threading.Condition(threading.Lock())
        self._engine = engine
        self._graph_batch = batch  # the batch `neighbors` names ...
        self._graph_diff = engine.last_diff  # ... and the graph's last change it includes

    @property
    def num_layers(self) -> int:
        return self._current.num_layers

    @property
    def nbytes(self) -> int:
        """Bytes of the row tables and the id map (the overlay comes on top: one batch's
        rewritten rows)."""
        return sum(t.nbytes for t in self._current.tables) + self._ids.nbytes

    @contextmanager
    def state(self) -> Iterator[ViewState]:
        """The current state, held: it reads the same until released, whatever the loop
        publishes meanwhile (the loop's next `publish` waits for it before it changes the
        tables: hold it for a read, not longer)."""
        with self._readers:
            state = self._current
            state.readers += 1
        try:
            yield state
        finally:
            with self._readers:
                state.readers -= 1
                if not state.readers:
                    self._readers.notify_all()

    def read(self, ids: np.ndarray | list[int], layer: int) -> Rows:
        """`ViewState.read` of the current state: rows of ``ids`` at ``layer`` and their
        labels, from the state after one batch, which the answer names."""
        with self.state() as state:
            return state.read(ids, layer)

    @property
    def reads_edges(self) -> bool:
        """Whether `neighbors` answers here: the engine keeps its graph in this process
        (one partition); else `engine_neighbors` answers on the loop's thread."""
        return self._engine.graph is not None

    def neighbors(self, id: int) -> Neighbors:
        """In- and out-edges of vertex ``id`` in the state after the last batch published,
        read from the engine's graph while the next batch runs: where that batch already
        changed the graph (`Engine.last_diff`), its change is taken back for the answer.
        Raises `UnknownVertexError` for an id not in that state."""
        engine = self._engine
        with engine.graph_lock:  # the graph does not change meanwhile
            pending = None if engine.last_diff is self._graph_diff else engine.last_diff
            return _neighbors(engine.graph, self._graph_batch, id, pending)

    def publish(self, batch: int, result: ApplyResult, engine: Engine) -> None:
        """Make the state after ``batch`` (whose `ApplyResult` is ``result``) the one
        read; call it on the loop's thread, right after the batch."""
        with engine.graph_lock:
            self._graph_batch, self._graph_diff = batch, engine.last_diff
        graph = engine.index
        keys, rows = (list(side) for side in zip(*engine.rewritten(), strict=True))
        new = keys[0]  # slots of the vertices added, moved or given new features
        added = graph.ext[new[self._ids.get(graph.ext[new]) != new]]
        order = np.argsort(added)
        added, added_slots = added[order], graph.slots(added[order]).astype(np.int64)
        removed = np.sort(result.removed)
        tables = self._current.tables
        if len(graph.ext) > len(tables[0]):  # the graph grew: the tables grow with it
            tables = [lengthened(t, len(graph.ext)) for t in tables]  # (in place mostly)
            self._ids.grow_slots(len(graph.ext))
        state = ViewState(batch, self.num_layers, self._ids, tables, keys, rows, removed,
                          added, added_slots)
        with self._readers:
            before, self._current = self._current, state
            while before.readers:  # their tables are about to change under them
                self._readers.wait()
        for table, slots, layer_rows in zip(tables, keys, rows, strict=True):
            table[slots] = layer_rows
        self._ids.delete(removed)
        self._ids.insert(added, added_slots)


def _neighbors(graph: DynamicGraph, batch: int, id: int, pending: GraphDiff | None
                ) -> Neighbors:
    """Vertex ``id``'s edges in ``graph`` as it was before its ``pending`` change."""
    slot = _slot_before(graph, id, pending)
    ins = _edges_before(graph.in_edges(np.array([slot])), slot, pending, "dst")
    outs = _edges_before(graph.out_edges(np.array([slot])), slot, pending, "src")
    return Neighbors(batch, *(EdgeList(graph.ext[nbr], w) for nbr, w in (ins, outs)))


def _slot_before(graph: DynamicGraph, id: int, pending: GraphDiff | None) -> int:
    """The slot vertex ``id`` had before the ``pending`` change of ``graph`` (which keeps
    the ids of the slots it removed), or `UnknownVertexError`."""
    slot = int(graph.find([id])[0])
    if pending is not None:
        removed = pending.removed[graph.ext[pending.removed] == id]
        if len(removed):
            return int(removed[0])
        if slot >= 0 and np.isin(slot, pending.added):
            slot = -1
    if slot < 0:
        raise UnknownVertexError(f"vertex {id} is not in the graph", index=0)
    return slot


def _edges_before(edges: tuple[np.ndarray, np.ndarray, np.ndarray], slot: int,
                  pending: GraphDiff | None, side: str) -> tuple[np.ndarray, np.ndarray]:
    """One vertex's neighbors (slots) and weights, ``edges`` as the graph holds them now
    (CSR of one vertex), with the ``pending`` change taken back: of the pairs it changed
    at ``slot`` (as ``side``, "src" or "dst"), those present after it leave and those
    present before it come back with their old weights."""
    _, nbr, w = edges
    if pending is not None:
        log = pending.edges
        mine = getattr(log, side) == slot
        other = (log.dst if side == "src" else log.src)[mine]
        before = log.before[mine]
        kept = ~np.isin(nbr, other)
        back = ~np.isnan(before)
        nbr = np.concatenate([nbr[kept], other[back].astype(nbr.dtype)])
        w = np.concatenate([w[kept], before[back].astype(w.dtype)])
    return nbr, w


