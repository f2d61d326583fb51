"""Query serving against PyG: exact answers equal PyG's forward pass on the graph plus the
query for every layer type, partition count and placement, and leave the engine as it
was; SRPE equals the same layers fed the stored rows of the vertices it did not
recompute; the policies, insertion and every bad request."""

from __future__ import annotations

import copy

import numpy as np
import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.workers import Engine
from streamgnn.workers.executors import Calibration, calibrate
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import pyg_layers, pyg_step, random_graph
from tests.reference import Reference
from tests.test_engine import POOL, start_graph, update, valid_batch

QUERY_IDS = 1000  # query vertices get ids from here (the graph uses 0..19)


@st.composite
def queries(draw, existing: int = 20) -> sg.QueryRequest:
    """1 to 4 new vertices; edges from and to existing vertices and between query
    vertices, each pair once, weights as the graph's."""
    n = draw(st.integers(1, 4))
    row = st.lists(st.floats(-2, 2, width=32), min_size=F_IN, max_size=F_IN)
    vertices = [sg.QueryVertex(id=QUERY_IDS + i, x=draw(row)) for i in range(n)]
    ends = st.tuples(st.integers(0, n - 1), st.integers(-n, existing - 1), st.booleans(),
                     st.floats(0.125, 2.0, width=32))
    pairs = {}
    for q, other, into, w in draw(st.lists(ends, max_size=12)):
        other = QUERY_IDS + (-other - 1) if other < 0 else other
        a, b = (other, QUERY_IDS + q) if into else (QUERY_IDS + q, other)
        if a != b:
            pairs[(a, b)] = w
    edges = [sg.QueryEdge(src=a, dst=b, weight=w) for (a, b), w in pairs.items()]
    return sg.QueryRequest(vertices=vertices, edges=edges)


def columns(req: sg.QueryRequest) -> sg.QueryColumns:
    """``req`` as arrays."""
    return sg.QueryColumns(np.array([v.id for v in req.vertices], np.int64),
                           np.array([v.x for v in req.vertices], np.float32),
                           np.array([e.src for e in req.edges], np.int64),
                           np.array([e.dst for e in req.edges], np.int64),
                           np.array([e.weight for e in req.edges], np.float32))


def with_query(data: sg.GraphData, req: sg.QueryRequest) -> sg.GraphData:
    """The graph ``data`` plus the query's vertices and edges."""
    return sg.GraphData(
        ids=np.concatenate([data.ids, [v.id for v in req.vertices]]),
        src=np.concatenate([data.src, [e.src for e in req.edges]]).astype(np.int64),
        dst=np.concatenate([data.dst, [e.dst for e in req.edges]]).astype(np.int64),
        x=np.concatenate([data.x, np.array([v.x for v in req.vertices], np.float32)]),
        weight=np.concatenate([data.weight, np.array([e.weight for e in req.edges],
                                                     np.float32)]))


def reference(model: torch.nn.Module, data: sg.GraphData, req: sg.QueryRequest,
              recomputed: list[np.ndarray] | None = None) -> np.ndarray:
    """PyG's layers on the graph plus the query, at the query vertices. With
    ``recomputed`` (per layer, the existing vertices SRPE recomputed) every other existing
    vertex's row is replaced by its row on the graph alone after each layer: what SRPE
    computes. Without: PyG's forward pass on the graph plus the query."""
    full = with_query(data, req)
    if recomputed is None:
        return pyg_layers(model, full, torch.float64)[-1][len(data.ids):].numpy()
    stored = pyg_layers(model, data, torch.float64)
    g = full.to_pyg()
    h, n = g.x.double(), len(data.ids)
    for i, ids in enumerate(recomputed):
        out = pyg_step(model, i, h, g.edge_index, g.edge_weight.double())
        keep = ~np.isin(data.ids, ids)
        out[:n][torch.from_numpy(keep)] = stored[i + 1][torch.from_numpy(keep)]
        h = out
    return h[n:].numpy()


@settings(max_examples=60, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       partitions=st.integers(1, 4), placement=st.sampled_from(["metis", "hash", "stream"]),
       seed=st.integers(0, 10_000), req=queries())
def test_exact_queries_equal_pyg_on_the_graph_plus_the_query(arch, num_layers, partitions,
                                                            placement, seed, req):
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions, placement=placement)
    before = engine.snapshot()
    res = engine.query(req)
    want = reference(model, data, req)
    assert res.ids.tolist() == [v.id for v in req.vertices]
    assert np.abs(res.embeddings - want).max() <= 1e-9
    assert res.labels.tolist() == want.argmax(axis=1).tolist()
    assert np.array_equal(engine.query(columns(req)).embeddings, res.embeddings)
    after = engine.snapshot()
    assert before.keys() == after.keys()
    for k in before:
        assert np.array_equal(before[k], after[k]), k  # the query left no trace


@settings(max_examples=30, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       partitions=st.integers(1, 3), seed=st.integers(0, 10_000), req=queries())
def test_exact_queries_of_a_float32_engine_are_within_1e_4_of_pyg(arch, num_layers,
                                                                  partitions, seed, req):
    """A float32 engine aggregates the stored features and rows in place (a double one
    copies them): the contract's 1e-4 against the float64 forward pass."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed)
    engine = Engine.from_pyg(model, data, partitions=partitions)
    res = engine.query(columns(req))
    want = reference(copy.deepcopy(model), data, req)
    assert np.abs(res.embeddings - want).max() <= 1e-4


@settings(max_examples=30, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       partitions=st.integers(1, 3), budget=st.sampled_from([None, 0.5]),
       policy=st.sampled_from(sg.queries.POLICIES), seed=st.integers(0, 10_000),
       batches=st.lists(st.lists(update, max_size=40), min_size=2, max_size=4),
       req=queries(existing=POOL))
def test_queries_after_a_stream_with_vertex_deletions_equal_pyg(arch, num_layers, partitions,
                                                                budget, policy, seed,
                                                                batches, req):
    """After batches that delete and add vertices (the slots of deleted ones are reused),
    a query reads the graph as it is now: its edges to vertices still there are kept."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
    known = {*engine.vertex_ids().tolist(), *(v.id for v in req.vertices)}
    req = sg.QueryRequest(vertices=req.vertices,
                          edges=[e for e in req.edges if {e.src, e.dst} <= known])
    current = engine.to_data()
    res = engine.query(req, budget=budget, policy=policy)
    want = reference(model, current, req, None if budget is None else res.recomputed)
    assert np.abs(res.embeddings - want).max() <= 1e-9


@settings(max_examples=40, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       partitions=st.integers(1, 3), budget=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
       policy=st.sampled_from(sg.queries.POLICIES), seed=st.integers(0, 10_000),
       req=queries())
def test_srpe_equals_the_layers_fed_the_rows_it_reused(arch, num_layers, partitions, budget,
                                                       policy, seed, req):
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    res = engine.query(req, budget=budget, policy=policy)
    assert len(res.recomputed) == num_layers
    assert len(res.recomputed[-1]) == 0  # the last layer computes the query vertices only
    chosen = np.unique(np.concatenate(res.recomputed))
    assert len(chosen) == min(res.candidates, int(np.ceil(round(budget * res.candidates, 9))))
    if budget == 0.0:
        assert not len(chosen)
    want = reference(model, data, req, res.recomputed)
    assert np.abs(res.embeddings - want).max() <= 1e-9


@settings(max_examples=30, deadline=None)
@given(arch=st.sampled_from(sorted(a for a in ARCHS if "gcn" not in a)),
       seed=st.integers(0, 10_000), req=queries())
def test_srpe_with_the_whole_budget_is_exact_for_two_layers(arch, seed, req):
    """With two layers only the query's direct targets change below the last layer, so
    gamma = 1 recomputes all of them (GCN also changes their out-neighbors' degrees
    terms: left out)."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](2), seed).double()
    engine = Engine.from_pyg(model, data)
    res = engine.query(req, budget=1.0)
    assert np.abs(res.embeddings - reference(model, data, req)).max() <= 1e-9


def test_a_batch_of_queries_is_answered_in_one_pass_like_one_at_a_time():
    data = start_graph(5)
    model = randomise(ARCHS["pyg-gat"](2), 5).double()
    engine = Engine.from_pyg(model, data, partitions=2)
    rng = np.random.default_rng(0)
    reqs = [sg.QueryRequest(
        vertices=[sg.QueryVertex(id=QUERY_IDS + i, x=rng.standard_normal(F_IN).tolist())],
        edges=[sg.QueryEdge(src=QUERY_IDS + i, dst=int(rng.integers(20))),
               sg.QueryEdge(src=int(rng.integers(20)), dst=QUERY_IDS + i)])
        for i in range(50)]
    together = engine.query(sg.QueryRequest(
        vertices=[v for r in reqs for v in r.vertices], edges=[e for r in reqs for e in r.edges]),
        budget=0.0)
    alone = np.concatenate([engine.query(r, budget=0.0).embeddings for r in reqs])
    assert np.abs(together.embeddings - alone).max() <= 1e-9


def test_policies_rank_candidates_as_omega_does():
    """Candidates 0..3 receive query edges; top-ratio takes the highest share of query
    in-edges (ties to the smaller id), degree the highest importance score, random a
    seeded choice."""
    ids = np.arange(8)
    # in-edges from the graph: 0 has 3, 1 has 1, 2 has 1, 3 has 0
    src = np.array([4, 5, 6, 7, 4])
    dst = np.array([0, 0, 0, 1, 2])
    data = sg.GraphData(ids=ids, src=src, dst=dst, x=np.ones((8, F_IN), np.float32))
    model = randomise(ARCHS["sage-sum"](2), 0).double()
    engine = Engine.from_pyg(model, data)
    req = sg.QueryRequest(
        vertices=[sg.QueryVertex(id=100, x=[0.5] * F_IN)],
        edges=[sg.QueryEdge(src=100, dst=v) for v in range(4)]
        + [sg.QueryEdge(src=v, dst=100) for v in range(4)])
    top = engine.query(req, budget=0.5)  # ratios 1/4, 1/2, 1/2, 1/1 -> 3, then 1 (tie)
    assert top.candidates == 4
    assert sorted(top.recomputed[0].tolist()) == [1, 3]
    random = [engine.query(req, budget=0.5, policy="random").recomputed[0].tolist()
              for _ in range(2)]
    assert random[0] == random[1] and len(random[0]) == 2
    degree = engine.query(req, budget=0.25, policy="degree")
    # IS: 0 (1/4)(1 + 1 + 1 + 1/4), 1 (1/2)(1 + 1/4), 2 the same, 3 (1/1)(1/4): 100 has 4
    assert degree.recomputed[0].tolist() == [0]


def test_insert_applies_the_query_and_answers_from_the_result():
    data = start_graph(7)
    model = randomise(ARCHS["pyg-gcn"](2), 7).double()
    engine = Engine.from_pyg(model, data, partitions=2)
    req = sg.QueryRequest(vertices=[sg.QueryVertex(id=500, x=[0.1] * F_IN)],
                          edges=[sg.QueryEdge(src=500, dst=3), sg.QueryEdge(src=4, dst=500)])
    exact = engine.query(req)
    res = engine.query(req, insert=True)
    assert np.abs(res.embeddings - exact.embeddings).max() <= 1e-9
    assert 500 in engine.vertex_ids() and 500 in res.changed_labels
    with pytest.raises(sg.DuplicateVertexError, match="already in the graph"):
        engine.query(req)


BAD = [
    ({"vertices": []}, sg.InvalidQueryError, "1 to 4096 vertices"),
    ({"vertices": [{"id": 3, "x": [0.0] * F_IN}]}, sg.DuplicateVertexError, "already in"),
    ({"vertices": [{"id": 900, "x": [0.0] * 2}]}, sg.FeatureDimensionError, "2 features"),
    ({"vertices": [{"id": 900, "x": [float("nan")] * F_IN}]}, sg.NonFiniteValueError, "NaN"),
    ({"vertices": [{"id": 900, "x": [1e9] * F_IN}]}, sg.OutOfRangeError, "beyond"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}, {"id": 900, "x": [0.0] * F_IN}]},
     sg.DuplicateVertexError, "twice"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}], "edges": [{"src": 900, "dst": 77777}]},
     sg.UnknownVertexError, "77777 is neither"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}], "edges": [{"src": 1, "dst": 2}]},
     sg.InvalidQueryError, "joins two existing"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}], "edges": [{"src": 900, "dst": 900}]},
     sg.SelfLoopError, "self-loop"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}],
      "edges": [{"src": 900, "dst": 1}, {"src": 900, "dst": 1}]}, sg.DuplicateEdgeError,
     "twice"),
    ({"vertices": [{"id": 900, "x": [0.0] * F_IN}],
      "edges": [{"src": 900, "dst": 1, "weight": float("inf")}]}, sg.NonFiniteValueError,
     "weight"),
    ({"vertices": [{"id": 900 + i, "x": [0.0] * F_IN} for i in range(4097)]},
     sg.InvalidQueryError, "1 to 4096"),
]


@pytest.mark.parametrize("form", ["request", "columns"])
@pytest.mark.parametrize(("body", "error", "match"), BAD)
def test_a_bad_query_raises_the_error_naming_it_and_changes_nothing(body, error, match,
                                                                    form):
    data = start_graph(1)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), 1).double(), data)
    before = engine.snapshot()
    req = sg.QueryRequest(**body)
    if form == "columns":
        if not req.vertices:
            req = sg.QueryColumns(np.zeros(0, np.int64), np.zeros((0, F_IN)))
        elif len({len(v.x) for v in req.vertices}) == 1:
            req = columns(req)
    with pytest.raises(error, match=match):
        engine.query(req, insert=True)
    assert all(np.array_equal(v, engine.snapshot()[k]) for k, v in before.items())


@pytest.mark.parametrize(("cols", "match"), [
    (dict(ids=np.array([900.5]), x=np.zeros((1, F_IN))), "integer vertex ids"),
    (dict(ids=np.array([900, 901]), x=np.zeros((1, F_IN))), "one feature row per id"),
    (dict(ids=np.array([900]), x=np.zeros((1, F_IN)), src=np.array([900, 900]),
          dst=np.array([1])), "one entry per edge"),
    (dict(ids=np.array([900]), x=[["a"] * F_IN]), "numbers expected"),
    (dict(ids=np.array([2**64 - 1], np.uint64), x=np.zeros((1, F_IN))), "int64 range"),
])
def test_query_columns_of_the_wrong_shape_or_type_are_refused(cols, match):
    data = start_graph(1)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), 1).double(), data)
    with pytest.raises(sg.InvalidQueryError, match=match):
        engine.query(sg.QueryColumns(**cols))


def test_a_budget_outside_zero_to_one_is_refused():
    data = start_graph(1)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), 1).double(), data)
    req = sg.QueryRequest(vertices=[sg.QueryVertex(id=900, x=[0.0] * F_IN)])
    with pytest.raises(sg.InvalidQueryError, match="less than or equal to 1"):
        engine.query(req, budget=1.5)


@pytest.mark.parametrize("arch", ["pyg-gcn", "gcn-improved"])
def test_exact_gcn_sees_the_in_degree_the_query_changes_two_hops_away(arch):
    """q -> v changes v's in-degree, so GCN's messages v -> w change at every layer though
    v's row at layer 0 does not; w -> q brings that to the answer."""
    data = start_graph(11)
    src, dst, _ = (np.asarray(a) for a in (data.src, data.dst, data.weight))
    v, w = int(src[0]), int(dst[0])
    model = randomise(ARCHS[arch](2), 11).double()
    engine = Engine.from_pyg(model, data)
    req = sg.QueryRequest(vertices=[sg.QueryVertex(id=QUERY_IDS, x=[0.3] * F_IN)],
                          edges=[sg.QueryEdge(src=QUERY_IDS, dst=v, weight=1.5),
                                 sg.QueryEdge(src=w, dst=QUERY_IDS)])
    res = engine.query(req)
    assert w in res.recomputed[0]
    assert np.abs(res.embeddings - reference(model, data, req)).max() <= 1e-9


def test_the_service_answers_queries_between_batches_and_names_what_is_wrong():
    """Requests on the query topic, through the in-memory transport: each good one is
    answered from the state after the last batch (named), as `Engine.query` answers it;
    each bad one gets an error result naming the problem; the loop never stops."""
    from streamgnn.router import Service, ServiceConfig
    from streamgnn.stream import QueryResult, Topics, encode
    from streamgnn.stream.memory import MemoryBroker, MemoryTransport
    from tests.test_faults import setup

    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    topics = Topics()
    broker = MemoryBroker()
    for u in events:
        broker.produce(topics.updates, encode(u))
    config = ServiceConfig(batch_size=40, topics=topics)
    service = Service.open(lambda: model, lambda m: Engine.from_pyg(m.model(), snapshot),
                           MemoryTransport(broker, topics.updates), config,
                           queries=MemoryTransport(broker, topics.queries))
    service.run(idle_exit_s=0.3)
    assert service.batch_seq > 1

    v, w = (int(i) for i in data.ids[:2])
    f = data.num_features
    good = [sg.QueryRequest(vertices=[sg.QueryVertex(id=-1, x=[0.5] * f)],
                            edges=[sg.QueryEdge(src=-1, dst=v), sg.QueryEdge(src=w, dst=-1)]),
            sg.QueryRequest(vertices=[sg.QueryVertex(id=-1, x=[0.1] * f),
                                      sg.QueryVertex(id=-2, x=[0.2] * f)],
                            edges=[sg.QueryEdge(src=-2, dst=-1), sg.QueryEdge(src=v, dst=-2)],
                            budget=0.5, embeddings=True)]
    one = {"vertices": [{"id": -1, "x": [0.0] * f}]}
    bad = [(b"{not json", "malformed_json"),
           (b'{"vertices": [], "budget": 2}', "invalid_fields"),
           (orjson.dumps({**one, "policy": "best"}), "invalid_fields"),
           (orjson.dumps({"vertices": [{"id": v, "x": [0.0] * f}]}), "duplicate_vertex"),
           (orjson.dumps({**one, "edges": [{"src": v, "dst": w}]}), "invalid_query"),
           (orjson.dumps({**one, "edges": [{"src": -1, "dst": 10**12}]}), "unknown_vertex"),
           (orjson.dumps({"vertices": [{"id": -1, "x": [0.0]}]}), "wrong_dimension"),
           (b'{"vertices": [{"id": -1, "x": [NaN' + b", 0.0" * (f - 1) + b"]}]}",
            "non_finite"),
           (orjson.dumps({"vertices": []}), "invalid_query"),
           (orjson.dumps({**one, "insert": True}), "invalid_query"),
           (None, "tombstone")]
    for req in good[:1]:
        broker.produce(topics.queries, encode(req))
    for raw, _ in bad:
        broker.produce(topics.queries, raw)
    for req in good[1:]:
        broker.produce(topics.queries, encode(req))
    service.run(idle_exit_s=0.3)

    results = [QueryResult.model_validate_json(r.value) for r in broker.records(topics.results)]
    assert [r.error for r in results] == [None] + [kind for _, kind in bad] + [None]
    assert all(r.reason for r in results[1:-1]) and service.stats.queries["answered"] == 2
    for req, res in zip(good, (results[0], results[-1]), strict=True):
        want = service.engine.query(req)
        assert res.request_id == req.event_id and res.batch == service.batch_seq
        assert res.ids == want.ids.tolist() and res.labels == want.labels.tolist()
        assert res.budget == req.budget and res.latency_ms > 0
    assert results[0].embeddings is None
    assert np.abs(np.array(results[-1].embeddings) - service.engine.query(good[1]).embeddings
                  ).max() <= 1e-6
    assert len({r.event_id for r in results}) == len(results)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30,
          deadline=None)  # the fixture only patches
@given(arch=st.sampled_from(sorted(ARCHS)), partitions=st.integers(1, 3),
       seed=st.integers(0, 10_000), req=queries())
def test_exact_queries_with_the_device_kernels(device_kernels, arch, partitions, seed, req):
    """What a cuda executor runs (the torch twins of the CPU kernels), on CPU."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](2), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    res = engine.query(req)
    assert np.abs(res.embeddings - reference(model, data, req)).max() <= 1e-9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cuda_executor_answers_as_pyg(arch):
    """An engine on CPU whose query batches run on cuda, and an engine on cuda."""
    data = start_graph(3)
    model = randomise(ARCHS[arch](2), 3).double()
    req = sg.QueryRequest(vertices=[sg.QueryVertex(id=QUERY_IDS, x=[0.2] * F_IN)],
                          edges=[sg.QueryEdge(src=QUERY_IDS, dst=1),
                                 sg.QueryEdge(src=2, dst=QUERY_IDS)])
    want = reference(model, data, req)
    on_cpu = Engine.from_pyg(copy.deepcopy(model), data, partitions=2)
    res = on_cpu.query(req, device="cuda")
    assert res.device == "cuda:0" or res.device == "cuda"
    assert np.abs(res.embeddings - want).max() <= 1e-9
    on_cuda = Engine.from_pyg(copy.deepcopy(model), data, device="cuda")
    assert np.abs(on_cuda.query(req).embeddings - want).max() <= 1e-9


def test_the_dispatcher_picks_cuda_from_the_calibrated_work_on():
    cal = Calibration.fit([(10, 1.0, 3.0), (1_000, 5.0, 4.0), (100_000, 50.0, 6.0)])
    assert cal.cuda_from == 1_000
    assert Calibration.fit([(10, 1.0, 3.0), (1_000, 5.0, None)]).cuda_from is None
    data = start_graph(3)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-gcn"](2), 3).double(), data)
    ex = engine.executors
    assert ex.pick(lambda: 10**9) == torch.device("cpu")  # one device, or not calibrated
    ex.devices, ex.calibration = [torch.device("cpu"), torch.device("cuda")], cal
    assert ex.pick(lambda: 999) == torch.device("cpu")
    assert ex.pick(lambda: 1_000) == torch.device("cuda")


def test_a_calibration_file_round_trips(tmp_path):
    cal = Calibration.fit([(10, 1.0, 3.0), (1_000, 5.0, 4.0)])
    cal.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json") == cal


@pytest.mark.parametrize("partitions", [1, 2])
def test_calibrate_times_query_batches_of_every_size_on_each_device(partitions):
    data = start_graph(3)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), 3).double(), data,
                             partitions=partitions)
    cal = calibrate(engine, sizes=(1, 4, 16), repeats=1, progress=False)
    work = [w for w, _, _ in cal.measured]
    assert len(work) == 3 and work == sorted(work) and work[0] > 0
    assert all(cpu > 0 and (cuda is None) == (not torch.cuda.is_available())
               for _, cpu, cuda in cal.measured)


@pytest.mark.parametrize(("partitions", "budget"), [(1, None), (1, 0.5), (2, None), (2, 0.5)],
                         ids=["exact", "srpe", "cgp", "cgp-srpe"])
@pytest.mark.parametrize("arch", ["graphconv-add", "pyg-gcn", "pyg-sage-mean", "pyg-gat",
                                  "graphconv-max"])
def test_a_query_batch_crosses_to_the_device_a_fixed_number_of_times(device_kernels, arch,
                                                                     partitions, budget):
    """Counted on the device-kernel path (what a GPU batch crosses), whatever the batch's
    size, arch and mode: 2 crossings. The shards run in this process on the executor's
    device: the host lays out every layer (edges, degree-normalised layers' source scales
    as host arrays, the shards' edges, the rows they transform and those rows' features),
    the executor hands it all over in one upload, the shards compute their stored rows
    and partial aggregates from those tensors where they are (taking attention's
    destination parts as tensors there too), and the answer comes back in one download:
    1 upload + 1 download."""
    from streamgnn.crossings import counted

    num_layers = 2
    data = random_graph(np.random.default_rng(1), n=600, m=3000, d=F_IN)
    model = randomise(ARCHS[arch](num_layers), 1).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    rng = np.random.default_rng(0)
    ids = np.asarray(data.ids)
    for n in (1, 64, 512):
        new = int(ids.max()) + 1 + np.arange(n)
        a, b = rng.choice(ids, n), rng.choice(ids, n)
        req = sg.QueryColumns(new, rng.standard_normal((n, F_IN)).astype(np.float32),
                              np.concatenate([new, a]), np.concatenate([b, new]))
        with counted() as seen:
            engine.query(req, budget=budget)
        assert seen.total == 2, (n, seen.sites(100))


@pytest.mark.parametrize("arch", ["graphconv-add", "pyg-gcn", "pyg-sage-mean", "pyg-gat",
                                  "graphconv-max"])
def test_shards_answering_with_host_arrays_give_the_same_bits(monkeypatch, arch):
    """The shards' two ways of doing their part of a query: as work on the executor's
    device (in this process, `Workers.held`) and as host arrays (as under MPI, or on
    another device than the executor's, attention's parts then going as host rows):
    the same answers bit for bit, and the same bytes counted."""
    data = random_graph(np.random.default_rng(1), n=600, m=3000, d=F_IN)
    engine = Engine.from_pyg(randomise(ARCHS[arch](2), 1).double(), data, partitions=2)
    rng = np.random.default_rng(0)
    ids = np.asarray(data.ids)
    new = int(ids.max()) + 1 + np.arange(64)
    a, b = rng.choice(ids, 64), rng.choice(ids, 64)
    req = sg.QueryColumns(new, rng.standard_normal((64, F_IN)).astype(np.float32),
                          np.concatenate([new, a]), np.concatenate([b, new]))
    for budget in (None, 0.5):
        held = engine.query(req, budget=budget)
        with monkeypatch.context() as m:
            m.setattr(type(engine.workers), "held", False)
            host = engine.query(req, budget=budget)
        np.testing.assert_array_equal(held.embeddings, host.embeddings)
        assert (held.sent_bytes, held.received_bytes, held.pull_bytes) == (
            host.sent_bytes, host.received_bytes, host.pull_bytes)
