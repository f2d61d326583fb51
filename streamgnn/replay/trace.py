"""Trace files: what `streamgnn replay generate` writes and `streamgnn replay run` reads.

A trace is JSONL: a header line (``{"streamgnn_trace": 1, ...settings}``), then one op
per line with ``t``, its intended send time in seconds from the trace start (monotone),
and ``op``, a LinkBench operation name:

- writes (to ``graph-updates``): ``addlink`` ``deletelink`` ``updatelink`` ``addnode``
  ``updatenode`` ``deletenode``, with ``update``: the update's JSON (`streamgnn.updates`);
- reads (to the REST API): ``getnode`` (``GET /v1/vertices/{id}``), ``getlinklist`` and
  ``countlink`` (``GET /v1/vertices/{id}/neighbors``), with ``id``;
- ``query`` (to ``query-requests``), with ``request``: a `streamgnn.queries.QueryRequest`.

A user's CSV/TSV edge-event file is a trace too: columns ``time, op, src, dst[, weight]``
(an optional header row naming them; ``#`` comments), ops ``add`` / ``delete`` /
``update``, times in seconds (any origin), non-decreasing.

Reading streams the file (a trace may not fit in memory). Owns the format only; must not
import torch, kafka or the graph store (`replay run` starts without them).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson

from streamgnn.errors import StreamGNNError

FORMAT_VERSION = 1
WRITE_OPS: dict[str, str] = {  # LinkBench name -> update op
    "addlink": "add_edge", "deletelink": "delete_edge", "updatelink": "update_edge",
    "addnode": "add_vertex", "updatenode": "update_features", "deletenode": "delete_vertex"}
READ_OPS = ("getnode", "getlinklist", "countlink")
QUERY_OP = "query"
OPS = (*WRITE_OPS, *READ_OPS, QUERY_OP)
_CSV_OPS = {"add": "addlink", "delete": "deletelink", "update": "updatelink"}


class TraceError(StreamGNNError, ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


class TraceOp(NamedTuple):
    """One op: intended offset ``t`` (s), LinkBench ``op`` name, and its ``body``: the
    update (writes) or request (queries) as a JSON object, the vertex id (reads)."""

    t: float
    op: str
    body: Any


@dataclass
class Trace:
    """An open trace: its ``header`` (settings; ``ops`` and ``rate``, the mean ops/s its
    times imply, always present) and `ops`, an iterator that reads the file as it goes."""

    path: Path
    header: dict[str, Any]

    def ops(self) -> Iterator[TraceOp]:
        if _is_table(self.path):
            yield from _table_ops(self.path)
        else:
            yield from _jsonl_ops(self.path)


def open_trace(path: Path) -> Trace:
    """Open a JSONL trace (reading its header) or a CSV/TSV edge-event file (checked
    line by line first, so a bad line stops the run before anything is sent)."""
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if _is_table(path):
        n, span = 0, 0.0
        for n, op in enumerate(_table_ops(path), start=1):  # noqa: B007 (the last counts)
            span = op.t
        if n == 0:
            raise TraceError(f"{path}: no edge events")
        return Trace(path, {"source": str(path), "ops": n, "rate": n / span if span else None})
    with open(path, "rb") as f:
        header = _json(f.readline(), path, 1)
    if not isinstance(header, dict) or header.get("streamgnn_trace") != FORMAT_VERSION:
        raise TraceError(f"{path}:1: not a streamgnn trace (the first line must be its header "
                         f'{{"streamgnn_trace": {FORMAT_VERSION}, ...}}; CSV/TSV files need a '
                         ".csv or .tsv name)")
    return Trace(path, header)


class TraceWriter:
    """Writes a JSONL trace: the header first, then ops in time order."""

    def __init__(self, f: IO[bytes], header: dict[str, Any]) -> None:
        self.f = f
        f.write(orjson.dumps({"streamgnn_trace": FORMAT_VERSION, **header}) + b"\n")

    def write(self, op: TraceOp) -> None:
        key = "update" if op.op in WRITE_OPS else "request" if op.op == QUERY_OP else "id"
        self.f.write(orjson.dumps({"t": round(op.t, 6), "op": op.op, key: op.body}) + b"\n")


def _is_table(path: Path) -> bool:
    return path.suffix.lower() in (".csv", ".tsv")


def _json(line: bytes, path: Path, n: int) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise TraceError(f"{path}:{n}: not JSON ({e})") from None


def _jsonl_ops(path: Path) -> Iterator[TraceOp]:
    last = 0.0
    with open(path, "rb") as f:
        f.readline()
        for n, line in enumerate(f, start=2):
            if not line.strip():
                continue
            item = _json(line, path, n)
            try:
                t, op = float(item["t"]), item["op"]
                body = item["update" if op in WRITE_OPS else "request" if op == QUERY_OP
                            else "id"]
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{path}:{n}: an op needs t, op and its update, request or "
                                 "id") from None
            if op not in OPS:
                raise TraceError(f"{path}:{n}: unknown op {op!r} (one of {', '.join(OPS)})")
            if not math.isfinite(t) or t < last:
                raise TraceError(f"{path}:{n}: time {t} is before the previous op's ({last})")
            last = t
            yield TraceOp(t, op, body)


def _table_ops(path: Path) -> Iterator[TraceOp]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    origin: float | None = None
    last = -math.inf
    with open(path, newline="", encoding="utf-8-sig") as f:
        for n, row in enumerate(csv.reader(f, delimiter=delimiter), start=1):
            row = [c.strip() for c in row]
            if not row or not row[0] or row[0].startswith("#"):
                continue
            if n == 1 and row[0].lower() == "time":
                continue
            t, op, update = _table_row(row, path, n)
            if t < last:
                raise TraceError(f"{path}:{n}: time {t:g} is before the previous line's "
                                 f"({last:g}): events must be in time order")
            last = t
            origin = t if origin is None else origin
            yield TraceOp(t - origin, op, update)


def _table_row(row: list[str], path: Path, n: int) -> tuple[float, str, dict[str, Any]]:
    where = f"{path}:{n}"
    if len(row) not in (4, 5):
        raise TraceError(f"{where}: expected time, op, src, dst[, weight]; got {len(row)} "
                         "columns")
    try:
        t = float(row[0])
    except ValueError:
        raise TraceError(f"{where}: time {row[0]!r} is not a number") from None
    if not math.isfinite(t):
        raise TraceError(f"{where}: time {row[0]!r} is not finite")
    op = _CSV_OPS.get(row[1].lower())
    if op is None:
        raise TraceError(f"{where}: op {row[1]!r} is not add, delete or update")
    try:
        src, dst = int(row[2]), int(row[3])
    except ValueError:
        raise TraceError(f"{where}: src and dst must be integer vertex ids, got "
                         f"{row[2]!r}, {row[3]!r}") from None
    update: dict[str, Any] = {"op": WRITE_OPS[op], "src": src, "dst": dst}
    has_weight = len(row) == 5 and row[4] != ""
    if op == "updatelink" and not has_weight:
        raise TraceError(f"{where}: an update needs a weight (fifth column)")
    if has_weight and op != "deletelink":
        try:
            update["weight"] = float(row[4])
        except ValueError:
            raise TraceError(f"{where}: weight {row[4]!r} is not a number") from None
        if not math.isfinite(update["weight"]):
            raise TraceError(f"{where}: weight {row[4]!r} is not finite")
    return t, op, update
