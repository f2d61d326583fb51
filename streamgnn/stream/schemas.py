"""The JSON messages on streamgnn's topics, as pydantic models, and the topic names.

In: the six update types (`streamgnn.updates`, with ``event_id``/``event_time``) on
``graph-updates``, one per message (a JSON object) or several in order (a JSON array: the
cheap way to stream at a high rate); `QueryRequest` on ``query-requests``. Out:
`LabelChanges` on ``label-changes``, `QueryResult` on ``query-results``, `DeadLetter` on
``dead-letters``.

Pydantic (orjson for the hottest output); must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

import json
import math
import time
import uuid

import orjson
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from streamgnn.queries import QueryRequest
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


class QueryResult(_Message):
    """The answer to the `QueryRequest` whose event id is ``request_id``: its vertices'
    ``ids`` in request order with their ``labels`` (and output ``embeddings`` if the
    request asked), the ``budget`` used (None: exact), the ``batch`` number of the state
    it read (the batches applied before it), how many existing vertices' embeddings were
    ``recomputed`` and the ``latency_ms`` from the request's event time. A request that
    cannot be answered gets ``error`` (one word, as a dead letter's) and ``reason``."""

    request_id: str
    ids: list[int] = []
    labels: list[int] = []
    embeddings: list[list[float]] | None = None
    budget: float | None = None
    policy: str = "top-ratio"
    batch: int = 0
    recomputed: int = 0
    latency_ms: float = 0.0
    error: str | None = None
    reason: str | None = None


class SourceRange(BaseModel):
    """Offsets ``first``..``last`` (inclusive) of one partition of the updates topic."""

    partition: int
    first: int
    last: int


class LabelChange(BaseModel):
    """A vertex whose predicted label changed (``old`` is None for a vertex just added)."""

    vertex: int
    old: int | None = None
    new: int


class LabelChanges(_Message):
    """The label changes of the ``batch``-th batch (which consumed the ``sources`` offsets
    of the updates topic) for the vertices of one partition of the label-changes topic
    (vertex mod its partition count: a vertex's changes stay in order), ``part``-th of the
    batch's messages. Batches are numbered deterministically: after a restart a replayed
    batch carries the same number, the same changes, and its messages the same
    ``event_id`` (``lc-{batch}-{part}``) and ``event_time`` (the latest event time of the
    batch's updates), so consumers drop repeats by id."""

    batch: int
    part: int = 0
    sources: list[SourceRange]
    changes: list[LabelChange]


def label_changes_json(event_id: str, event_time: float, batch: int, part: int,
                       sources: list[SourceRange],
                       changes: list[tuple[int, int | None, int]]) -> bytes:
    """``encode(LabelChanges(...))`` for ``(vertex, old, new)`` triples, ten times faster
    (the service's hottest output: a batch can change thousands of labels)."""
    return orjson.dumps({
        "event_id": event_id, "event_time": event_time, "batch": batch, "part": part,
        "sources": [s.model_dump() for s in sources],
        "changes": [{"vertex": v, "new": n} if o is None else {"vertex": v, "old": o, "new": n}
                    for v, o, n in changes]})


class DeadLetter(_Message):
    """An input update the service could not use: why, and where it came from: the
    message at ``offset``, and ``index`` in it when the message is an array (``event_id``
    is ``dl-{topic}-{partition}-{offset}[-{index}]``: the same on a replay). ``payload`` is
    the message, or the update's own JSON for an item of an array, cut to the service's
    ``payload_bytes`` (``truncated``); ``payload_bytes`` and ``payload_sha256`` are the
    size and hash of the whole. ``error`` is one word: malformed_json, unknown_op,
    invalid_fields, non_finite, out_of_range, empty, tombstone, wrong_dimension,
    unknown_vertex, duplicate_vertex, unknown_edge, duplicate_edge, self_loop,
    vertex_never_arrived, internal (an unexpected exception, named in ``reason``) or
    quarantined (the process died handling it)."""

    reason: str
    error: str
    topic: str
    partition: int
    offset: int
    index: int | None = None
    payload: str
    payload_bytes: int = 0
    payload_sha256: str = ""
    truncated: bool = False
    source_event_id: str | None = None


class DecodeError(ValueError):
    """A message (or an item of an array message: its JSON is ``item``) that is not a
    valid update; ``error`` names the kind of problem."""

    def __init__(self, error: str, reason: str, item: str | None = None) -> None:
        self.error = error
        self.item = item
        super().__init__(reason)


_UPDATES: TypeAdapter[list[Update]] = TypeAdapter(list[Update])
_KINDS = {"json_invalid": "malformed_json", "union_tag_invalid": "unknown_op",
          "union_tag_not_found": "unknown_op"}


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark some editors and tools put first


def decode_update(raw: bytes) -> Update:
    """Parse one update (a JSON object, types strict: no ``"12"`` or ``12.0`` for an id, no
    ``true`` for a weight); raises `DecodeError` saying what is wrong (malformed JSON,
    unknown op, missing, extra or mistyped fields, ids outside int64, NaN or inf)."""
    try:
        update = _finite(UPDATE_ADAPTER.validate_json(raw.removeprefix(_BOM), strict=True))
    except ValidationError as e:
        raise _decode_error(e) from None
    if isinstance(update, DecodeError):
        raise update
    return update


def decode_query(raw: bytes | None) -> QueryRequest:
    """Parse one ``query-requests`` message; raises `DecodeError` saying what is wrong
    (no value, malformed JSON, missing, extra or mistyped fields, a budget outside
    [0, 1], an unknown policy)."""
    if raw is None:
        raise DecodeError("tombstone", "the record has no value (a tombstone): no query")
    try:
        return QueryRequest.model_validate_json(raw.removeprefix(_BOM))
    except ValidationError as e:
        raise _decode_error(e) from None


def is_array(raw: bytes | None) -> bool:
    """Whether a ``graph-updates`` message holds an array of updates."""
    return raw is not None and raw.removeprefix(_BOM).lstrip()[:1] == b"["


def decode_updates(raw: bytes | None) -> list[Update | DecodeError]:
    """Parse one ``graph-updates`` message: a JSON object (one update) or a JSON array
    (several, in order). For an array, each item is the update or the `DecodeError`
    saying why it is not one. Raises `DecodeError` when the message as a whole is none of
    these (no value, not JSON, nested too deep, not a valid update, an empty array)."""
    if raw is None:
        raise DecodeError("tombstone", "the record has no value (a tombstone): no update")
    if not is_array(raw):
        return [decode_update(raw)]
    raw = raw.removeprefix(_BOM)
    try:
        updates = [_finite(u) for u in _UPDATES.validate_json(raw, strict=True)]
        if not any(isinstance(u, DecodeError) for u in updates):
            if not updates:
                raise DecodeError("empty", "an empty array: no update")
            return updates
    except ValidationError:
        pass
    try:  # item by item, to keep the good ones and say what is wrong with the rest
        items = pydantic_core.from_json(raw)  # bounded nesting, ints of any size
    except ValueError as e:
        raise DecodeError("malformed_json", f"invalid JSON: {e}") from None
    return [_item(item) for item in items]


def _item(item: object) -> Update | DecodeError:
    try:
        update = _finite(UPDATE_ADAPTER.validate_python(item, strict=True))
    except ValidationError as e:
        update = _decode_error(e)
    if isinstance(update, DecodeError):
        update.item = json.dumps(item)
    return update


def _decode_error(e: ValidationError) -> DecodeError:
    first = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return DecodeError(_KINDS.get(first["type"], "invalid_fields"),
                       f"{first['msg']}" + (f" (at {where})" if where else ""))


_FLOAT32_MAX = 3.4028234663852886e38


def _finite(update: Update) -> Update | DecodeError:
    """``update``, or why its values are not finite float32 numbers (the graph then holds
    them to its own, much smaller, `ValueLimits`)."""
    if isinstance(update, AddEdge | UpdateEdge):
        if not math.isfinite(update.weight):
            return DecodeError("non_finite", f"{update.op}: the weight is NaN or inf")
        if abs(update.weight) > _FLOAT32_MAX:
            return DecodeError("out_of_range", f"{update.op}: the weight is beyond float32")
    x = update.x if isinstance(update, AddVertex | UpdateFeatures) else None
    if not x:
        return update
    # a finite sum is the fast proof that all are finite
    if not math.isfinite(sum(x)) and not all(map(math.isfinite, x)):
        return DecodeError("non_finite", f"{update.op}: NaN or inf in the features")
    if max(-min(x), max(x)) > _FLOAT32_MAX:
        return DecodeError("out_of_range", f"{update.op}: a feature value is beyond float32")
    return update


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json(exclude_none=True).encode()
