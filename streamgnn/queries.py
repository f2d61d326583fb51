"""Query requests: new vertices with features and their edges into the existing graph, to be
labelled from the current embeddings (DESIGN.md "Query serving"); the vocabulary shared by
the engine (`Engine.query`), the ``query-requests`` topic and the REST API; and
`QueryColumns`, a request checked and laid out in arrays.

Pydantic and numpy; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from streamgnn.errors import (
    DuplicateEdgeError,
    DuplicateVertexError,
    FeatureDimensionError,
    InvalidQueryError,
    NonFiniteValueError,
    OutOfRangeError,
    SelfLoopError,
)
from streamgnn.updates import ValueLimits, VertexId

MAX_QUERY_VERTICES = 4096
MAX_QUERY_EDGES = 1 << 18
Policy = Literal["top-ratio", "random", "degree"]
POLICIES: tuple[str, ...] = ("top-ratio", "random", "degree")


class QueryVertex(BaseModel):
    """A query vertex: a new id and its features."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: VertexId
    x: list[float]


class QueryEdge(BaseModel):
    """An edge between a query vertex and an existing vertex (either direction) or between
    two query vertices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    src: VertexId
    dst: VertexId
    weight: float = 1.0


class QueryRequest(BaseModel):
    """New vertices with features and their edges, answered from the current embeddings:
    exactly as if inserted (``budget`` None), or by selective recomputation with
    ``budget`` gamma in [0, 1] (SRPE, candidates ranked by ``policy``); inserted into the
    graph only if ``insert``. ``embeddings``: whether the answer on the ``query-results``
    topic carries the output embeddings, not only the labels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    event_time: float = Field(default_factory=time.time)
    vertices: list[QueryVertex]
    edges: list[QueryEdge] = []
    budget: float | None = Field(default=None, ge=0.0, le=1.0)
    policy: Policy = "top-ratio"
    insert: bool = False
    embeddings: bool = False


@dataclass
class QueryColumns:
    """A request's vertices and edges as arrays, checked for everything that does not
    depend on the graph: sizes, duplicate ids and edges, self-loops, feature dimension,
    finite values within `ValueLimits`. Raises the `InvalidUpdateError` subclass naming
    the first problem (``index``: the vertex's or edge's position in the request)."""

    ids: np.ndarray     # int64 [n]
    x: np.ndarray       # float32 [n, features]
    src: np.ndarray     # int64 [m] external ids
    dst: np.ndarray
    weight: np.ndarray  # float32 [m]

    @classmethod
    def from_request(cls, req: QueryRequest, num_features: int,
                     limits: ValueLimits | None = None) -> QueryColumns:
        limits = limits or ValueLimits()
        n, m = len(req.vertices), len(req.edges)
        if not 1 <= n <= MAX_QUERY_VERTICES:
            raise InvalidQueryError(f"a query has 1 to {MAX_QUERY_VERTICES} vertices, "
                                    f"this one {n}")
        if m > MAX_QUERY_EDGES:
            raise InvalidQueryError(f"a query has at most {MAX_QUERY_EDGES} edges, "
                                    f"this one {m}")
        lengths = np.fromiter((len(v.x) for v in req.vertices), np.int64, n)
        wrong = lengths != num_features
        rows = np.zeros((n, num_features))  # float64: a float32 cast would turn 1e39 to inf
        if not wrong.all():
            rows[~wrong] = [v.x for v, bad in zip(req.vertices, wrong, strict=True) if not bad]
        non_finite = ~np.isfinite(rows).all(axis=1)
        over = ~non_finite & (np.abs(rows).max(axis=1, initial=0.0) > limits.features)
        if (bad := np.flatnonzero(wrong | non_finite | over)).size:
            i = int(bad[0])
            v = req.vertices[i]
            if wrong[i]:
                raise FeatureDimensionError(f"query vertex {v.id} has {len(v.x)} features, "
                                            f"the graph {num_features}", index=i)
            if non_finite[i]:
                raise NonFiniteValueError(f"query vertex {v.id}: NaN or inf in the "
                                          "features", index=i)
            raise OutOfRangeError(f"query vertex {v.id}: a feature value beyond "
                                  f"{limits.features:g}", index=i)
        ids = np.array([v.id for v in req.vertices], np.int64)
        _first_repeat([ids], lambda i: DuplicateVertexError(
            f"query vertex {ids[i]} appears twice", index=i))
        src = np.array([e.src for e in req.edges], np.int64)
        dst = np.array([e.dst for e in req.edges], np.int64)
        weight = np.array([e.weight for e in req.edges], np.float64)
        loop, non_finite = src == dst, ~np.isfinite(weight)
        over = ~non_finite & (np.abs(weight) > limits.weights)
        if (bad := np.flatnonzero(loop | non_finite | over)).size:
            j = int(bad[0])
            edge = f"query edge {src[j]} -> {dst[j]}"
            if loop[j]:
                raise SelfLoopError(f"{edge} is a self-loop", index=j)
            if non_finite[j]:
                raise NonFiniteValueError(f"{edge}: the weight is NaN or inf", index=j)
            raise OutOfRangeError(f"{edge}: weight beyond {limits.weights:g}", index=j)
        _first_repeat([src, dst], lambda j: DuplicateEdgeError(
            f"query edge {src[j]} -> {dst[j]} appears twice", index=j))
        return cls(ids, rows.astype(np.float32), src, dst, weight.astype(np.float32))


def _first_repeat(columns: list[np.ndarray], error) -> None:
    """Raise ``error(i)`` for the first position ``i`` whose key (the tuple of
    ``columns`` there) came before."""
    if len(columns[0]) < 2:
        return
    order = np.lexsort(columns[::-1])  # stable: equal keys stay in position order
    keys = [c[order] for c in columns]
    repeat = np.logical_and.reduce([k[1:] == k[:-1] for k in keys])
    if repeat.any():
        raise error(int(order[1:][repeat].min()))
