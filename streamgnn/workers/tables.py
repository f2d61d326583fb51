"""`Tables`: what a shard keeps per vertex, and reading rows of it. Per layer: the
embeddings h (or the pre-activation z alone, where the layer `Layer.keeps_preactivation`:
h is then activated wherever a row is read), aggregation states with sums' rounding
bounds (drift) and max/min's ties, kept root terms and transforms t; per slot: the
in-degrees the states were built with, which slots are ghosts and who holds the owned
ones; per owned vertex, the predicted labels. Also the tables' capacity (grown with the
graph), their place in memory (2 MB pages on the CPU) and their arrays (what a checkpoint
holds).

Ghosts have rows only in the tables their out-edges read: h (or z) of every layer but the
last, t, the in-degrees. The other tables (a layer's states, rounding bounds, ties and
root terms unless that state is a z that ghosts read; the last layer's h; the labels)
have a row per owned vertex alone, at the vertex's *row* (`Tables.row`, kept here as
vertices come and go): `rows_at` and `own_rows` turn slots into the indices of those
tables, once where a superstep part builds its destinations. Without ghosts a row is its
slot.

Every superstep part reads rows through here (`h_rows`, `t_rows`, `h_table_of`, ...), so
where the tables live is decided here once; the parts keep one structure on the CPU and
on a device, which differ in their kernels (and in `fold`'s CPU-only single kernel).

Owns the tables and row access; must not import kafka or mpi4py, nor the parts of the
shard that compute (superstep, fold, messages, pulls, ghost rows).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from streamgnn.allocator import huge_pages, lengthened
from streamgnn.graph import DynamicGraph
from streamgnn.models.layers import Layer
from streamgnn.models.rowops import merge_rows, take_rows
from streamgnn.models.transfer import numpy_dtype, upload
from streamgnn.npz import prefixed, under
from streamgnn.workers.batch import Step
from streamgnn.workers.slotsets import SlotSets

_PER_LAYER = ("h", "state", "drift", "ties", "root", "t")  # h: layers 0..L, others 1..L
_PER_SLOT = ("ghost", "holders", "ghost_owner")  # None without partitions
_NO_ROW = -1  # `Tables.row` of a slot no owned vertex holds


class Tables:
    """One shard's per-vertex tables and the reads of their rows: those ghosts' out-edges
    read by slot, the others by owned row (`row`; the module's docstring says which).
    ``recent``: the open batch's last superstep, whose rows of h `h_rows` takes as they
    are (None between batches)."""

    def __init__(self, layers: list[Layer], graph: DynamicGraph, hs: list[Tensor],
                 states: list[Tensor | None], device: torch.device, dtype: torch.dtype,
                 ghost: np.ndarray | None = None, holders: np.ndarray | None = None,
                 ghost_owner: np.ndarray | None = None) -> None:
        """``hs``: [h0, ..., hL] of every slot (ghosts' rows included); ``states`` per
        layer, or None (RC) (the tables take both lists over and drop the rows ghosts do
        not need); ``ghost``: which slots are ghosts (None: there are none); ``holders``:
        per slot, a bit per partition holding it as a ghost; ``ghost_owner``: per ghost
        slot, the partition owning it. Max/min's ties start as None (`pulls.keep_ties`
        counts them)."""
        self.layers, self.graph, self.device, self.dtype = layers, graph, device, dtype
        self.sets = SlotSets(len(graph.alive))
        self.ghost = ghost
        self.z = [keeps_z(layer, s) for layer, s in zip(layers, states, strict=True)]
        owned = (None if ghost is None else
                 np.flatnonzero(graph.alive[:graph.num_slots] & ~ghost[:graph.num_slots]))
        self._number_rows(owned)
        keep = None if owned is None else torch.from_numpy(owned).to(hs[-1].device)
        for k, s in enumerate(states, start=1):  # (each original goes once taken)
            if s is not None and keep is not None and self.by_row("state", k):
                states[k - 1] = s.index_select(0, keep)
        self.state = states
        self.drift = [_fresh_drift(layer, s) for layer, s in zip(layers, states, strict=True)]
        if keep is not None and self.by_row("h", len(layers)):
            hs[-1] = hs[-1].index_select(0, keep)
        self.labels = hs[-1].argmax(dim=-1).cpu().numpy()  # predicted class per row
        with torch.inference_mode():
            self.root = [layer.root(h if keep is None else h.index_select(0, keep))
                         if layer.caches_root and s is not None else None
                         for layer, h, s in zip(layers, hs, states, strict=False)]
            self.t = [layer.transform(h) if layer.caches_t and s is not None else None
                      for layer, h, s in zip(layers, hs, states, strict=False)]
        # the tables take the lists over: moved onto huge pages in place, each original
        # table goes as soon as it is copied (a products-like worker's are GBs)
        self.h: list[Tensor | None] = hs
        hs[0] = None  # h[0] lives in the graph
        for k, z in enumerate(self.z, start=1):
            if z:  # its rows are the pre-activation's, activated
                hs[k] = None
        self.in_weight = graph.in_weight.copy()  # in-degrees the states were built with
        self.holders = holders
        self.ghost_owner = ghost_owner
        self._owned: np.ndarray | None = None  # alive & ~ghost, kept up to date
        self.ties: list[Tensor | None] = [None] * len(layers)
        self.reanchor: list[np.ndarray] = []  # per layer; empty: none (`workers.planned`)
        self.recent: Step | None = None

    @classmethod
    def from_arrays(cls, layers: list[Layer], arrays: dict[str, np.ndarray],
                    device: torch.device, dtype: torch.dtype,
                    graph: DynamicGraph | None = None) -> Tables:
        """The tables `arrays` came from; on ``graph`` if given (arrays without one). They
        adopt the arrays, which nothing else may hold. Arrays written before max/min kept
        ties have none (`pulls.keep_ties` counts them); those written before ghosts' rows
        were dropped from the tables by row have them dropped here."""
        tables = cls.__new__(cls)
        tables.layers, tables.device, tables.dtype = layers, device, dtype
        tables.graph = (graph if graph is not None
                        else DynamicGraph.from_arrays(under(arrays, "graph/")))
        tables.sets = SlotSets(len(tables.graph.alive))
        for name in _PER_LAYER:
            setattr(tables, name, [
                None if (a := arrays.get(f"{name}/{k}")) is None
                else torch.from_numpy(a).to(device)
                for k in range(len(layers) + (name == "h"))])
        tables.in_weight = arrays["in_weight"]
        tables.z = [keeps_z(layer, s) for layer, s in zip(layers, tables.state, strict=True)]
        if stale := [k for k, z in enumerate(tables.z, start=1) if z and f"h/{k}" in arrays]:
            raise ValueError(f"these arrays hold layer {stale[0]}'s embeddings beside its "
                             "state: written before sum and mean layers kept their "
                             "pre-activation alone; bootstrap the engine again")
        tables.ghost, tables.holders, tables.ghost_owner = (arrays.get(n) for n in _PER_SLOT)
        tables._owned = None
        if tables.ghost is not None and "row" not in arrays:  # a row per slot in every table
            tables._number_rows(np.flatnonzero(tables.owned[:tables.graph.num_slots]))
            tables._drop_ghost_rows()
        else:
            tables._numbered(arrays.get("row"))
        out = tables.stored(len(layers))
        out = layers[-1].activate(out) if tables.z[-1] else out
        tables.labels = out.argmax(dim=-1).cpu().numpy()
        tables.reanchor = [arrays[f"reanchor/{k}"] for k in range(len(layers))
                           if f"reanchor/{k}" in arrays]
        tables.recent = None
        return tables

    def arrays(self, with_graph: bool = True) -> dict[str, np.ndarray]:
        """The tables as plain arrays: the graph as laid out (``graph/...``, so restored
        tables repeat these bit for bit; left out without ``with_graph``), and per layer k
        its embeddings ``h/k``, aggregation states ``state/k`` with sums' rounding bounds
        ``drift/k`` and max/min's ``ties/k``, kept root terms ``root/k`` and transforms
        ``t/k`` where it keeps them; with ghosts, each slot's row ``row``; the rows a planned
        batch's wear picked to re-anchor in the next, ``reanchor/k``, where there are any."""
        out = prefixed("graph/", self.graph.to_arrays()) if with_graph else {}
        for name in _PER_LAYER:
            for k, rows in enumerate(getattr(self, name)):
                if rows is not None:
                    out[f"{name}/{k}"] = rows.cpu().numpy()
        out["in_weight"] = self.in_weight
        for name in (*_PER_SLOT, "row"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update((f"reanchor/{k}", slots) for k, slots in enumerate(self.reanchor))
        return out

    def on_huge_pages(self) -> None:
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

    def fit_capacity(self) -> None:
        """Grow the tables by slot with the graph, and those by row with the rows in use."""
        self.sets.fit(len(self.graph.alive))
        for name in ("in_weight", *_PER_SLOT):
            old = getattr(self, name)
            if old is not None and len(old) < len(self.graph.in_weight):
                setattr(self, name, lengthened(old, len(self.graph.in_weight)))
        if self.row is not None and len(self.row) < len(self.graph.alive):
            self.row = _extended(self.row, len(self.graph.alive))
        for name in _PER_LAYER:
            tables = getattr(self, name)
            for i, t in enumerate(tables):
                need = self._length(name, i if name == "h" else i + 1)
                if t is not None and len(t) < need:
                    tables[i] = _grown(t, max(need, len(t) * 5 // 4))
        need = self._length("h", len(self.layers))
        if len(self.labels) < need:
            self.labels = lengthened(self.labels, max(need, len(self.labels) * 5 // 4))

    def place(self, removed: np.ndarray, added: np.ndarray) -> None:
        """Rows for the vertices this shard owns among the slots a batch ``added`` (the
        smallest free rows first), those of the slots it ``removed`` freed first; the
        tables by row grown to fit. (Without ghosts a row is its slot: nothing to do.)"""
        if self.row is None:
            return
        gone = self.row[removed]
        gone = gone[gone != _NO_ROW]
        self.row[removed] = _NO_ROW
        if len(gone):
            self.slot_of[gone] = _NO_ROW
            self.free = np.union1d(self.free, gone)
        new = added[self.owned[added]]
        if not len(new):
            return
        reused, self.free = self.free[:len(new)], self.free[len(new):]
        rows = np.concatenate([reused, np.arange(self.rows_used, self.rows_used + len(new)
                                                 - len(reused))])
        self.rows_used += len(new) - len(reused)
        if len(self.slot_of) < self.rows_used:
            self.slot_of = _extended(self.slot_of, max(self.rows_used,
                                                       len(self.slot_of) * 5 // 4))
        self.row[new], self.slot_of[rows] = rows, new
        self.fit_capacity()

    def _number_rows(self, owned: np.ndarray | None) -> None:
        """Rows 0, 1, ... for the ``owned`` slots, in order (None: no ghosts, no rows)."""
        if owned is None:
            self.row = self.slot_of = self.free = None
            self.rows_used = 0
            return
        self.row = np.full(len(self.graph.alive), _NO_ROW, np.int64)
        self.row[owned] = np.arange(len(owned))
        self.slot_of = owned.astype(np.int64)  # per row, its slot (`_NO_ROW`: free)
        self.free = self.slot_of[:0]  # the rows below ``rows_used`` no vertex holds, sorted
        self.rows_used = len(owned)

    def _numbered(self, row: np.ndarray | None) -> None:
        """The rows of a checkpoint's slots ``row`` taken over (None: no ghosts)."""
        self.row = row
        self.slot_of = self.free = None
        self.rows_used = 0
        if row is None:
            return
        held = np.flatnonzero(row != _NO_ROW)
        self.rows_used = int(row[held].max()) + 1 if len(held) else 0
        self.slot_of = np.full(self.rows_used, _NO_ROW, np.int64)
        self.slot_of[row[held]] = held
        self.free = np.flatnonzero(self.slot_of == _NO_ROW)

    def _drop_ghost_rows(self) -> None:
        """Each table by row cut to the rows of the owned slots, from a row per slot."""
        keep = self.slot_of[:self.rows_used]
        for name in _PER_LAYER:
            tables = getattr(self, name)
            for i, t in enumerate(tables):
                if t is not None and self.by_row(name, i if name == "h" else i + 1):
                    tables[i] = t.index_select(0, torch.from_numpy(keep).to(t.device))

    def by_row(self, name: str, layer: int) -> bool:
        """Whether table ``name`` (`_PER_LAYER`) of layer ``layer`` has rows for owned
        vertices alone, by row: with ghosts, the last layer's h, and a layer's states,
        rounding bounds, ties and root terms unless the states are a z ghosts' out-edges
        read (a layer's but the last's)."""
        if self.ghost is None or name == "t":
            return False
        if name == "h":
            return layer == len(self.layers)
        return not (self.z[layer - 1] and layer < len(self.layers))

    def _length(self, name: str, layer: int) -> int:
        """The rows table ``name`` of layer ``layer`` needs now."""
        return self.rows_used if self.by_row(name, layer) else self.graph.num_slots

    def rows_at(self, layer: int, slots: np.ndarray) -> np.ndarray:
        """Where the owned ``slots`` are in layer ``layer``'s states (and its rounding
        bounds, ties and root terms): their rows where those tables are by row, else the
        slots themselves."""
        return self.own_rows(slots) if self.by_row("state", layer) else slots

    def added_rows(self, layer: int, added: np.ndarray) -> np.ndarray:
        """Where layer ``layer``'s states (`rows_at`) have rows of the slots a batch
        ``added``: all of them by slot, the owned ones' by row."""
        if not self.by_row("state", layer):
            return added
        return self.row[added[self.owned[added]]]

    def slots_at(self, layer: int, rows: np.ndarray) -> np.ndarray:
        """The slots at ``rows`` of layer ``layer``'s states (`rows_at`'s inverse)."""
        return self.slot_of[rows] if self.by_row("state", layer) else rows

    def h_at(self, layer: int, slots: np.ndarray) -> np.ndarray:
        """Where the owned ``slots`` are in h^layer as stored (`own_rows` at the last)."""
        return self.own_rows(slots) if self.by_row("h", layer) else slots

    def own_rows(self, slots: np.ndarray) -> np.ndarray:
        """The rows of the owned ``slots`` (in the labels, the last layer's h and the
        states by row): the slots themselves without ghosts."""
        return slots if self.row is None else self.row[slots]

    @property
    def owned(self) -> np.ndarray:
        """Per slot: a live vertex this shard owns."""
        if self.ghost is None:
            return self.graph.alive
        if self._owned is None or len(self._owned) != len(self.graph.alive):
            self._owned = self.graph.alive & ~self.ghost[:len(self.graph.alive)]
        return self._owned

    # ---------------------------------------------------------------- rows
    def stored(self, layer: int) -> Tensor:
        """The table holding layer ``layer`` (1..L) per slot: h, or the pre-activation z
        where the shard keeps that instead (what ghosts are sent)."""
        return self.state[layer - 1] if self.z[layer - 1] else self.h[layer]

    def h_source(self, layer: int, slots: np.ndarray) -> tuple[Tensor, np.ndarray, bool]:
        """Where h^layer of ``slots`` is read: a table, its rows to read, and whether h is
        ReLU of them: `h_table_of`'s table and the slots where there is one, else h of
        the slots, activated here (`h_rows`)."""
        source = self.h_table_of(layer)
        if source is None:
            return self.h_rows_at(layer, slots), np.arange(len(slots)), False
        return source[0], slots, source[1]

    def h_table_of(self, layer: int) -> tuple[Tensor, bool] | None:
        """A table h^layer of every slot is read from, by slot, and whether h is ReLU of
        its rows: the features, h as stored, or z where the shard keeps it and the layer
        activates value by value (`Layer.elementwise`); None where h must be computed."""
        kind = ("identity" if layer == 0 or not self.z[layer - 1]
                else self.layers[layer - 1].elementwise)
        if kind is None:
            return None
        table = torch.from_numpy(self.graph.x) if layer == 0 else self.stored(layer)
        return table, kind == "relu"

    def h_table(self, layer: int) -> Tensor | None:
        """h^layer of every vertex, rows by slot, as stored; for the features (layer 0)
        None unless they are already in the engine's dtype and device."""
        if layer > 0:
            return self.h[layer]  # None where the shard keeps the pre-activation
        return torch.from_numpy(self.graph.x) if self.features_in_place() else None

    def features_in_place(self) -> bool:
        """Whether the features are read where the graph holds them: on the CPU, where
        they are in the engine's dtype."""
        return self.device.type == "cpu" and self.graph.x.dtype == numpy_dtype(self.dtype)

    def t_rows(self, hop: int, layer: Layer, index: Tensor, h: Tensor | None = None
               ) -> Tensor:
        """t of the vertices ``index`` at superstep ``hop``: kept, or transformed from
        their h^(hop-1) (``h``, where the caller read it already)."""
        kept = self.t[hop - 1]
        if kept is None:
            return layer.transform(self.h_rows(hop - 1, index) if h is None else h)
        return kept.index_select(0, index)

    def t_rows_at(self, hop: int, layer: Layer, slots: np.ndarray) -> Tensor:
        """t of the host ``slots`` at superstep ``hop`` (`t_rows`), in one copy: the slots
        as an index, with their features where t is transformed from them."""
        features = self.features_of(hop - 1, slots) if self.t[hop - 1] is None else []
        index, *features = self.upload(slots, *features)
        h = self.h_rows(hop - 1, index, *features) if features else None
        return self.t_rows(hop, layer, index, h)

    def h_rows(self, layer: int, index: Tensor, features: Tensor | None = None) -> Tensor:
        """h^layer of the slots ``index``; ``features``: at layer 0, their rows uploaded
        already (`features_of`; without them ``index`` is read back to take the rows)."""
        if layer == 0:
            if features is not None:
                return self.ours(features)
            rows = self.graph.x.take(index.cpu().numpy(), axis=0)
            return self.ours(torch.from_numpy(rows))
        if self.z[layer - 1]:
            return self._activated(layer, index)
        return self.h[layer].index_select(0, index)

    def _activated(self, layer: int, index: Tensor) -> Tensor:
        """h^layer of the slots ``index`` where the shard keeps z: `Layer.activate` of
        their rows, but for the rows the open batch's last superstep activated (of that
        layer, `Step.activated`), which are taken as they are where the activation has
        products (GIN's would otherwise run again on a few rows; an activation value by
        value costs less than finding them)."""
        activate, z = self.layers[layer - 1].activate, self.state[layer - 1]
        if not index.shape[0]:
            return z.new_empty((0, self.layers[layer - 1].out_dim))
        step = self.recent
        if (step is None or step.hop != layer or step.activated is None
                or self.layers[layer - 1].elementwise is not None):
            return activate(z.index_select(0, index))
        after = step.after
        at = self.sets.find_in_runs(step.activated, len(step.region), index.cpu().numpy())
        missing = np.flatnonzero(at < 0)
        if not len(missing):
            return take_rows(after, at)
        rest = activate(z.index_select(0, index[self.index(missing)]))
        return merge_rows(after, at, rest)

    def features_of(self, layer: int, slots: np.ndarray) -> list[np.ndarray]:
        """What `h_rows` reads of ``slots`` at ``layer`` on the host, for the caller to
        upload with its indices: the features' rows at layer 0, nothing above."""
        return [self.graph.x[slots]] if layer == 0 else []

    def h_rows_at(self, layer: int, slots: np.ndarray) -> Tensor:
        """h^layer of the host ``slots`` (`h_rows`; owned ones at the last layer, read at
        their rows), in one copy: their features' rows at layer 0, an index above."""
        if layer == 0:
            return self.as_rows(self.graph.x[slots])
        if layer == len(self.layers):  # (z there is by row too)
            slots = self.own_rows(slots)
        return self.h_rows(layer, self.index(slots))

    def index(self, slots: np.ndarray) -> Tensor:
        """``slots`` as an index into the tables."""
        return self.upload(slots)[0]

    def upload(self, *arrays: np.ndarray) -> list[Tensor]:
        """``arrays`` on the tables' device in one copy (`transfer.upload`): integer ones as
        indices (int64), others as they are."""
        return upload(self.device, *(a.astype(np.int64) if a.dtype.kind in "iu"
                                     and a.dtype != np.int64 else a for a in arrays))

    def tensor(self, array: np.ndarray) -> Tensor:
        """``array`` on the tables' device."""
        return upload(self.device, array)[0]

    def uploaded(self, **arrays: np.ndarray | None) -> dict[str, Tensor | None]:
        """`upload` of the ``arrays`` given (not None), by name: None for the others, and
        no copy where all are."""
        names = [name for name, a in arrays.items() if a is not None]
        tensors = self.upload(*(arrays[name] for name in names)) if names else []
        return dict.fromkeys(arrays) | dict(zip(names, tensors, strict=True))

    def ours(self, t: Tensor) -> Tensor:
        """``t`` in the engine's dtype and on its device: itself where it is already (a
        `Tensor.to` that changes nothing still costs a dispatch, several a batch)."""
        if t.dtype == self.dtype and t.device == self.device:
            return t
        return t.to(self.device, self.dtype)

    def as_rows(self, array: np.ndarray) -> Tensor:
        """The host rows ``array`` in the engine's dtype and on its device (`no_rows`
        where there are none)."""
        if not len(array):
            return self.no_rows(array.shape[1])[0]
        return self.ours(self.tensor(array))

    def no_rows(self, width: int) -> tuple[Tensor, np.ndarray]:
        """No rows of ``width`` columns in the engine's dtype, on its device and on the
        host: shared (a shard that a batch does not touch makes no tensor)."""
        return _no_rows(width, self.dtype, self.device)


def keeps_z(layer: Layer, state: Tensor | None) -> bool:
    """Whether a shard keeps the layer's pre-activation z as its only table: it keeps a
    state (not RC) and the layer `Layer.keeps_preactivation`."""
    return state is not None and layer.keeps_preactivation


def _fresh_drift(layer: Layer, state: Tensor | None) -> Tensor | None:
    """Rounding bounds of states just computed from all in-neighbors, for aggregations
    whose deltas round (linear ones)."""
    if state is None or not layer.aggr.linear:
        return None
    return layer.aggr.fresh_drift(state)


@functools.cache
def _no_rows(width: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, np.ndarray]:
    rows = torch.empty((0, width), dtype=dtype, device=device)
    return rows, rows.cpu().numpy()


def _extended(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with ``size`` entries, the new ones `_NO_ROW`."""
    out = np.full(size, _NO_ROW, a.dtype)
    out[:len(a)] = a
    return out


def _grown(t: Tensor, size: int) -> Tensor:
    """``t`` with ``size`` rows, the new ones zero: on the CPU in place where its mapping
    has room (`lengthened`), else a copy."""
    if t.device.type == "cpu":
        return torch.from_numpy(lengthened(t.numpy(), size))
    out = t.new_zeros((size, *t.shape[1:]))
    out[:len(t)] = t
    return out
