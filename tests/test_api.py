"""The REST API against a real service: a tiny engine served by `Service.run` on a thread
(in-memory transport), uvicorn on a free port, httpx as the client. Expected values are
read through the same `Reads` queue, so they come from the very state the answer read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

import streamgnn as sg
from streamgnn.api.app import create_app
from streamgnn.api.bind import parse_bind
from streamgnn.api.server import HttpServer
from streamgnn.router import BatchReport, Service, ServiceConfig
from streamgnn.router.reads import Reads
from streamgnn.stream import encode
from streamgnn.stream.memory import MemoryBroker, MemoryTransport
from tests.test_stream import tiny_setup


class Running:
    """A service serving reads on a thread, and a client of its HTTP server."""

    def __init__(self, token: str | None = None,
                 on_batch: Callable[[BatchReport], None] | None = None) -> None:
        _, self.snapshot, self.events, model = tiny_setup()
        self.broker, self.config = MemoryBroker(), ServiceConfig(batch_size=20)
        self.reads = Reads()
        self.server = HttpServer(self.reads, "127.0.0.1", 0, token).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=120)
        self.service = Service(sg.Engine.from_pyg(model.model(), self.snapshot), model,
                               MemoryTransport(self.broker, self.config.topics.updates),
                               self.config, reads=self.reads)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.service.run,
                                       kwargs={"stop": self.stop.is_set,
                                               "on_batch": on_batch})

    def __enter__(self) -> Running:
        self.thread.start()
        while not self.reads.ready:
            time.sleep(0.01)
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join()
        self.http.close()
        self.server.stop()

    def now(self, read):
        """``read(service)`` on the service loop, as the API's reads run."""
        return self.reads.submit(read).result(timeout=120)

    def produce(self, updates: list[sg.Update]) -> None:
        for u in updates:
            self.broker.produce(self.config.topics.updates, encode(u))


@pytest.fixture(scope="module")
def running():
    with Running() as r:
        yield r


def test_a_vertex_read_equals_engine_lookup_and_label_and_names_the_batch(running):
    ids = [int(i) for i in running.snapshot.ids[:5]]
    for layer in (-1, 0, 1, 2, -3):
        for v in ids:
            got = running.http.get(f"/v1/vertices/{v}", params={"layer": layer})
            assert got.status_code == 200, got.text
            body = got.json()
            row, label, batch = running.now(lambda s, v=v, layer=layer: (
                s.engine.lookup([v], layer)[0], int(s.engine.label([v])[0]), s.batch_seq))
            assert body["id"] == v and body["layer"] == layer % 3 and body["batch"] == batch
            assert body["label"] == label
            assert np.array_equal(np.array(body["embedding"], np.float32), row)


def test_a_lookup_equals_engine_lookup_in_request_order(running):
    ids = [int(i) for i in running.snapshot.ids[[7, 3, 7, 40]]]
    got = running.http.post("/v1/vertices/lookup", json={"ids": ids, "layer": 1})
    assert got.status_code == 200, got.text
    rows, labels = running.now(lambda s: (s.engine.lookup(ids, 1), s.engine.label(ids)))
    body = got.json()
    assert body["ids"] == ids and body["labels"] == labels.tolist()
    assert np.array_equal(np.array(body["embeddings"], np.float32), rows)


def test_vertex_reads_are_answered_while_the_loop_is_busy():
    """The loop is held right after a batch (as it is while it applies the next one):
    vertex reads and lookups still answer, from the state after that batch. With reads
    queued for the loop they would wait until it is released."""
    held, release = threading.Event(), threading.Event()

    def hold(_: BatchReport) -> None:
        held.set()
        release.wait(120)

    with Running(on_batch=hold) as r:
        try:
            r.produce(r.events)
            # (the first batch compiles the numba kernels where their cache is cold: about
            # a minute with bounds checks on these 2 cores)
            assert held.wait(300)
            engine, batch = r.service.engine, r.service.batch_seq
            ids = [int(i) for i in r.snapshot.ids[:3]]
            got = r.http.get(f"/v1/vertices/{ids[0]}", params={"layer": 1}, timeout=30)
            assert got.status_code == 200 and got.json()["batch"] == batch >= 1
            assert np.array_equal(np.array(got.json()["embedding"], np.float32),
                                  engine.lookup(ids[:1], 1)[0])
            got = r.http.post("/v1/vertices/lookup", json={"ids": ids}, timeout=30).json()
            assert got["batch"] == batch and got["labels"] == engine.label(ids).tolist()
            assert np.array_equal(np.array(got["embeddings"], np.float32), engine.lookup(ids))
            assert r.service.batch_seq == batch  # the loop was held all along
        finally:
            release.set()


def test_neighbors_are_the_graph_in_and_out_edges_with_weights(running):
    v = int(running.snapshot.ids[3])
    body = running.http.get(f"/v1/vertices/{v}/neighbors").json()
    src, dst, w = running.now(lambda s: s.engine.edges())
    for side, mine, other in (("in", dst, src), ("out", src, dst)):
        at = np.flatnonzero(mine == v)
        order = np.argsort(other[at])
        assert body[side]["ids"] == other[at][order].tolist()
        assert body[side]["weights"] == w[at][order].tolist()
    assert body["in"]["ids"] or body["out"]["ids"]


def test_a_query_is_answered_as_engine_query_answers_it(running):
    v, w = (int(i) for i in running.snapshot.ids[:2])
    f = running.snapshot.num_features
    req = sg.QueryRequest(vertices=[sg.QueryVertex(id=-1, x=[0.5] * f),
                                    sg.QueryVertex(id=-2, x=[0.25] * f)],
                          edges=[sg.QueryEdge(src=-1, dst=v), sg.QueryEdge(src=w, dst=-1),
                                 sg.QueryEdge(src=-2, dst=-1)], budget=0.5, embeddings=True)
    got = running.http.post("/v1/queries", content=encode(req),
                            headers={"content-type": "application/json"})
    assert got.status_code == 200, got.text
    want, batch = running.now(lambda s: (s.engine.query(req), s.batch_seq))
    body = got.json()
    assert body["request_id"] == req.event_id and body["batch"] == batch
    assert body["ids"] == [-1, -2] and body["labels"] == want.labels.tolist()
    assert body["budget"] == 0.5 and body["policy"] == "top-ratio"
    assert body["recomputed"] == sum(len(r) for r in want.recomputed)
    assert np.array_equal(np.array(body["embeddings"], np.float32), want.embeddings)
    assert body["latency_ms"] > 0


def test_the_batch_number_advances_and_added_vertices_become_readable(running):
    added = next(u for u in running.events if isinstance(u, sg.AddVertex))
    gone = running.http.get(f"/v1/vertices/{added.id}")
    assert gone.status_code == 404 and f"vertex {added.id} " in gone.json()["reason"]
    before = running.http.get("/v1/status").json()["batch"]
    running.produce(running.events)
    while sum((status := running.http.get("/v1/status").json())["applied"].values()) + sum(
            status["dead_letters"].values()) < len(running.events):
        time.sleep(0.05)
    assert status["positions"] == {"0": len(running.events)} and status["lag"] == 0
    assert status["applied"].get("add_vertex", 0) > 0 and status["label_changes"] > 0
    got = running.http.get(f"/v1/vertices/{added.id}").json()
    assert got["batch"] == status["batch"] > before


@pytest.mark.parametrize(("method", "path", "body", "status", "error"), [
    ("get", "/v1/vertices/987654321", None, 404, "unknown_vertex"),
    ("post", "/v1/vertices/lookup", {"ids": [3655, 987654321]}, 404, "unknown_vertex"),
    ("get", "/v1/vertices/987654321/neighbors", None, 404, "unknown_vertex"),
    ("get", "/v1/vertices/abc", None, 422, "invalid_request"),
    ("get", f"/v1/vertices/{2**63}", None, 422, "invalid_request"),
    ("get", "/v1/vertices/0?layer=3", None, 422, "invalid_query"),
    ("post", "/v1/vertices/lookup", {"ids": []}, 422, "invalid_request"),
    ("post", "/v1/vertices/lookup", {"ids": list(range(10_001))}, 422, "invalid_request"),
    ("post", "/v1/vertices/lookup", {"ids": [0], "extra": 1}, 422, "invalid_request"),
    ("post", "/v1/queries", {"vertices": [{"id": -1, "x": [0.0]}]}, 422, "wrong_dimension"),
    ("post", "/v1/queries", {"vertices": []}, 422, "invalid_query"),
    ("post", "/v1/queries", {"vertices": [{"id": -1, "x": []}], "budget": 2}, 422,
     "invalid_request"),
    ("post", "/v1/queries", "{not json", 422, "invalid_request"),
])
def test_bad_requests_get_the_status_and_error_naming_the_problem(running, method, path,
                                                                  body, status, error):
    if isinstance(body, str):
        got = running.http.request(method, path, content=body,
                                   headers={"content-type": "application/json"})
    else:
        got = running.http.request(method, path, json=body)
    assert got.status_code == status, got.text
    assert got.json()["error"] == error and got.json()["reason"]
    if status == 404:
        assert "987654321" in got.json()["reason"]


def test_an_insert_or_unknown_edge_in_a_query_is_refused_with_its_reason(running):
    f = running.snapshot.num_features
    one = {"vertices": [{"id": -1, "x": [0.0] * f}]}
    got = running.http.post("/v1/queries", json={**one, "insert": True})
    assert got.status_code == 422 and "insert" in got.json()["reason"]
    got = running.http.post("/v1/queries", json={**one, "edges": [{"src": -1, "dst": 10**12}]})
    assert got.status_code == 404 and got.json()["error"] == "unknown_vertex"


def test_a_body_past_the_limit_is_refused_declared_or_streamed(running):
    big = b"[" + b"0," * (9 << 20) + b"0]"
    got = running.http.post("/v1/vertices/lookup", content=big)
    assert got.status_code == 413 and "larger than" in got.json()["reason"]
    got = running.http.post("/v1/vertices/lookup", content=iter([big]))  # chunked
    assert got.status_code == 413


def test_metrics_are_prometheus_text_of_the_service_counters(running):
    text = running.http.get("/metrics").text
    for name in ("streamgnn_batch_seconds histogram", "streamgnn_updates_applied_total counter",
                 "streamgnn_update_latency_seconds histogram", "streamgnn_consumer_lag gauge",
                 "streamgnn_query_latency_seconds histogram", "streamgnn_queries_total counter",
                 "streamgnn_dead_letters_total counter"):
        assert f"# TYPE {name}" in text
    events = running.now(lambda s: s.stats.events)
    assert f"streamgnn_events_consumed_total {events:.1f}" in text
    assert running.http.get("/healthz").json() == {"status": "ok"}
    assert running.http.get("/readyz").json() == {"status": "ready"}


def test_readyz_and_reads_answer_503_until_the_service_loop_runs():
    reads = Reads()
    server = HttpServer(reads, "127.0.0.1", 0).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/healthz").status_code == 200
            assert http.get("/readyz").status_code == 503
            got = http.get("/v1/vertices/1")
            assert got.status_code == 503 and got.json()["error"] == "not_ready"
            assert http.get("/metrics").text == ""
    finally:
        server.stop()


def test_a_token_is_required_on_v1_and_metrics_but_not_on_health_probes():
    with Running(token="s3cret") as r:
        v = int(r.snapshot.ids[0])
        assert r.http.get(f"/v1/vertices/{v}").status_code == 401
        wrong = r.http.get(f"/v1/vertices/{v}", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert r.http.get("/metrics").status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert r.http.get(f"/v1/vertices/{v}", headers=ok).status_code == 200
        assert r.http.get("/metrics", headers=ok).status_code == 200
        assert r.http.get("/healthz").status_code == r.http.get("/readyz").status_code == 200


def test_binding_beyond_loopback_needs_a_token():
    assert parse_bind("off", None) is None
    assert parse_bind("127.0.0.1:8080", None) == ("127.0.0.1", 8080)
    assert parse_bind("[::1]:9000", None) == ("::1", 9000)
    assert parse_bind("localhost:1", None) == ("localhost", 1)
    assert parse_bind("0.0.0.0:8080", "t") == ("0.0.0.0", 8080)
    for bind in ("0.0.0.0:8080", "example.com:80", "[::]:8080"):
        with pytest.raises(ValueError, match="needs a bearer token"):
            parse_bind(bind, None)
    for bind in ("8080", "host:", "host:99999", ":80"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_bind(bind, None)


def test_a_port_in_use_fails_at_once_naming_it():
    first = HttpServer(Reads(), "127.0.0.1", 0)
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        HttpServer(Reads(), "127.0.0.1", first.port)
    first.stop()


def test_schemathesis_finds_no_server_error(running):
    """Every operation of the OpenAPI schema, fuzzed against the app (called as ASGI, the
    service loop answering): no 5xx, every response as documented. Schema-valid requests
    may still be refused with a 422 (a layer the model does not have, features of the
    wrong dimension, a query edge joining two existing vertices): the schema cannot say
    what depends on the model and the graph, so that one check is left out."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(running.reads))
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def check(case) -> None:
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        check()
