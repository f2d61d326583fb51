"""The REST app (docs/architecture.md "A REST read"): current embeddings, labels,
neighbors, query serving, status and metrics of a running `Service`, and health probes.

Every ``/v1`` answer comes from one consistent state between two batches and names that
batch (``batch``: the batches applied before it): vertex rows from the service's
`ReadView`, read at once on the server's thread (with MPI workers, and for every other
read, computed by the service loop between two batches: `Reads`); the engine is touched
by the loop's thread only. Vertex answers are serialised by orjson straight from the
rows (the response models document them). Errors are JSON
``{"error": word, "reason": text}``: 404 for an unknown vertex (named), 422 for a bad body
or query, 401 without the bearer token (when one is set), 413 past the body limit, 503
while no service loop runs.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated, Any

import numpy as np
import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from streamgnn.errors import InvalidInputError, UnknownVertexError
from streamgnn.extras import needs
from streamgnn.queries import QueryRequest, StrictVertexId, vertex_id_text
from streamgnn.router.reads import NotServing, Reads
from streamgnn.router.service import Service
from streamgnn.router.view import EdgeList, Rows, engine_neighbors, engine_rows
from streamgnn.stream.schemas import QueryResult

with needs("the REST API (serve --http)"):
    from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 16 << 20
MAX_LOOKUP_IDS = 10_000
READ_TIMEOUT_S = 30.0
_ID = Annotated[StrictVertexId, BeforeValidator(vertex_id_text),
                Path(description="external vertex id (int64), in digits")]
_LAYER = Query(description="0: features, 1..L: layer outputs; negative counts from the "
               "last (-1: the output layer)")


class Problem(BaseModel):
    """Why a request got no answer."""

    error: str = Field(description="the problem in one word")
    reason: str


class Vertex(BaseModel):
    id: int
    label: int = Field(description="predicted class: argmax of the output layer")
    layer: int = Field(description="the layer read, 0..L")
    embedding: list[float]
    batch: int = Field(description="batches applied to the state read")


class LookupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[StrictVertexId] = Field(min_length=1, max_length=MAX_LOOKUP_IDS)
    layer: int = Field(-1, description=_LAYER.description)


class Lookup(BaseModel):
    batch: int
    ids: list[int]
    labels: list[int]
    embeddings: list[list[float]]


class Edges(BaseModel):
    ids: list[int] = Field(description="the neighbors' ids, ascending")
    weights: list[float]


class Neighbors(BaseModel):
    id: int
    batch: int
    in_: Edges = Field(alias="in", description="edges into the vertex, by source")
    out: Edges = Field(description="edges out of the vertex, by destination")


class StateCounts(BaseModel):
    """What the stream did to the state since it was bootstrapped: kept in every
    checkpoint, so restarts resume them (replayed batches are counted once)."""

    events: int = Field(description="updates (and undecodable records) consumed")
    batches: int = Field(description="batches applied")
    applied: dict[str, int] = Field(description="updates applied, by op")
    label_changes: int = Field(description="label changes published")
    dead_letters: dict[str, int] = Field(description="dead letters published, by reason")


class Status(BaseModel):
    batch: int = Field(description="batches applied")
    epoch: str = Field(description="the state's epoch (in label-change event ids)")
    positions: dict[str, int] = Field(description="next offset to consume, per partition "
                                      "of the updates topic")
    lag: int | None = Field(description="records on the updates topic not consumed yet "
                            "(null: not known yet)")
    vertices: int
    edges: int
    events: int = Field(description="consumed by this process (since it started)")
    applied: dict[str, int] = Field(description="updates applied by this process, by op")
    label_changes: int = Field(description="published by this process")
    dead_letters: dict[str, int] = Field(description="published by this process, by reason")
    queries: dict[str, int] = Field(description="answered by this process, or refused by "
                                    "the error's kind")
    state: StateCounts = Field(description="the same counters since the state was "
                               "bootstrapped: they survive restarts")


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem} for status in (404, 422, 503)}


def create_app(reads: Reads, token: str | None = None) -> FastAPI:
    """The app over the service that ``reads`` reaches; with ``token``, ``/v1`` and
    ``/metrics`` need ``Authorization: Bearer <token>``."""
    app = FastAPI(title="streamgnn", summary="Current embeddings, labels and query "
                  "serving of a streamgnn service", version="1",
                  # no OpenTelemetry (metrics are /metrics): its per-request check of
                  # the global providers was a tenth of a vertex read's time
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    guarded = [Depends(_bearer(token))] if token else []
    errors: dict[int | str, dict[str, Any]] = {
        **_ERRORS, **({401: {"model": Problem}} if token else {})}

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _problem(e.status_code, str(e.detail), headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, e: RequestValidationError) -> JSONResponse:
        return _problem(422, "; ".join(map(_invalid, e.errors())), "invalid_request")

    @app.exception_handler(InvalidInputError)
    async def invalid(_: Request, e: InvalidInputError) -> JSONResponse:
        return _problem(404 if isinstance(e, UnknownVertexError) else 422, e.reason, e.kind)

    @app.exception_handler(NotServing)
    async def not_serving(_: Request, e: NotServing) -> JSONResponse:
        return _problem(503, str(e), "not_ready")

    async def answer(read: Callable[[Service], Any]) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(reads.submit(read)),
                                          READ_TIMEOUT_S)
        except TimeoutError:
            raise NotServing(f"the service did not answer within {READ_TIMEOUT_S:g} s "
                             "(a long batch or checkpoint): retry") from None

    async def rows(ids: list[int], layer: int) -> Rows:
        view = reads.view
        if view is not None:
            return view.read(ids, layer)
        return await answer(lambda service: engine_rows(
            service.engine, service.batch_seq, np.array(ids, np.int64), layer))

    @app.get("/v1/vertices/{id}", response_model=Vertex, responses=errors,
             dependencies=guarded)
    async def vertex(id: _ID, layer: Annotated[int, _LAYER] = -1
                     ) -> Response:
        """One vertex's embedding at ``layer`` and its label."""
        got = await rows([id], layer)
        return _json({"id": id, "label": int(got.labels[0]), "layer": got.layer,
                      "embedding": got.rows[0], "batch": got.batch})

    @app.post("/v1/vertices/lookup", response_model=Lookup, responses=errors,
              dependencies=guarded)
    async def lookup(body: LookupRequest) -> Response:
        """Embeddings at ``layer`` and labels of ``ids`` (in order, repeats allowed)."""
        got = await rows(body.ids, body.layer)
        return _json({"batch": got.batch, "ids": body.ids, "labels": got.labels,
                      "embeddings": got.rows})

    @app.get("/v1/vertices/{id}/neighbors", response_model=Neighbors, responses=errors,
             dependencies=guarded)
    async def neighbors(id: _ID) -> Neighbors:
        """The vertex's in- and out-edges with their weights."""
        view = reads.view
        got = (view.neighbors(id) if view is not None and view.reads_edges else
               await answer(lambda service: engine_neighbors(service.engine,
                                                              service.batch_seq, id)))
        return Neighbors(id=id, batch=got.batch, **{"in": _edges(got.ins)},
                         out=_edges(got.outs))

    @app.post("/v1/queries", response_model=QueryResult, responses=errors,
              dependencies=guarded)
    async def query(body: QueryRequest) -> QueryResult:
        """Answer a query (docs/architecture.md "The life of a query") from the current
        state: exact (``budget`` null) or SRPE with ``budget`` gamma; ``embeddings``:
        whether the answer carries the query vertices' output embeddings. ``insert`` is
        refused (the updates topic is the one writer of the graph)."""
        since = time.time()
        return await answer(lambda service: service.query(body, since))

    @app.get("/v1/status", response_model=Status, responses=errors, dependencies=guarded)
    async def status() -> Status:
        """Where the service is: batches applied, consumed offsets, lag, counters."""
        def read(service: Service) -> Status:
            s, engine, c = service.stats, service.engine, service.stats.state_counts()
            return Status(batch=service.batch_seq, lag=s.lag, vertices=engine.num_vertices,
                          edges=engine.num_edges, events=s.events, applied=dict(s.updates),
                          positions={str(p): o for p, o in
                                     service.transport.positions().items()},
                          label_changes=s.label_changes, dead_letters=dict(s.dead_letters),
                          queries=dict(s.queries), epoch=service.epoch,
                          state=StateCounts(events=c.events, batches=c.batches,
                                            applied=dict(c.updates),
                                            label_changes=c.label_changes,
                                            dead_letters=dict(c.dead_letters)))

        return await answer(read)

    @app.get("/metrics", response_class=Response, dependencies=guarded,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        """The service's metrics in Prometheus' text format (empty before it first
        runs)."""
        service = reads.service
        text = service.stats.exposition() if service is not None else b""
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": Problem}})
    async def readyz() -> dict[str, str]:
        """Readiness: the engine is bootstrapped or restored, and the loop serves."""
        if not reads.ready:
            raise NotServing("the engine is being bootstrapped or restored")
        return {"status": "ready"}

    return app


_BEARER = HTTPBearer(auto_error=False)


def _bearer(token: str) -> Callable[..., None]:
    def check(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                     Depends(_BEARER)]) -> None:
        if credentials is None or not secrets.compare_digest(
                credentials.credentials.encode(), token.encode()):
            raise HTTPException(401, "a bearer token is required: Authorization: Bearer "
                                "<the token the service was started with>",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


def _problem(status: int, reason: str, error: str | None = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    """The error response; ``error`` by default the status's phrase in snake case."""
    error = error or HTTPStatus(status).phrase.lower().replace(" ", "_")
    return JSONResponse(Problem(error=error, reason=reason).model_dump(), status, headers)


def _invalid(error: dict[str, Any]) -> str:
    """A validation error as a reason: where, what, and the value sent when it is one."""
    reason = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
    value = error.get("input")
    if error["type"] == "missing" or isinstance(value, dict | list):
        return reason
    shown = json.dumps(value, default=str)
    return f"{reason} (got {shown if len(shown) <= 80 else shown[:77] + '...'})"


def _json(content: dict[str, Any]) -> Response:
    """``content`` (numpy arrays and numbers included) as a JSON response."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")


def _edges(edges: EdgeList) -> Edges:
    order = np.argsort(edges.ids)
    return Edges(ids=edges.ids[order].tolist(), weights=edges.weights[order].tolist())


class BodyLimit:
    """ASGI middleware: a request body past ``limit`` bytes gets a 413 (declared in
    Content-Length, or counted as it streams in)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await _problem(413, self._reason)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, self._reason)
            return message

        await self.app(scope, counted, send)

    @property
    def _reason(self) -> str:
        return f"the request body is larger than {self.limit:,} bytes"
