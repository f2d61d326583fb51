"""The JSON messages on streamgnn's topics, as pydantic models, and the topic names.

In: the six update types (`streamgnn.updates`, with ``event_id``/``event_time``) on
``graph-updates``; `QueryRequest` on ``query-requests``. Out: `LabelChange` on
``label-changes``, `QueryResult` on ``query-results``, `DeadLetter` on ``dead-letters``.

Pure pydantic; must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

import math
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streamgnn.updates import (
    UPDATE_ADAPTER,
    AddEdge,
    AddVertex,
    Update,
    UpdateEdge,
    UpdateFeatures,
)


def _now() -> float:
    return time.time()


def _new_id() -> str:
    return uuid.uuid4().hex


class Topics(BaseModel):
    """Topic names (all configurable)."""

    updates: str = "graph-updates"
    queries: str = "query-requests"
    labels: str = "label-changes"
    results: str = "query-results"
    dead_letters: str = "dead-letters"

    @classmethod
    def prefixed(cls, prefix: str) -> Topics:
        """The default names, each with ``prefix`` in front."""
        return cls(**{k: prefix + v for k, v in cls().model_dump().items()})

    def all(self) -> list[str]:
        return [self.updates, self.queries, self.labels, self.results, self.dead_letters]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=_new_id)
    event_time: float = Field(default_factory=_now)


class QueryVertex(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    x: list[float]


class QueryEdge(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    src: int
    dst: int
    weight: float = 1.0


class QueryRequest(_Message):
    """New vertices with features and their edges into the existing graph, to be labelled
    from the current embeddings; inserted into the graph only if ``insert``."""

    vertices: list[QueryVertex]
    edges: list[QueryEdge] = []
    insert: bool = False


class QueryResult(_Message):
    """The answer to the `QueryRequest` whose event id is ``request_id``."""

    request_id: str
    labels: dict[int, int]
    latency_ms: float


class SourceRange(BaseModel):
    """Offsets ``first``..``last`` (inclusive) of one partition of the updates topic."""

    partition: int
    first: int
    last: int


class LabelChange(_Message):
    """A vertex whose predicted label changed (``old`` is None for a vertex just added),
    in the ``batch``-th batch, which consumed the ``sources`` offsets of the updates topic.
    Batches are numbered deterministically: after a restart a replayed batch carries the
    same number and the change the same ``event_id`` (``lc-{batch}-{vertex}``), so
    consumers drop repeats by id."""

    vertex: int
    old: int | None = None
    new: int
    batch: int
    sources: list[SourceRange]


class DeadLetter(_Message):
    """An input message the service could not use: why, and where it came from
    (``event_id`` is ``dl-{topic}-{partition}-{offset}``: the same on a replay)."""

    reason: str
    error: str
    topic: str
    partition: int
    offset: int
    payload: str
    source_event_id: str | None = None


class DecodeError(ValueError):
    """A message that is not a valid update; ``error`` names the kind of problem."""

    def __init__(self, error: str, reason: str) -> None:
        self.error = error
        super().__init__(reason)


def decode_update(raw: bytes) -> Update:
    """Parse one ``graph-updates`` message; raises `DecodeError` saying what is wrong
    (malformed JSON, unknown op, missing or mistyped fields, NaN or inf values)."""
    try:
        update = UPDATE_ADAPTER.validate_json(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        kind = {"json_invalid": "malformed_json", "union_tag_invalid": "unknown_op",
                "union_tag_not_found": "unknown_op"}.get(first["type"], "invalid_fields")
        where = ".".join(str(p) for p in first["loc"])
        raise DecodeError(kind, f"{first['msg']}" + (f" (at {where})" if where else "")) \
            from None
    if isinstance(update, AddEdge | UpdateEdge) and not math.isfinite(update.weight):
        raise DecodeError("non_finite", f"{update.op}: the weight is NaN or inf")
    x = update.x if isinstance(update, AddVertex | UpdateFeatures) else None
    # a finite sum is the fast proof that all are finite
    if x is not None and not math.isfinite(sum(x)) and not all(map(math.isfinite, x)):
        raise DecodeError("non_finite", f"{update.op}: NaN or inf in the features")
    return update


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json(exclude_none=True).encode()
