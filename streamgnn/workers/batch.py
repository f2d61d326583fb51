"""What one batch carries through a shard's supersteps: its net edge changes
(`BatchEdges`), the vertices whose input changed (`Changed`), each superstep's outcome
(`Step`), the open batch itself (`Batch`) and what it changed (`ApplyResult`).

Owns these records only; must not import torch at run time (tensors are named in
annotations alone), kafka or mpi4py, nor any other part of the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from streamgnn.errors import InvalidUpdateError
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.workers.deltas import edge_changes
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.slotsets import SlotSets

if TYPE_CHECKING:
    from torch import Tensor


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
    ``rewritten`` lists per layer 0..L the rows of owned vertices the batch wrote, as
    (the shard's slots ascending, rows) (a shard's own report, empty from MPI ranks:
    `Engine.rewritten` merges them; the supersteps' rows stay tensors where they were
    computed until the batch's end reads them all back in one copy), and ``removed``
    the ids the batch deleted (engine only)."""

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
    released: tuple[np.ndarray, np.ndarray] | None = None  # a partition's ghosts let go
    edges_added: int = 0  # net, into a partition's vertices

    def record_step(self, region: np.ndarray, rows: Tensor, recomputed: int = 0,
                    pulled: int = 0, pulled_columns: int = 0, remote_reads: int = 0,
                    combined_messages: int = 0) -> None:
        """Count a superstep and list the rows it rewrote (``rows`` of the slots
        ``region``); a superstep whose messages reach no vertex counts 0 everywhere."""
        self.recomputed.append(recomputed)
        self.pulled.append(pulled)
        self.pulled_columns.append(pulled_columns)
        self.remote_reads.append(remote_reads)
        self.combined_messages.append(combined_messages)
        self.rewritten.append((region, rows))


@dataclass
class Changed:
    """Vertices whose h^{l-1} changed in this batch, and the old rows of those that had
    one (vertices the batch added have none), in blocks (copied together once, where the
    superstep transforms them)."""

    slots: np.ndarray
    old_slots: np.ndarray
    old_rows: list[Tensor]


@dataclass
class Step:
    """Superstep ``hop``'s outcome: the recomputed ``region`` and its new rows ``after``;
    ``fresh`` marks region vertices the batch added, ``moved`` those whose row changed
    (fresh ones included) and ``old_rows`` the rows replaced of those moved and not fresh
    (none at the last layer, whose old rows only mattered for labels: the shard keeps
    those); ``finite``: every new row is. Where the shard keeps the pre-activation,
    ``activated`` are the slots whose rows of h the superstep activated, the region's
    first (both runs ascending), and ``after`` has a row for each (the next superstep
    reads them)."""

    hop: int
    region: np.ndarray
    after: Tensor
    fresh: np.ndarray
    moved: np.ndarray
    old_rows: Tensor
    finite: bool = True
    activated: np.ndarray | None = None

    def changed(self) -> Changed:
        """The vertices whose embedding really changed: the next superstep's sources."""
        if not len(self.region):
            return Changed(self.region, self.region, [self.old_rows])
        return Changed(self.region[self.moved], self.region[self.moved & ~self.fresh],
                       [self.old_rows])


@dataclass
class BatchEdges:
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

    @classmethod
    def of(cls, graph: DynamicGraph, diff: GraphDiff, sets: SlotSets) -> BatchEdges:
        """The edge changes of ``diff``, which the batch made on ``graph``."""
        e = diff.edges
        if not len(e.src):  # (what the kernel returns for none, without the call)
            slots, flags = np.zeros(0, np.int64), np.zeros(0, bool)
            return cls(slots, slots, e.before, e.after, flags, flags, *[slots] * 5)
        return cls(*edge_changes(e.src, e.dst, e.before, e.after, graph.alive,
                                 graph.in_degree, sets.mark, sets.scratch))


@dataclass
class Batch:
    """What one batch carries from superstep to superstep."""

    edges: BatchEdges
    added: np.ndarray
    removed: np.ndarray
    removed_rows: Tensor
    changed: Changed
    result: ApplyResult
    subscribed: np.ndarray   # owned slots another partition now holds as ghosts
    subscribers: np.ndarray  # ... and that partition

    def added_among(self, slots: np.ndarray, sets: SlotSets) -> np.ndarray:
        """Which of ``slots`` the batch added (a lookup costing what the batch does, not a
        mask over every slot)."""
        if not len(self.added):  # most small batches add no vertex
            return np.zeros(len(slots), bool)
        return sets.find(self.added, slots) >= 0
