"""`ReadView` against the engine it copies: after every batch (all six update types,
vertices deleted and re-added, slots reused, the graph growing; one to three partitions)
it reads what `Engine.lookup` reads; a reader holding a state keeps reading it while the
loop publishes the next one; readers on another thread only ever see whole states."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.replay import LinkBenchWorkload
from streamgnn.replay.linkbench import WRITE_MIX
from streamgnn.router.view import ReadView
from streamgnn.workers import Engine
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import random_graph
from tests.test_engine import POOL, start_graph, update


def assert_reads_the_engine(view: ReadView, engine: Engine, batch: int) -> None:
    """Every vertex at every layer as the engine has it, labels included, named ``batch``;
    every other id of the pool unknown."""
    ids = engine.vertex_ids()
    for layer in range(engine.num_layers + 1):
        got = view.read(ids, layer)
        assert got.batch == batch and got.layer == layer
        assert np.array_equal(got.rows, engine.lookup(ids, layer)), f"layer {layer}"
        assert np.array_equal(got.labels, engine.label(ids))
    for v in sorted(set(range(POOL)) - set(ids.tolist())):
        with pytest.raises(sg.UnknownVertexError, match=f"vertex {v} "):
            view.read([v], -1)


@settings(max_examples=30, deadline=None)
@given(arch=st.sampled_from(["pyg-sage-mean", "pyg-gat", "graphconv-max", "pyg-gcn"]),
       num_layers=st.integers(1, 3), partitions=st.integers(1, 3),
       seed=st.integers(0, 10_000), batches=st.lists(st.lists(update, max_size=40),
                                                     min_size=1, max_size=6))
def test_the_view_reads_what_the_engine_reads_after_every_batch(arch, num_layers, partitions,
                                                                seed, batches):
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    view = ReadView(engine, 0)
    assert_reads_the_engine(view, engine, 0)
    for n, batch in enumerate(batches, 1):
        view.publish(n, engine.apply(batch, skip_invalid=True), engine)
        assert_reads_the_engine(view, engine, n)


def edge_sets(graph: sg.DynamicGraph) -> dict[int, tuple[set, set]]:
    """Per vertex id: its (source id, weight) in-edges and (destination id, weight)
    out-edges."""
    src, dst, w = graph.edges()
    out = {int(v): (set(), set()) for v in graph.vertex_ids()}
    for a, b, x in zip(src.tolist(), dst.tolist(), w.tolist(), strict=True):
        out[b][0].add((a, x))
        out[a][1].add((b, x))
    return out


def assert_neighbors(view: ReadView, expected: dict[int, tuple[set, set]], batch: int):
    """Every id of the pool: its edges as ``expected`` has them, named ``batch``; the
    others unknown."""
    for v in range(POOL):
        if v not in expected:
            with pytest.raises(sg.UnknownVertexError, match=f"vertex {v} "):
                view.neighbors(v)
            continue
        got = view.neighbors(v)
        assert got.batch == batch
        for edges, want in zip((got.ins, got.outs), expected[v], strict=True):
            pairs = list(zip(edges.ids.tolist(), edges.weights.tolist(), strict=True))
            assert len(pairs) == len(set(pairs)) and set(pairs) == want, v


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), batches=st.lists(st.lists(update, max_size=40),
                                                      min_size=1, max_size=6))
def test_neighbors_read_while_a_batch_runs_are_those_before_it(seed, batches):
    """Between `Engine.apply` changing the graph and the view publishing the batch (the
    batch in flight), `neighbors` answers the state before the batch, named so; once
    published, the state after it. Vertices deleted, re-added, slots reused, edges of
    deleted vertices cascading."""
    data = start_graph(seed)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), seed), data)
    view = ReadView(engine, 0)
    before = edge_sets(engine.graph)
    assert_neighbors(view, before, 0)
    for n, batch in enumerate(batches, 1):
        result = engine.apply(batch, skip_invalid=True)  # in flight until published
        assert_neighbors(view, before, n - 1)
        view.publish(n, result, engine)
        before = edge_sets(engine.graph)
        assert_neighbors(view, before, n)


def test_a_vertex_deleted_and_added_again_in_one_batch_reads_its_new_row():
    data = start_graph(0)
    engine = Engine.from_pyg(randomise(ARCHS["pyg-sage-mean"](2), 0), data)
    view = ReadView(engine, 0)
    x = [0.5] * F_IN
    result = engine.apply([sg.DeleteVertex(id=3), sg.AddVertex(id=3, x=x),
                           sg.AddEdge(src=4, dst=3)])
    assert 3 in result.removed.tolist()  # a new slot: the old one is not reused in a batch
    view.publish(1, result, engine)
    assert_reads_the_engine(view, engine, 1)
    assert np.array_equal(view.read([3], 0).rows[0], np.float32(x))


def states(engine: Engine, workload: LinkBenchWorkload, batches: int, view: ReadView,
           first: int = 1) -> list[list[np.ndarray]]:
    """Apply ``batches`` LinkBench batches, numbered from ``first``, publishing each: every
    layer's rows of the first vertices before and after each (index = batch - first +
    1)."""
    ids = engine.vertex_ids()[:50]
    out = [[engine.lookup(ids, layer) for layer in range(engine.num_layers + 1)]]
    for n in range(first, first + batches):
        view.publish(n, engine.apply(workload.batch(200)), engine)
        out.append([engine.lookup(ids, layer) for layer in range(engine.num_layers + 1)])
    return out


def small_engine() -> tuple[Engine, LinkBenchWorkload]:
    """An engine and LinkBench writes that delete no vertex (the readers' ids stay)."""
    torch.manual_seed(0)
    data = random_graph(np.random.default_rng(0), n=300, m=1500, d=F_IN, hubs=3)
    engine = Engine.from_pyg(ARCHS["pyg-sage-mean"](2).eval(), data)
    mix = {kind: p for kind, p in WRITE_MIX.items() if kind is not sg.DeleteVertex}
    return engine, LinkBenchWorkload(engine.graph, seed=0, mix=mix)


def test_a_held_state_reads_the_same_while_the_next_one_is_published():
    """Batch 2 also deletes a vertex and adds one: readers of batch 2 see both before the
    view's id map has caught up, a reader holding batch 1 sees neither."""
    engine, workload = small_engine()
    view = ReadView(engine, 0)
    ids = engine.vertex_ids()[:50]
    before = states(engine, workload, 1, view)[1]
    gone, new = int(engine.vertex_ids()[-1]), 10**9
    batch = [*workload.batch(200), sg.DeleteVertex(id=gone), sg.AddVertex(id=new, x=[1] * F_IN),
             sg.AddEdge(src=int(ids[0]), dst=new)]
    with view.state() as held:  # a reader in the middle of batch 1's state
        publishing = threading.Thread(target=lambda: view.publish(2, engine.apply(batch),
                                                                  engine))
        publishing.start()
        while view.read(ids, -1).batch != 2:  # batch 2 is published at once ...
            pass
        assert publishing.is_alive()  # ... but its copy waits for the held reader
        after = [engine.lookup(ids, layer) for layer in range(3)]
        assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        for layer in range(3):
            assert np.array_equal(held.read(ids, layer).rows, before[layer])
            assert held.read(ids, layer).batch == 1
            assert np.array_equal(view.read(ids, layer).rows, after[layer])
            assert np.array_equal(view.read([new], layer).rows, engine.lookup([new], layer))
        with pytest.raises(sg.UnknownVertexError):
            view.read([gone], -1)
        with pytest.raises(sg.UnknownVertexError):
            held.read([new], -1)
        assert held.read([gone], -1).batch == 1
    publishing.join()
    assert_reads_the_engine(view, engine, 2)


def test_readers_on_another_thread_see_only_whole_states():
    """A thread reads the same vertices over and over while batches are applied and
    published; each answer equals the engine's rows after the batch it names."""
    engine, workload = small_engine()
    view = ReadView(engine, 0)
    ids = engine.vertex_ids()[:50]
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            got = view.read(ids, 1)
            seen.append((got.batch, got.rows, view.read(ids, -1)))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        want = states(engine, workload, 30, view)
    finally:
        done.set()
        thread.join()
    assert len({batch for batch, _, _ in seen}) > 1
    for batch, rows, last in seen:
        assert np.array_equal(rows, want[batch][1])
        assert last.batch >= batch and np.array_equal(last.rows, want[last.batch][2])
