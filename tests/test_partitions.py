"""The engine split into P partitions against PyG's forward pass: every P in 1..4, every
placement (METIS, hash, streamed), every layer type, random streams of all six update
types (raw, with invalid updates the batch leaves out), and the same answers as one
partition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import random_graph
from tests.test_engine import assert_exact, start_graph, update

batches_of_updates = st.lists(st.lists(update, max_size=40), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       partitions=st.integers(2, 4), placement=st.sampled_from(["metis", "hash", "stream"]),
       seed=st.integers(0, 10_000), batches=batches_of_updates)
def test_partitioned_streams_stay_exact_float64(arch, num_layers, partitions, placement,
                                                seed, batches):
    assert_partitioned_stream_exact(arch, num_layers, partitions, placement, seed, batches)


@pytest.mark.parametrize("partitions", [2, 3])
@settings(max_examples=15, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       seed=st.integers(0, 10_000), batches=batches_of_updates)
def test_streamed_placement_stays_exact_float64(partitions, arch, num_layers, seed, batches):
    """The streamed placement (Fennel) at P = 2 and 3 whatever the draw above samples."""
    assert_partitioned_stream_exact(arch, num_layers, partitions, "stream", seed, batches)


def assert_partitioned_stream_exact(arch, num_layers, partitions, placement, seed, batches):
    """Raw batches (invalid updates left out by ``skip_invalid``): every layer of every
    vertex equals PyG's forward pass, and the rejections and label changes equal one
    partition's."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    split = Engine.from_pyg(model, data, partitions=partitions, placement=placement)
    whole = Engine.from_pyg(model, data)
    for batch in batches:
        a, b = split.apply(batch, skip_invalid=True), whole.apply(batch, skip_invalid=True)
        assert [(type(e), e.index) for e in a.rejected] == [
            (type(e), e.index) for e in b.rejected]
        assert a.changed_labels == b.changed_labels
        assert_exact(split, model, torch.float64, 1e-9)
        assert_ghosts_are_needed(split)
    assert np.array_equal(np.sort(split.vertex_ids()), np.sort(whole.vertex_ids()))


def assert_ghosts_are_needed(engine: Engine) -> None:
    """Each shard's ghosts are exactly the remote sources of edges into its vertices, and
    the router and the owners agree on who holds what."""
    src, dst, _ = engine.edges()
    owner_src, owner_dst = engine.partition_of(src), engine.partition_of(dst)
    for q, shard in enumerate(engine.shards):
        g, ghost, holders = shard.graph, shard.tables.ghost, shard.tables.holders
        slots = g.vertex_slots()
        ghosts = set(g.ext[slots[ghost[slots]]].tolist())
        assert ghosts == set(src[(owner_dst == q) & (owner_src != q)].tolist())
        mine = slots[~ghost[slots]]
        held = (holders[mine] >> np.uint64(q)) & np.uint64(1)
        assert not held.any()  # nobody holds its own vertices
        for u, bits in zip(g.ext[mine].tolist(), holders[mine].tolist(), strict=True):
            at = engine.placement.holders[engine.graph.slots([u])[0]]
            assert int(at) == bits


def test_the_engines_value_limits_are_the_only_ones():
    """Limits raised on the engine (or by the service, later) hold for every partition."""
    data = start_graph(2)
    model = randomise(ARCHS["pyg-sage-mean"](2), 2).double()
    engine = Engine.from_pyg(model, data, partitions=2)
    engine.graph.limits = sg.ValueLimits(1e9, 1e6)
    engine.apply([sg.UpdateFeatures(id=int(v), x=[1e8] * F_IN) for v in data.ids[:5]]
                 + [sg.UpdateEdge(src=int(data.src[0]), dst=int(data.dst[0]), weight=1e5)])
    with pytest.raises(sg.OutOfRangeError):
        engine.apply([sg.UpdateFeatures(id=int(data.ids[0]), x=[1e10] * F_IN)])


def test_ghosts_go_with_the_last_edge_that_needed_them():
    data = start_graph(3)
    model = randomise(ARCHS["pyg-sage-mean"](2), 3).double()
    engine = Engine.from_pyg(model, data, partitions=3)
    assert sum(s["halo"] for s in engine.stats()) > 0
    src, dst, _ = engine.edges()
    engine.apply([sg.DeleteEdge(src=int(a), dst=int(b)) for a, b in zip(src, dst, strict=True)])
    assert [s["halo"] for s in engine.stats()] == [0, 0, 0]
    assert not engine.placement.holders.any()
    assert_exact(engine, model, torch.float64, 1e-9)


@pytest.mark.parametrize("partitions", [2, 4])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_linkbench_batches_partitioned_float32(arch, partitions):
    """The production dtype, batches of 100 and 1,000 on a graph with hubs; the shards
    report their exchanges and the ghosts' features their routed batch brought."""
    torch.manual_seed(0)
    data = random_graph(np.random.default_rng(0), n=300, m=1500, d=F_IN, hubs=3)
    model = ARCHS[arch](2).eval()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    workload = LinkBenchWorkload(engine.graph, seed=0)
    for size in (100, 1000, 100):
        engine.apply(sg.UpdateBatch.from_updates(workload.batch(size), F_IN))
    assert_exact(engine, model, torch.float32, 1e-4)
    stats = engine.stats()
    assert sum(s["vertices"] for s in stats) == len(engine.vertex_ids())
    assert all(s["halo"] > 0 for s in stats) and any(sum(s["sent_bytes"]) for s in stats)
    assert any(s["ghost_feature_bytes"] for s in stats)  # ghosts' features came routed


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_batches_inside_one_partition_leave_the_others_idle_and_stay_exact(arch,
                                                                           monkeypatch):
    """Batches whose updates all lie in partition 0 route nothing to the other shards:
    they walk every superstep with nothing to do (every other batch stays among vertices
    no other partition holds), or take the ghost rows partition 0 sends them before the
    second; the answers stay those of PyG and of one partition."""
    from streamgnn.workers.shard import Shard

    rng = np.random.default_rng(0)
    data = random_graph(rng, n=300, m=900, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 0).double()
    split, whole = Engine.from_pyg(model, data, partitions=3), Engine.from_pyg(model, data)
    routed: list[int] = []
    run_routed = Shard.run_routed
    monkeypatch.setattr(Shard, "run_routed", lambda shard, r, me, n: (
        routed.append(len(r.batch) + len(r.ghosts) + len(r.subscribed)
                      + len(r.unsubscribed)), run_routed(shard, r, me, n))[1])
    g, placement = split.graph, split.placement
    mine = g.vertex_slots()[placement.part[g.vertex_slots()] == 0]
    s, d, _ = g.edge_slots()
    quiet = np.zeros(g.num_slots, bool)  # in 0, held by none, and so are its out-neighbors
    quiet[mine[placement.holders[mine] == 0]] = True
    quiet[s[~quiet[d]]] = False
    quiet = np.flatnonzero(quiet)
    loud = np.setdiff1d(mine, quiet)
    received = []
    for k in range(8):
        sources, targets = (quiet, quiet) if k % 2 else (loud, mine)
        u, v = rng.choice(sources, 6), rng.choice(targets, 6)
        new = (u != v) & ~g.has_edges(u, v)
        s, d, w = g.edge_slots()
        inside = np.flatnonzero((placement.part[s] == 0) & (placement.part[d] == 0)
                                & np.isin(s, sources) & np.isin(d, targets))[:3]
        batch = ([sg.AddEdge(src=int(g.ext[a]), dst=int(g.ext[b]), weight=0.5)
                  for a, b in {(a, b) for a, b in zip(u[new], v[new], strict=True)}]
                 + [sg.DeleteEdge(src=int(g.ext[s[i]]), dst=int(g.ext[d[i]]))
                    for i in inside[:1]]
                 + [sg.UpdateEdge(src=int(g.ext[s[i]]), dst=int(g.ext[d[i]]),
                                  weight=float(w[i]) + 1.0) for i in inside[1:]]
                 + [sg.UpdateFeatures(id=int(g.ext[a]), x=rng.standard_normal(F_IN).tolist())
                    for a in rng.choice(quiet, 1)])
        routed.clear()
        a, b = split.apply(batch), whole.apply(batch)
        assert a.changed_labels == b.changed_labels
        assert routed[0] > 0 and routed[1:] == [0, 0]  # the others were sent nothing
        received.append([sum(s["received_bytes"]) for s in split.stats()[1:]])
        assert_exact(split, model, torch.float64, 1e-9)
    assert not np.any(received[1::2]) and np.any(received[::2])  # idle, or woken by rows


@pytest.mark.parametrize("placement", ["metis", "stream"])
def test_partition_of_and_restore(placement):
    data = start_graph(1)
    model = randomise(ARCHS["pyg-gat"](2), 1).double()
    engine = Engine.from_pyg(model, data, partitions=3, placement=placement)
    parts = engine.partition_of(data.ids)
    assert set(parts.tolist()) == {0, 1, 2}
    with pytest.raises(sg.UnknownVertexError):
        engine.partition_of([10**9])
    with pytest.raises(ValueError, match="partitions=21: must be 1 to 64 and at most the "
                                         "graph's 20 vertices"):
        Engine.from_pyg(model, data, partitions=21)
    restored = Engine.restore(model, engine.snapshot())
    assert restored.placement.strategy == placement
    batch = [sg.AddVertex(id=99, x=[0.5] * F_IN), sg.AddEdge(src=99, dst=0),
             sg.DeleteVertex(id=3), sg.UpdateFeatures(id=5, x=[1.0] * F_IN)]
    engine.apply(batch)
    restored.apply(batch)
    ids = engine.vertex_ids()
    assert np.array_equal(engine.lookup(ids), restored.lookup(ids))
