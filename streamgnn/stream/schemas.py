"""The JSON messages on streamgnn's topics, as pydantic models, and the topic names.

In: the six update types (`streamgnn.updates`, with ``event_id``/``event_time``) on
``graph-updates``, one per message (a JSON object), several in order (a JSON array), or a
batch of them as columns with binary features (`Columns`: the cheapest to decode, so the
way to stream at a high rate); `QueryRequest` on ``query-requests``. Out:
`LabelChanges` on ``label-changes``, `QueryResult` on ``query-results``, `DeadLetter` on
``dead-letters``.

Pydantic and numpy (orjson for the hottest output); must not import kafka, torch or
mpi4py.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import orjson
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from streamgnn.errors import StreamGNNError
from streamgnn.queries import QueryRequest
from streamgnn.updates import (
    ADD_EDGE,
    ADD_VERTEX,
    BAD_WIDTH,
    NO_X,
    OP_NAMES,
    UPDATE_ADAPTER,
    UPDATE_EDGE,
    UPDATE_FEATURES,
    AddEdge,
    AddVertex,
    DeleteEdge,
    DeleteVertex,
    Update,
    UpdateBatch,
    UpdateEdge,
    UpdateFeatures,
    VertexId,
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
    ``event_id`` (``lc-{epoch}-{batch}-{part}``, the epoch naming the state: new when a state
    is bootstrapped or rebuilt) and ``event_time`` (the latest event time of the batch's
    updates), so consumers drop repeats by id."""

    batch: int
    part: int = 0
    sources: list[SourceRange]
    changes: list[LabelChange]


def label_changes_json(event_id: str, event_time: float, batch: int, part: int,
                       sources: list[SourceRange],
                       changes: list[tuple[int, int | None, int]]) -> bytes:
    """``encode(LabelChanges(...))`` for ``(vertex, old, new)`` triples, without a
    `LabelChange` model per change (the service's hottest output: a batch can change
    thousands of labels)."""
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


class DecodeError(StreamGNNError, ValueError):
    """A message (or an item of an array message: its JSON is ``item``) that is not a
    valid update; ``error`` names the kind of problem."""

    def __init__(self, error: str, reason: str, item: str | None = None) -> None:
        self.error = error
        self.item = item
        super().__init__(reason)


class Columns(BaseModel):
    """A batch of updates as columns (``"op": "columns"``), applied in order: row i is
    update i. ``ops`` holds op codes (0 add_edge, 1 delete_edge, 2 update_edge,
    3 add_vertex, 4 delete_vertex, 5 update_features), ``a`` the source (edge updates) or
    the vertex, ``b`` the destination, ``w`` the weight (add_edge, update_edge); a column
    that does not apply to a row is ignored there (write 0). ``x`` is base64 of the
    feature rows of the add_vertex and update_features rows, in row order, each
    ``width`` little-endian float32 values. ``event_time`` (seconds since the epoch) is
    per row; ``event_id``, if given, names the message (its rows' dead letters carry it
    as ``source_event_id``).

    A message that is not such an object, or whose columns do not line up (lengths, x not
    base64 or not as long as its feature rows need), is dead-lettered whole; a row with
    an unknown op code, or a NaN/inf/beyond-float32 weight or feature, alone (its
    ``index``; the other rows are applied), as in an array of JSON updates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Literal["columns"] = "columns"
    ops: list[VertexId]  # any int64: a code outside 0..5 is that row's problem
    a: list[VertexId]
    b: list[VertexId]
    w: list[float]
    width: int = Field(0, ge=0)
    x: str = ""
    event_time: list[float] | None = None
    event_id: str | None = None


@dataclass(frozen=True)
class DecodedColumns:
    """The updates of a `Columns` message that may go on: ``batch`` row j is the message's
    row ``index[j]``, with event time ``times[j]`` (NaN: none); ``errors`` are the other
    rows (their positions and why)."""

    batch: UpdateBatch
    index: np.ndarray
    times: np.ndarray
    event_id: str | None = None
    errors: tuple[tuple[int, DecodeError], ...] = ()

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, rows: slice | np.ndarray) -> DecodedColumns:
        """Rows ``rows`` (a slice, or positions) of these, without the errors."""
        return DecodedColumns(self.batch[rows], self.index[rows], self.times[rows], self.event_id)

    def update(self, j: int) -> Update:
        """Row ``j`` as an update object."""
        time_ = float(self.times[j])
        return self.batch.update(j, self.event_id, None if math.isnan(time_) else time_)


def encode_columns(batch: UpdateBatch, event_time: np.ndarray | None = None,
                   event_id: str | None = None) -> bytes:
    """``batch`` as a `Columns` message (``event_time``: per update); raises ValueError
    for what the message cannot carry (a ``BAD_WIDTH`` row, a NaN or inf weight)."""
    featured = batch.xrow[(batch.op == ADD_VERTEX) | (batch.op == UPDATE_FEATURES)]
    if (featured == BAD_WIDTH).any():
        raise ValueError("a feature vector of the wrong length cannot go in columns")
    if not np.isfinite(batch.w).all():
        raise ValueError("a NaN or inf weight cannot go in columns (JSON has no such number)")
    message = {"op": "columns", "ops": batch.op.tolist(), "a": batch.src.tolist(),
               "b": batch.dst.tolist(), "w": batch.w.tolist(), "width": batch.x.shape[1],
               "x": base64.b64encode(batch.x[featured].astype("<f4").tobytes()).decode()}
    if event_time is not None:
        message["event_time"] = np.asarray(event_time, np.float64).tolist()
    if event_id is not None:
        message["event_id"] = event_id
    return orjson.dumps(message)


def column_update(item: dict) -> Update | None:
    """``item`` (a parsed JSON update) as an update whose every field a `Columns` row
    carries, or None if it has an ``event_id`` or is not a valid update (send it as JSON:
    the service says what is wrong with it)."""
    try:
        update = _finite(UPDATE_ADAPTER.validate_python(item, strict=True))
    except ValidationError:
        return None
    if isinstance(update, DecodeError) or update.event_id is not None:
        return None
    return update


def _rows(message: Columns) -> DecodedColumns:
    """The usable rows of ``message``; raises `DecodeError` if its columns do not line up."""
    n = len(message.ops)
    if not n:
        raise DecodeError("empty", "columns: no rows, no update")
    for name in ("a", "b", "w", *(("event_time",) if message.event_time is not None else ())):
        if len(getattr(message, name)) != n:
            raise DecodeError("invalid_fields", f"columns: {name} has "
                              f"{len(getattr(message, name))} values, ops has {n}")
    op = np.array(message.ops, np.int64)
    featured = (op == ADD_VERTEX) | (op == UPDATE_FEATURES)
    k = int(featured.sum())
    try:
        raw = base64.b64decode(message.x, validate=True)
    except (binascii.Error, ValueError) as e:
        raise DecodeError("invalid_fields", f"columns: x is not base64: {e}") from None
    if len(raw) != 4 * k * message.width:
        raise DecodeError("invalid_fields", f"columns: x holds {len(raw):,} bytes, the "
                          f"{k} add_vertex/update_features rows of width {message.width} "
                          f"need {4 * k * message.width:,} (float32 each)")
    x = np.frombuffer(raw, "<f4").reshape(k, message.width)
    w = np.array(message.w, np.float64)
    xrow = np.full(n, NO_X, np.int64)
    xrow[featured] = np.arange(k)
    weighted = (op == ADD_EDGE) | (op == UPDATE_EDGE)
    unknown = (op < 0) | (op >= len(OP_NAMES))
    bad_w = weighted & ~(np.abs(w) <= _FLOAT32_MAX)  # NaN fails <=
    bad_x = np.zeros(n, bool)
    bad_x[featured] = ~np.isfinite(x).all(axis=1)
    bad = unknown | bad_w | bad_x
    errors = tuple((i, _row_error(message, i, int(op[i]), w[i], x[xrow[i]] if xrow[i] >= 0
                                  else None)) for i in np.flatnonzero(bad).tolist())
    times = (np.full(n, np.nan) if message.event_time is None
             else np.array(message.event_time, np.float64))
    rows = DecodedColumns(UpdateBatch(np.where(unknown, 0, op), np.array(message.a, np.int64),
                            np.array(message.b, np.int64), w.astype(np.float32), xrow, x),
                np.arange(n), times, message.event_id)
    if not errors:
        return rows
    good = rows[np.flatnonzero(~bad)]
    return DecodedColumns(good.batch, good.index, good.times, message.event_id, errors)


def _row_error(message: Columns, i: int, code: int, w: float, x: np.ndarray | None
               ) -> DecodeError:
    row = {"op": code, "a": message.a[i], "b": message.b[i], "w": w}
    if x is not None:
        row["x"] = x.tolist()
    item = json.dumps(row)
    if not 0 <= code < len(OP_NAMES):
        return DecodeError("unknown_op", f"row {i}: op code {code} is none of "
                           f"0..{len(OP_NAMES) - 1}", item)
    if x is not None:
        return DecodeError("non_finite", f"row {i}: {OP_NAMES[code]}: NaN or inf in the "
                           "features", item)
    if not math.isfinite(w):
        return DecodeError("non_finite", f"row {i}: {OP_NAMES[code]}: the weight is NaN "
                           "or inf", item)
    return DecodeError("out_of_range", f"row {i}: {OP_NAMES[code]}: the weight is beyond "
                       "float32", item)


_UPDATES: TypeAdapter[list[Update]] = TypeAdapter(list[Update])
_MESSAGE: TypeAdapter[Update | Columns] = TypeAdapter(Annotated[
    AddEdge | DeleteEdge | UpdateEdge | AddVertex | DeleteVertex | UpdateFeatures | Columns,
    Field(discriminator="op")])
_KINDS = {"json_invalid": "malformed_json", "union_tag_invalid": "unknown_op",
          "union_tag_not_found": "unknown_op"}


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark some editors and tools put first


def decode_update(raw: bytes) -> Update:
    """Parse one update (a JSON object, types strict: no ``"12"`` or ``12.0`` for an id, no
    ``true`` for a weight); raises `DecodeError` saying what is wrong (malformed JSON,
    unknown op, missing, extra or mistyped fields, ids outside int64, NaN or inf)."""
    return _validated(UPDATE_ADAPTER, raw)


def _validated(adapter: TypeAdapter, raw: bytes):
    """One JSON object through ``adapter`` (strict), its values checked as `_finite`;
    raises the `DecodeError` naming what is wrong."""
    try:
        value = _finite(adapter.validate_json(raw.removeprefix(_BOM), strict=True))
    except ValidationError as e:
        raise _decode_error(e) from None
    if isinstance(value, DecodeError):
        raise value
    return value


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


def decode_updates(raw: bytes | None) -> list[Update | DecodeError] | DecodedColumns:
    """Parse one ``graph-updates`` message: a JSON object (one update, or a `Columns`
    batch: its `DecodedColumns`) or a JSON array (several, in order). For an array, each item is the
    update or the `DecodeError` saying why it is not one. Raises `DecodeError` when the
    message as a whole is none of these (no value, not JSON, nested too deep, not a valid
    update, an empty array, columns that do not line up)."""
    if raw is None:
        raise DecodeError("tombstone", "the record has no value (a tombstone): no update")
    if not is_array(raw):
        message = _validated(_MESSAGE, raw)
        return _rows(message) if isinstance(message, Columns) else [message]
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


def _finite(update: Update | Columns) -> Update | Columns | DecodeError:
    """``update``, or why its values are not finite float32 numbers (the graph then holds
    them to its own, much smaller, `ValueLimits`)."""
    if isinstance(update, Columns):
        return update  # checked row by row (`_rows`)
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
