"""Query requests: new vertices with features and their edges into the existing graph, to be
labelled from the current embeddings (docs/architecture.md "The life of a query"); the
vocabulary shared by the engine (`Engine.query`), the ``query-requests`` topic and the REST
API; and `QueryColumns`, a request checked and laid out in arrays.

Pydantic and numpy; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

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

StrictVertexId = Annotated[VertexId, Field(strict=True)]
"""A vertex id as JSON carries it on every interface (the topics, REST bodies): an
integer within int64 and nothing else, no ``true``, ``3142.0`` or ``"3142"`` (the rule
the update decoder holds every field to); `vertex_id_text` holds a URL's text to it."""

_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")


def vertex_id_text(text: str) -> int:
    """``text`` (a vertex id in a URL) as an int if JSON would read it as an integer:
    digits, an optional leading minus, no ``+``, spaces, leading zeros, fraction or
    exponent (the int64 range is `StrictVertexId`'s to check)."""
    if not _INTEGER.fullmatch(text):
        raise PydanticCustomError("int_parsing", "a vertex id is an integer written in "
                                  "digits with an optional leading minus")
    if len(text) > 20:  # beyond int64 however it reads (and past int()'s 4,300 digits)
        raise PydanticCustomError("int_range", "a vertex id is within int64")
    return int(text)


class QueryVertex(BaseModel):
    """A query vertex: a new id and its features."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictVertexId
    x: list[float]


class QueryEdge(BaseModel):
    """An edge between a query vertex and an existing vertex (either direction) or between
    two query vertices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    src: StrictVertexId
    dst: StrictVertexId
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
    """A query's vertices and edges as arrays: ``ids`` [n] (new external ids), ``x``
    [n, features], and its edges ``src``, ``dst`` (external ids) with ``weight``
    (default 1). The fast way to ask a large query (`Engine.query` takes it as it takes a
    `QueryRequest`, which it turns into one with `from_request`): no Python object per
    vertex or edge. Arrays are taken as given; `checked` validates them."""

    ids: np.ndarray
    x: np.ndarray
    src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    weight: np.ndarray | None = None

    @classmethod
    def from_request(cls, req: QueryRequest, num_features: int,
                     limits: ValueLimits | None = None) -> QueryColumns:
        """``req`` laid out in arrays and `checked`."""
        n = len(req.vertices)
        _check_sizes(n, len(req.edges))
        lengths = np.fromiter((len(v.x) for v in req.vertices), np.int64, n)
        if (wrong := np.flatnonzero(lengths != num_features)).size:
            i = int(wrong[0])
            raise FeatureDimensionError(f"query vertex {req.vertices[i].id} has "
                                        f"{lengths[i]} features, the graph {num_features}",
                                        index=i)
        return cls(np.array([v.id for v in req.vertices], np.int64),
                   np.array([v.x for v in req.vertices], np.float64).reshape(n, num_features),
                   np.array([e.src for e in req.edges], np.int64),
                   np.array([e.dst for e in req.edges], np.int64),
                   np.array([e.weight for e in req.edges], np.float64)
                   ).checked(num_features, limits)

    def checked(self, num_features: int, limits: ValueLimits | None = None) -> QueryColumns:
        """These columns (ids and ends int64, ``x`` and ``weight`` float32) once checked
        for everything that does not depend on the graph: sizes, feature dimension,
        finite values within `ValueLimits`, duplicate ids and edges, self-loops. Raises
        the `InvalidInputError` subclass naming the first problem (``index``: the
        vertex's or edge's position)."""
        limits = limits or ValueLimits()
        ids, src, dst = (_integers(name, getattr(self, name)) for name in ("ids", "src", "dst"))
        x = _floats("x", self.x)
        weight = np.ones(len(src)) if self.weight is None else _floats("weight", self.weight)
        if ids.ndim != 1 or x.ndim != 2 or len(x) != len(ids):
            raise InvalidQueryError(f"ids {ids.shape} and x {x.shape}: a query needs one "
                                    "feature row per id")
        if not src.ndim == dst.ndim == weight.ndim == 1 or not len(src) == len(dst) == len(
                weight):
            raise InvalidQueryError(f"src {src.shape}, dst {dst.shape} and weight "
                                    f"{weight.shape}: one entry per edge")
        _check_sizes(len(ids), len(src))
        if x.shape[1] != num_features:
            raise FeatureDimensionError(f"query vertices have {x.shape[1]} features, the "
                                        f"graph {num_features}", index=0)
        non_finite = ~np.isfinite(x).all(axis=1)
        over = ~non_finite & (np.abs(x).max(axis=1, initial=0.0) > limits.features)
        if (bad := np.flatnonzero(non_finite | over)).size:
            i = int(bad[0])
            if non_finite[i]:
                raise NonFiniteValueError(f"query vertex {ids[i]}: NaN or inf in the "
                                          "features", index=i)
            raise OutOfRangeError(f"query vertex {ids[i]}: a feature value beyond "
                                  f"{limits.features:g}", index=i)
        _first_repeat([ids], lambda i: DuplicateVertexError(
            f"query vertex {ids[i]} appears twice", index=i))
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
        return QueryColumns(ids, x.astype(np.float32), src, dst, weight.astype(np.float32))


def _check_sizes(n: int, m: int) -> None:
    if not 1 <= n <= MAX_QUERY_VERTICES:
        raise InvalidQueryError(f"a query has 1 to {MAX_QUERY_VERTICES} vertices, this one {n}")
    if m > MAX_QUERY_EDGES:
        raise InvalidQueryError(f"a query has at most {MAX_QUERY_EDGES} edges, this one {m}")


def _integers(name: str, values) -> np.ndarray:
    a = np.asarray(values)
    if a.size == 0:
        return a.astype(np.int64).reshape(a.shape)
    if a.dtype.kind not in "iu":
        raise InvalidQueryError(f"{name}: integer vertex ids expected, got {a.dtype}")
    if a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        raise InvalidQueryError(f"{name}: a vertex id beyond the int64 range")
    return a.astype(np.int64, copy=False)


def _floats(name: str, values) -> np.ndarray:
    """float64 (a float32 cast would turn 1e39 into inf before the range check)."""
    try:
        return np.asarray(values, np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidQueryError(f"{name}: numbers expected ({e})") from None


def _first_repeat(columns: list[np.ndarray], error) -> None:
    """Raise ``error(i)`` for the first position ``i`` whose key (the tuple of
    ``columns`` there) came before."""
    if len(columns[0]) < 2:
        return
    key = columns[0]
    for c in columns[1:]:  # a hash of the key: distinct hashes, distinct keys
        key = key * np.int64(-7046029254386353131) ^ c
    hashes = np.sort(key)
    if not (hashes[1:] == hashes[:-1]).any():
        return
    order = np.lexsort(columns[::-1])  # stable: equal keys stay in position order
    keys = [c[order] for c in columns]
    repeat = np.logical_and.reduce([k[1:] == k[:-1] for k in keys])
    if repeat.any():
        raise error(int(order[1:][repeat].min()))
