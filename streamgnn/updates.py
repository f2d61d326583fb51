"""The six graph-update types: the vocabulary shared by the graph store, the engine,
the router and the Kafka streams (which carry them as JSON); and `UpdateBatch`, a batch of
them in columns.

Pydantic and numpy; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

VertexId = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
"""An external vertex id: any int64."""


@dataclass(frozen=True)
class ValueLimits:
    """The largest feature value and edge weight (in absolute value) the graph accepts.
    The engine keeps states in float64 and embeddings in float32; past about 1e9 for
    |weight x feature|, cancellation in a long chain of deltas would leave errors above the
    exactness contract's 1e-4 (measured: README, "Reliability"), so larger values are
    rejected (`OutOfRangeError`, dead letter ``out_of_range``) rather than silently
    corrupting the state. Raise them only for models and data you have checked."""

    features: float = 1e6
    weights: float = 1e3


CHECKED = ValueLimits(float("inf"), float("inf"))  # for data the engine already checked


class _Update(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str | None = None
    """Set by producers on the stream (dead letters and label changes name it)."""
    event_time: float | None = None
    """When the event happened, seconds since the epoch (end-to-end latency starts here)."""


class AddEdge(_Update):
    op: Literal["add_edge"] = "add_edge"
    src: VertexId
    dst: VertexId
    weight: float = 1.0


class DeleteEdge(_Update):
    op: Literal["delete_edge"] = "delete_edge"
    src: VertexId
    dst: VertexId


class UpdateEdge(_Update):
    op: Literal["update_edge"] = "update_edge"
    src: VertexId
    dst: VertexId
    weight: float


class AddVertex(_Update):
    op: Literal["add_vertex"] = "add_vertex"
    id: VertexId
    x: list[float]


class DeleteVertex(_Update):
    op: Literal["delete_vertex"] = "delete_vertex"
    id: VertexId


class UpdateFeatures(_Update):
    op: Literal["update_features"] = "update_features"
    id: VertexId
    x: list[float]


Update = Annotated[
    AddEdge | DeleteEdge | UpdateEdge | AddVertex | DeleteVertex | UpdateFeatures,
    Field(discriminator="op"),
]
"""Any one of the six update types, discriminated by ``op``."""

UPDATE_ADAPTER: TypeAdapter[Update] = TypeAdapter(Update)
EDGE_UPDATES = (AddEdge, DeleteEdge, UpdateEdge)
VERTEX_UPDATES = (AddVertex, DeleteVertex, UpdateFeatures)

UPDATE_TYPES = (AddEdge, DeleteEdge, UpdateEdge, AddVertex, DeleteVertex, UpdateFeatures)
"""Op codes: an update type's position here (edge updates first)."""
OP_CODES = {cls: code for code, cls in enumerate(UPDATE_TYPES)}
OP_NAMES = tuple(cls.model_fields["op"].default for cls in UPDATE_TYPES)
"""Each op code's ``op`` string."""
ADD_EDGE, DELETE_EDGE, UPDATE_EDGE, ADD_VERTEX, DELETE_VERTEX, UPDATE_FEATURES = range(6)
NO_X, BAD_WIDTH = -1, -2  # xrow of an update without features / with the wrong number


@dataclass(frozen=True)
class UpdateBatch:
    """A batch of updates in columns, the form the graph's batch kernel reads; accepted
    wherever a list of updates is (``engine.apply``, ``graph.apply``), so a producer that
    has arrays skips building an object per update.

    Row i is update i: ``op`` its code (`OP_CODES`), ``src`` an edge update's source or a
    vertex update's vertex, ``dst`` an edge update's destination, ``w`` the weight
    (add/update edge), ``xrow`` the row of ``x`` [k, num_features] holding its features
    (add_vertex/update_features; ``NO_X`` otherwise, ``BAD_WIDTH`` for a vector of the
    wrong length, whose length is then in ``dst``). Columns that do not apply to an update
    are ignored. (A columns message on Kafka names ``src`` and ``dst`` ``a`` and ``b``.)"""

    op: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    xrow: np.ndarray
    x: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.op)
        for name, dtype in (("op", np.int64), ("src", np.int64), ("dst", np.int64),
                            ("w", np.float32), ("xrow", np.int64)):
            given = np.asarray(getattr(self, name))
            if dtype is np.int64 and given.size and given.dtype.kind not in "iu":
                raise ValueError(f"UpdateBatch.{name} must hold integers, not {given.dtype}")
            column = np.ascontiguousarray(given, dtype)
            if column.shape != (n,):
                raise ValueError(f"UpdateBatch.{name} has shape {column.shape}, op has ({n},)")
            object.__setattr__(self, name, column)
        x = np.ascontiguousarray(self.x, np.float32)
        if x.ndim != 2:
            raise ValueError(f"UpdateBatch.x must be 2-D, not of shape {x.shape}")
        object.__setattr__(self, "x", x)
        if n and not (self.op.min() >= 0 and self.op.max() < len(UPDATE_TYPES)):
            raise ValueError(f"UpdateBatch.op holds codes outside 0..{len(UPDATE_TYPES) - 1}")
        object.__setattr__(self, "op", self.op.astype(np.int8))
        featured = (self.op == ADD_VERTEX) | (self.op == UPDATE_FEATURES)
        rows = self.xrow[featured]
        if ((rows < BAD_WIDTH) | (rows >= len(x)) | (rows == NO_X)).any():
            raise ValueError("UpdateBatch.xrow: every add_vertex/update_features needs a row "
                             f"of x (0..{len(x) - 1}) or BAD_WIDTH")

    @classmethod
    def unchecked(cls, op: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                  xrow: np.ndarray, x: np.ndarray) -> UpdateBatch:
        """A batch of columns already as the checks leave them (int8 ``op``; int64 ``src``,
        ``dst``, ``xrow``; float32 ``w`` and 2-D ``x``; contiguous) and valid, taken as
        they are: for the coordinator splitting a batch its graph accepted."""
        batch = object.__new__(cls)
        batch.__dict__.update(op=op, src=src, dst=dst, w=w, xrow=xrow, x=x)  # frozen: no setattr
        return batch

    @classmethod
    def from_updates(cls, updates: Sequence[Update], num_features: int) -> UpdateBatch:
        """The columns of ``updates``; feature vectors not ``num_features`` long are marked
        ``BAD_WIDTH`` (the graph rejects them by index)."""
        n = len(updates)
        op = np.fromiter((OP_CODES[type(u)] for u in updates), np.int8, n)
        src, dst = np.zeros(n, np.int64), np.zeros(n, np.int64)
        w, xrow = np.zeros(n, np.float32), np.full(n, NO_X, np.int64)
        rows: list[list[float]] = []
        for i, u in enumerate(updates):
            if op[i] <= UPDATE_EDGE:
                src[i], dst[i] = u.src, u.dst
                if op[i] != DELETE_EDGE:
                    w[i] = u.weight
                continue
            src[i] = u.id
            if op[i] != DELETE_VERTEX:
                if len(u.x) == num_features:
                    xrow[i] = len(rows)
                    rows.append(u.x)
                else:
                    xrow[i], dst[i] = BAD_WIDTH, len(u.x)
        x = np.array(rows, np.float32).reshape(len(rows), num_features)
        return cls(op, src, dst, w, xrow, x)

    @classmethod
    def concat(cls, parts: Sequence[UpdateBatch]) -> UpdateBatch:
        """``parts`` (at least one, their features equally wide) as one batch, in order."""
        firsts = np.cumsum([0] + [len(p.x) for p in parts[:-1]])
        return cls(*(np.concatenate([getattr(p, name) for p in parts])
                     for name in ("op", "src", "dst", "w")),
                   np.concatenate([np.where(p.xrow >= 0, p.xrow + first, p.xrow)
                                   for p, first in zip(parts, firsts, strict=True)]),
                   np.concatenate([p.x for p in parts]))

    def __getitem__(self, rows: slice | np.ndarray) -> UpdateBatch:
        """The updates at ``rows`` (a slice, or positions), in that order (taken as they
        are: they passed the checks)."""
        xrow = self.xrow[rows]
        featured = xrow >= 0
        taken = self.x[xrow[featured]]
        xrow = xrow.copy()
        xrow[featured] = np.arange(len(taken))
        column = np.ascontiguousarray
        return UpdateBatch.unchecked(column(self.op[rows]), column(self.src[rows]),
                                     column(self.dst[rows]), column(self.w[rows]), xrow, taken)

    def update(self, i: int, event_id: str | None = None,
               event_time: float | None = None) -> Update:
        """Update ``i`` as an object (not for a ``BAD_WIDTH`` one: its features are gone)."""
        code, a, b = int(self.op[i]), int(self.src[i]), int(self.dst[i])
        kind, meta = UPDATE_TYPES[code], {"event_id": event_id, "event_time": event_time}
        if code == DELETE_EDGE:
            return kind(src=a, dst=b, **meta)
        if code <= UPDATE_EDGE:
            return kind(src=a, dst=b, weight=float(self.w[i]), **meta)
        if code == DELETE_VERTEX:
            return kind(id=a, **meta)
        return kind(id=a, x=self.x[self.xrow[i]].tolist(), **meta)

    def __len__(self) -> int:
        return len(self.op)

    def counts(self) -> np.ndarray:
        """Updates per op code."""
        return np.bincount(self.op, minlength=len(UPDATE_TYPES))

    def with_width(self, num_features: int) -> UpdateBatch:
        """This batch for a graph of ``num_features``: if ``x`` is not that wide, every
        feature vector is marked ``BAD_WIDTH``."""
        if self.x.shape[1] == num_features:
            return self
        bad = self.xrow >= 0
        return UpdateBatch(self.op, self.src, np.where(bad, self.x.shape[1], self.dst), self.w,
                           np.where(bad, BAD_WIDTH, self.xrow),
                           np.zeros((0, num_features), np.float32))
