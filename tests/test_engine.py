"""The incremental engine against PyG's forward pass on the current graph, for every layer
type, random graphs and random streams of all six update types."""

from __future__ import annotations

import copy
from collections.abc import Callable
from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv

import streamgnn as sg
from streamgnn.crossings import counted
from streamgnn.models import GNN, transfer
from streamgnn.models.aggr import SumAggregation
from streamgnn.models.gnn import WEIGHTED_CONVS
from streamgnn.models.zoo import ModelSpec
from streamgnn.replay import LinkBenchWorkload
from streamgnn.updates import ValueLimits
from streamgnn.workers import Engine
from streamgnn.workers.labels import NO_LABEL, ChangedLabels
from streamgnn.workers.local import LocalWorkers
from streamgnn.workers.planned import plans
from streamgnn.workers.planned_shards import plans_together
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import pyg_layers, random_graph
from tests.reference import Reference, update_strategy


def assert_exact(engine: Engine, model: torch.nn.Module, dtype: torch.dtype, tol: float):
    """Every layer of every vertex equals PyG's forward pass on the current graph."""
    current = engine.to_data()
    refs = pyg_layers(model, current, dtype)
    for layer, ref in enumerate(refs):
        ours = engine.lookup(current.ids, layer)
        err = float(np.abs(ours - ref.numpy()).max(initial=0.0))
        assert err <= tol, f"layer {layer}: max error {err}"


def valid_batch(ref: Reference, candidates: list[sg.Update]) -> list[sg.Update]:
    """The candidates that are valid in order (applied to ``ref``)."""
    batch = []
    for u in candidates:
        try:
            ref.apply([u])
        except sg.InvalidUpdateError:
            continue
        batch.append(u)
    return batch


POOL = 30  # ids 0..29; the initial graph uses 0..19, so adds, deletes and re-adds mix
ids = st.integers(0, POOL - 1)
row = st.lists(st.floats(-2, 2, width=32), min_size=F_IN, max_size=F_IN)
weight = st.floats(0.125, 2.0, width=32)
update = update_strategy(ids, weight, row)


def start_graph(seed: int, hubs: int = 2) -> sg.GraphData:
    data = random_graph(np.random.default_rng(seed), n=20, m=60, d=F_IN, hubs=hubs)
    return sg.GraphData(ids=np.arange(20), src=data.positions(data.src),
                        dst=data.positions(data.dst), x=data.x, weight=data.weight)


@pytest.mark.parametrize("recompute", [False, True], ids=["engine", "RC"])
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       seed=st.integers(0, 10_000), batches=st.lists(st.lists(update, max_size=40),
                                                     min_size=1, max_size=6))
def test_random_streams_stay_exact_float64(recompute, arch, num_layers, seed, batches):
    """float64 end to end: any formula or bookkeeping error shows far above 1e-9."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, recompute=recompute)
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
        assert_exact(engine, model, torch.float64, 1e-9)


@given(arch=st.sampled_from(sorted(ARCHS)), seed=st.integers(0, 10_000),
       size=st.sampled_from([1, 10, 100, 1000]))
def test_linkbench_batches_float32_within_contract(arch, seed, size):
    """The production dtype on a graph with hubs, batch sizes 1 to 1,000, batches handed
    over as columns (as the router ships them): within 1e-4."""
    torch.manual_seed(seed)
    data = random_graph(np.random.default_rng(seed), n=300, m=1500, d=F_IN, hubs=3)
    model = ARCHS[arch](2).eval()
    engine = Engine.from_pyg(model, data)
    workload = LinkBenchWorkload(engine.graph, seed=seed)
    for _ in range(3 if size < 1000 else 1):
        engine.apply(sg.UpdateBatch.from_updates(workload.batch(size), F_IN))
    assert_exact(engine, model, torch.float32, 1e-4)


@pytest.mark.parametrize("name", ["graphconv-sum", "gcn", "sage-mean", "gin", "graphconv-max",
                                  "gat"])
def test_drift_after_100k_updates(name):
    """Long delta chains stay within the contract (float32 sums are re-anchored when
    their rounding bound grows: `SumAggregation.drift_limit`)."""
    _stays_within_the_contract(name, batches=100)


def _stays_within_the_contract(name: str, batches: int) -> None:
    """``batches`` LinkBench batches of 1,000 updates on the tiny preset's graph in
    float32: within the contract (1e-4 of PyG) after them, rows pulled on the way
    (re-anchored, for the sum family)."""
    torch.manual_seed(0)
    data = sg.datasets.synthetic("tiny", seed=0)
    model = ModelSpec(name, data.num_features, data.num_classes, hidden=32).build().eval()
    engine = Engine.from_pyg(model, data)
    workload = LinkBenchWorkload(engine.graph, seed=1)
    pulled = sum(sum(engine.apply(workload.batch(1000)).pulled) for _ in range(batches))
    assert pulled > 0
    assert_exact(engine, model, torch.float32, 1e-4)


def test_re_anchoring_waits_for_a_stale_row_then_takes_every_ripe_one():
    aggr = SumAggregation()
    assert not len(aggr.re_anchored(np.array([0.9, 1.0, aggr.ripe + 0.1])))
    assert not len(aggr.re_anchored(np.zeros(0)))
    worn = np.array([aggr.ripe + 0.1, 1.5, aggr.ripe / 2, aggr.ripe])
    np.testing.assert_array_equal(aggr.re_anchored(worn), [0, 1])


def test_vertices_outside_the_l_hop_region_are_not_touched():
    data = random_graph(np.random.default_rng(5), n=400, m=800, d=F_IN, hubs=0)
    model = randomise(ARCHS["pyg-sage-mean"](2), 1)
    engine = Engine.from_pyg(model, data)
    v = int(data.ids[0])
    w = int(data.ids[1]) if int(data.ids[1]) != v else int(data.ids[2])
    batch = [sg.UpdateFeatures(id=v, x=[1.0] * F_IN)]
    batch += [] if engine.graph.has_edges(engine.graph.slots([w]), engine.graph.slots([v]))[0] \
        else [sg.AddEdge(src=w, dst=v)]
    g = engine.graph
    # Vertices within 2 hops downstream of v (the roots: v's features and in-edges changed).
    reach = {int(s) for s in g.slots([v])}
    for _ in range(2):
        _, nbr, _ = g.out_edges(np.array(sorted(reach)))
        reach |= set(nbr.tolist())
    shard = engine.shards[0]

    def tables() -> list[torch.Tensor]:  # embeddings and states, where the shard keeps them
        return [t for t in (*shard.tables.h[1:], *shard.tables.state) if t is not None]

    before = [t.clone() for t in tables()]
    assert len(before) >= 2
    result = engine.apply(batch)
    outside = np.setdiff1d(g.vertex_slots(), np.array(sorted(reach)))
    assert len(outside) > 300
    for old, new in zip(before, tables(), strict=True):
        assert torch.equal(old[outside], new[outside])
    assert max(result.recomputed) <= len(reach)
    assert_exact(engine, model, torch.float32, 1e-4)


@pytest.mark.parametrize("arch", ["graphconv-narrowing", "graphconv-max", "pyg-gat"])
def test_tables_on_huge_pages_stay_exact(monkeypatch, arch):
    """Every per-vertex table on a mapping of its own (`huge_pages`; the threshold set to 0
    so this small graph takes the path arxiv-size tables take), grown by added vertices in
    place (the room mapped after each), then past that room onto new mappings."""
    from streamgnn import allocator

    monkeypatch.setattr(allocator, "_HUGE_MIN_BYTES", 0)
    data = random_graph(np.random.default_rng(3), n=300, m=1500, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 3)
    engine = Engine.from_pyg(model, data)
    shard = engine.shards[0]

    def tables():
        return [t for name in ("h", "state", "ties", "root", "t")
                for t in getattr(shard.tables, name) if t is not None]

    where = [t.data_ptr() for t in tables()]
    assert all(p % (2 << 20) == 0 for p in where)
    adds = {sg.AddVertex: 1.0, sg.AddEdge: 2.0, sg.UpdateFeatures: 1.0}
    workload = LinkBenchWorkload(engine.graph, seed=3, mix=adds)
    while len(shard.tables.state[0]) <= 400:
        engine.apply(workload.batch(50))
    assert [t.data_ptr() for t in tables()] == where  # grown in place
    assert_exact(engine, model, torch.float32, 1e-4)
    while len(shard.tables.state[0]) <= 600:  # past the room: copied
        engine.apply(workload.batch(100))
    assert [t.data_ptr() for t in tables()] != where
    assert all(t.data_ptr() % (2 << 20) == 0 for t in tables())
    for _ in range(2):
        engine.apply(LinkBenchWorkload(engine.graph, seed=4).batch(200))
    assert_exact(engine, model, torch.float32, 1e-4)


@pytest.mark.parametrize("arch, elementwise, one_kernel", [
    ("graphconv-add", ["relu", "identity"], True),
    ("pyg-sage-mean", ["relu", "identity"], True),  # no norm: the activation handed over
    ("pyg-sage-sum-bn", [None, "identity"], True),  # layer 2 reads h through the norm
    ("sage-normalize", [None, None], False),  # (each row L2-normalised; keeps no z)
    ("gin-eps", [None, None], True),  # an MLP; layer 1 reads the features
])
def test_layers_kept_as_z_read_their_rows_in_one_kernel_where_the_activation_allows(
        monkeypatch, arch, elementwise, one_kernel):
    """`Layer.elementwise` names ReLU and the identity only; a superstep of a layer kept
    as z runs everything before its product in one kernel (`linear_step_inputs`) where the
    rows it reads are the features or z activated value by value, and stays exact either
    way (the other superstep reads rows computed by torch)."""
    from streamgnn.workers import fold

    calls = []
    kernel = fold.linear_step_inputs
    monkeypatch.setattr(fold, "linear_step_inputs",
                        lambda *args: calls.append(1) or kernel(*args))
    data = random_graph(np.random.default_rng(5), n=300, m=1500, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 5)
    engine = Engine.from_pyg(model, data)
    assert [layer.elementwise for layer in engine.shards[0].layers] == elementwise
    workload = LinkBenchWorkload(engine.graph, seed=5)
    for size in (1, 10, 100):
        engine.apply(workload.batch(size))
    assert bool(calls) == one_kernel
    assert_exact(engine, model, torch.float32, 1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cuda_engine_stays_exact(arch, partitions):
    """The device path (torch twins of the CPU kernels, device index tensors; with two
    partitions, ghost rows received from the host written into device tables too):
    float64 on the GPU against PyG's forward on the CPU."""
    data = random_graph(np.random.default_rng(7), n=300, m=1500, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 7).double()
    engine = Engine.from_pyg(copy.deepcopy(model), data, device="cuda", partitions=partitions)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=7)
    for size in (1, 10, 100, 1000):
        engine.apply(workload.applied(size))
        assert_exact(engine, model, torch.float64, 1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("arch", ["graphconv-add", "graphconv-max", "pyg-gat", "pyg-gcn"])
def test_a_checkpoint_written_on_cuda_continues_on_the_cpu_and_back(arch, partitions,
                                                                   tmp_path):
    """Checkpoints are host arrays whatever the device: a CUDA engine's files read into a
    CPU engine, and that engine's files read back onto the GPU, each exact afterwards."""
    data = random_graph(np.random.default_rng(11), n=300, m=1500, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 11).double()
    engine = Engine.from_pyg(copy.deepcopy(model), data, device="cuda", partitions=partitions)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=0)
    for device, folder in (("cpu", tmp_path / "from-cuda"), ("cuda", tmp_path / "from-cpu")):
        engine.apply(workload.applied(100))
        folder.mkdir()
        engine.write(folder)
        engine = Engine.read(copy.deepcopy(model), folder, device=device)
        assert engine.device.type == device
        assert_exact(engine, model, torch.float64, 1e-9)
        engine.apply(workload.applied(100))
        assert_exact(engine, model, torch.float64, 1e-9)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # patches only
@given(arch=st.sampled_from(sorted(ARCHS)), seed=st.integers(0, 10_000),
       batches=st.lists(st.lists(update, max_size=40), min_size=1, max_size=4),
       partitions=st.sampled_from([1, 2]))
def test_device_kernels_stay_exact_float64(device_kernels, arch, seed, batches, partitions):
    """The torch twins a CUDA engine runs, on CPU; with two partitions the halo's too."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](2), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
        assert_exact(engine, model, torch.float64, 1e-9)


def _mixed(kinds: list[Callable[[int, int], torch.nn.Module]]
           ) -> Callable[[int], torch.nn.Module]:
    """A model of ``num_layers`` layers whose convs take turns from ``kinds`` (each
    made from its input and output widths)."""
    def build(num_layers: int) -> torch.nn.Module:
        dims = [F_IN] + [16] * (num_layers - 1) + [5]
        return GNN([kinds[i % len(kinds)](a, b) for i, (a, b)
                    in enumerate(pairwise(dims))])
    return build


# linear layers beside max, min and attention layers, each planned by its own kind
MIXED = {"mixed-add-gat-min": _mixed([GraphConv, lambda a, b: GATConv(a, b, heads=2, concat=False),
                                      lambda a, b: GraphConv(a, b, aggr="min")]),
         "mixed-max-gcn": _mixed([lambda a, b: GraphConv(a, b, aggr="max"), GCNConv])}
PLANNED = ["graphconv-add", "graphconv-max", "graphconv-mean", "graphconv-min",
           "gcn-no-loops", "gin-eps", "pyg-gat", "pyg-gcn", "pyg-gin", "pyg-sage-bn",
           "pyg-sage-mean", "sage-normalize", *MIXED]


@pytest.mark.parametrize("partitions, placement", [(1, "metis"), (2, "metis"), (2, "hash"),
                                                   (3, "metis"), (3, "hash")])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # patches only
@given(arch=st.sampled_from(PLANNED), num_layers=st.integers(1, 3),
       seed=st.integers(0, 10_000), batches=st.lists(st.lists(update, max_size=40),
                                                     min_size=1, max_size=6))
def test_planned_batches_stay_exact_float64(device_kernels, partitions, placement, arch,
                                            num_layers, seed, batches):
    """Layers planned on the host and run on the device in two crossings, at one
    partition (`workers/planned.py`) and at several held in one process, all shards
    together (`workers/planned_shards.py`), through every update type: linear ones
    folded, max, min and attention recomputed whole, and models mixing them."""
    data = start_graph(seed)
    model = randomise({**ARCHS, **MIXED}[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data, partitions=partitions, placement=placement)
    assert (plans(engine.shards[0].tables) if partitions == 1
            else plans_together(engine.shards))
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
        assert_exact(engine, model, torch.float64, 1e-9)


@pytest.mark.parametrize("partitions", [1, 2, 3])
@pytest.mark.parametrize("arch", ["graphconv-add", "pyg-gcn", "pyg-sage-mean", "pyg-gin"])
def test_planned_batches_re_anchor_worn_rows_a_batch_late(device_kernels, monkeypatch, arch,
                                                           partitions):
    """A planned batch reads its states' wear back with its rows, and the next batch
    re-anchors the rows it picked, within its two crossings (for all shards together):
    none in the first batch, exact throughout (a limit low enough that rows wear out
    within a batch or two)."""
    monkeypatch.setattr(SumAggregation, "drift_limit", 40.0)
    data = random_graph(np.random.default_rng(7), n=200, m=900, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 7).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=3)
    engine.apply(workload.applied(10))  # (what is made once, on first use)
    pulled = []
    for _ in range(5):
        batch = workload.applied(50)
        with counted() as seen:
            pulled.append(engine.apply(batch).pulled)
        assert seen.total <= 2, seen.sites()
        assert_exact(engine, model, torch.float64, 1e-9)
    assert sum(map(sum, pulled)) > 0


@pytest.mark.parametrize("arch, partitions", [("graphconv-add", 1), ("graphconv-add", 2),
                                              ("graphconv-max", 1), ("pyg-gat", 1)])
def test_a_restored_planned_engine_re_anchors_when_the_original_does(device_kernels,
                                                                      monkeypatch, arch,
                                                                      partitions):
    """The rows a planned batch's wear picks are kept in snapshots (`Tables.reanchor`):
    restored between picking and re-anchoring, the engine goes on bit for bit; so it
    does from max's states and ties and attention's states and kept t, which planned
    batches recompute whole."""
    monkeypatch.setattr(SumAggregation, "drift_limit", 40.0)
    data = random_graph(np.random.default_rng(7), n=200, m=900, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 7).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    assert (plans(engine.shards[0].tables) if partitions == 1
            else plans_together(engine.shards))
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=3)
    wears = any(layer.aggr.linear for layer in engine.shards[0].layers)
    engine.apply(workload.applied(50))
    while wears and not any(len(slots) for shard in engine.shards
                            for slots in shard.tables.reanchor):
        engine.apply(workload.applied(50))
    restored = Engine.restore(model, copy.deepcopy(engine.snapshot()))
    for _ in range(3):
        batch = workload.applied(50)
        assert engine.apply(batch).pulled == restored.apply(batch).pulled
    for shard, twin in zip(engine.shards, restored.shards, strict=True):
        ours, theirs = shard.arrays(), twin.arrays()
        assert ours.keys() == theirs.keys()
        for key, rows in ours.items():
            assert np.array_equal(rows, theirs[key], equal_nan=True), key


@pytest.mark.parametrize("name", ["graphconv-sum", "gcn", "sage-mean", "gin", "graphconv-max",
                                  "gat"])
def test_planned_float32_sums_stay_within_the_contract_re_anchored_a_batch_late(
        device_kernels, name):
    """Long delta chains on the planned path, whose wear comes back with a batch and is
    acted on in the next (`SumAggregation.late_share`), stay within the contract; so do
    max and attention, whose regions planned batches recompute whole."""
    _stays_within_the_contract(name, batches=40)


def test_deterministic():
    data = sg.datasets.synthetic("tiny", seed=2)
    model = ModelSpec("graphconv-sum", data.num_features, data.num_classes, 16).build().eval()
    runs = []
    for _ in range(2):
        engine = Engine.from_pyg(model, data)
        workload = LinkBenchWorkload(engine.graph, seed=9)
        for _ in range(5):
            engine.apply(workload.batch(200))
        runs.append(engine.lookup(engine.vertex_ids()))
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("name", ["graphconv-sum", "sage-mean", "graphconv-max", "gat"])
def test_restored_engine_continues_bit_for_bit(name):
    """A snapshot keeps everything the engine carries between batches (states, max's
    ties, root terms, attention's kept t): restored, it applies the next batches exactly
    as the original does."""
    data = sg.datasets.synthetic("tiny", seed=4)
    model = ModelSpec(name, data.num_features, data.num_classes, 16).build().eval()
    engine = Engine.from_pyg(model, data)
    workload = LinkBenchWorkload(engine.graph, seed=3)
    for _ in range(3):
        engine.apply(workload.batch(100))
    restored = Engine.restore(model, copy.deepcopy(engine.snapshot()))
    for _ in range(3):
        batch = workload.batch(100)
        engine.apply(batch)
        restored.apply(batch)
    ids = engine.vertex_ids()
    assert np.array_equal(engine.lookup(ids), restored.lookup(ids))
    ours, theirs = engine.shards[0].arrays(), restored.shards[0].arrays()
    assert ours.keys() == theirs.keys() and ("ties/0" in ours) == (name == "graphconv-max")
    for key, rows in ours.items():
        assert np.array_equal(rows, theirs[key], equal_nan=True), key


@pytest.mark.parametrize("name", ["graphconv-sum", "sage-mean", "gin"])
def test_a_snapshot_from_before_a_layer_kept_z_is_refused_naming_why(name):
    """Arrays with a sum, mean or GIN layer's embeddings beside its state were written
    when that state was the plain sum of messages: restoring them as z would be wrong, so
    it is refused."""
    data = sg.datasets.synthetic("tiny", seed=4)
    model = ModelSpec(name, data.num_features, data.num_classes, 16).build().eval()
    snapshot = Engine.from_pyg(model, data).snapshot()
    assert "shard0/h/1" not in snapshot
    snapshot["shard0/h/1"] = np.zeros((1, 16), np.float32)
    with pytest.raises(ValueError, match="layer 1's embeddings beside its state"):
        Engine.restore(model, snapshot)


def test_a_snapshot_without_ties_is_restored_with_them_counted():
    """Arrays written before max/min kept ties have none: the restored engine counts them
    and goes on exactly as the original."""
    data = sg.datasets.synthetic("tiny", seed=4)
    model = ModelSpec("graphconv-max", data.num_features, data.num_classes, 16).build().eval()
    engine = Engine.from_pyg(model, data)
    workload = LinkBenchWorkload(engine.graph, seed=3)
    engine.apply(workload.batch(100))
    snapshot = {k: v for k, v in copy.deepcopy(engine.snapshot()).items() if "/ties/" not in k}
    assert len(snapshot) < len(engine.snapshot())
    restored = Engine.restore(model, snapshot)
    for _ in range(3):
        batch = workload.batch(100)
        engine.apply(batch)
        restored.apply(batch)
    ours, theirs = engine.shards[0].arrays(), restored.shards[0].arrays()
    for key, rows in ours.items():
        assert np.array_equal(rows, theirs[key], equal_nan=True), key


def test_changed_labels_are_exactly_the_label_changes():
    data = sg.datasets.synthetic("tiny", seed=3)
    model = ModelSpec("sage-mean", data.num_features, data.num_classes, 16).build().eval()
    engine = Engine.from_pyg(model, data)
    workload = LinkBenchWorkload(engine.graph, seed=4)
    for _ in range(5):
        ids_before = engine.vertex_ids()
        labels_before = dict(zip(ids_before.tolist(), engine.label(ids_before).tolist()))
        result = engine.apply(workload.batch(300))
        ids_after = engine.vertex_ids()
        labels_after = dict(zip(ids_after.tolist(), engine.label(ids_after).tolist()))
        expected = {v: (labels_before.get(v), lab) for v, lab in labels_after.items()
                    if labels_before.get(v) != lab}
        assert result.changed_labels == expected


def test_changed_labels_read_as_a_mapping_and_merge_as_columns():
    a = ChangedLabels(np.array([7, 3]), np.array([1, NO_LABEL]), np.array([2, 0]))
    b = ChangedLabels(np.array([5]), np.array([4]), np.array([1]))
    both = ChangedLabels.concat([a, b, ChangedLabels.empty()])
    assert both == {7: (1, 2), 3: (None, 0), 5: (4, 1)} and list(both) == [7, 3, 5]
    assert both[3] == (None, 0) and 5 in both and 6 not in both and len(both) == 3
    assert both.triples() == [(7, 1, 2), (3, None, 0), (5, 4, 1)]
    assert ChangedLabels.concat([]) == {}
    with pytest.raises(ValueError, match="columns of 2, 1 and 2"):
        ChangedLabels(np.array([1, 2]), np.array([0]), np.array([0, 1]))


def test_bad_batch_changes_nothing_and_names_the_problem():
    data = start_graph(1)
    model = randomise(ARCHS["pyg-gcn"](2), 0)
    engine = Engine.from_pyg(model, data)
    before = engine.lookup(engine.vertex_ids())
    with pytest.raises(sg.UnknownVertexError, match="vertex 999") as err:
        engine.apply([sg.UpdateFeatures(id=3, x=[0.5] * F_IN), sg.AddEdge(src=3, dst=999)])
    assert err.value.index == 1
    assert np.array_equal(engine.lookup(engine.vertex_ids()), before)
    engine.apply([sg.UpdateFeatures(id=3, x=[0.5] * F_IN)])
    assert_exact(engine, model, torch.float32, 1e-4)


def test_public_reads():
    data = start_graph(2)
    model = randomise(ARCHS["pyg-gat"](2), 0)
    engine = Engine.from_pyg(model, data)
    np.testing.assert_array_equal(engine.lookup([4, 5], layer=0), data.x[[4, 5]])
    assert engine.lookup([4], layer=-1).shape == (1, 8)
    np.testing.assert_array_equal(engine.label([4, 5]), engine.lookup([4, 5]).argmax(1))
    assert sorted(engine.vertex_ids().tolist()) == list(range(20))
    assert len(engine.edges()[0]) == data.num_edges
    with pytest.raises(KeyError):
        engine.lookup([12345])


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_submitted_batch_is_collected_as_apply_gives_it_and_holds_the_shards(partitions):
    """`submit` then `collect` give what `apply` gives (label changes, rejections,
    removed ids, the state after); in between the shards are refused to anyone else, and
    a second batch cannot start; `collect` with nothing submitted names why."""
    data = start_graph(3)
    model = randomise(ARCHS["graphconv-add"](2), 3).double()
    ours, twin = (Engine.from_pyg(model, data, partitions=partitions) for _ in range(2))
    ref = Reference(data)
    batch = valid_batch(ref, [sg.DeleteVertex(id=2), sg.AddVertex(id=25, x=[0.5] * F_IN),
                              sg.AddEdge(src=25, dst=7, weight=1.0),
                              sg.UpdateFeatures(id=4, x=[1.0] * F_IN)])
    batch.append(sg.AddEdge(src=123456, dst=1, weight=1.0))  # names no vertex: rejected
    ours.submit(batch, skip_invalid=True)
    with pytest.raises(RuntimeError, match="in flight"):
        ours.lookup([1])
    with pytest.raises(RuntimeError, match="in flight"):
        ours.submit(batch, skip_invalid=True)
    got, want = ours.collect(), twin.apply(batch, skip_invalid=True)
    assert got.changed_labels.triples() == want.changed_labels.triples()
    assert [e.index for e in got.rejected] == [e.index for e in want.rejected] != []
    np.testing.assert_array_equal(got.removed, want.removed)
    ids = ours.vertex_ids()
    np.testing.assert_array_equal(ours.lookup(ids), twin.lookup(ids))
    assert_exact(ours, model, torch.float64, 1e-9)
    with pytest.raises(RuntimeError, match="no batch in flight"):
        ours.collect()


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_second_batch_submitted_while_the_first_computes_elsewhere(partitions, monkeypatch):
    """Where the workers take two batches in flight (`Workers.max_in_flight`, as MPI
    workers do; forced here on the shards in this process) a second batch may be
    submitted before the first is collected, not a third; `collect` gives the results
    oldest first, as `apply` would have one after the other, and `apply` itself is refused
    meanwhile. A batch that drives an embedding to inf lets the one after it go (its
    workers' replies are taken, so the next command's replies are its own)."""
    monkeypatch.setattr(LocalWorkers, "max_in_flight", 2)
    data = start_graph(4)
    model = randomise(ARCHS["graphconv-add"](2), 4).double()
    ours, twin = (Engine.from_pyg(model, data, partitions=partitions) for _ in range(2))
    ref = Reference(data)
    first = valid_batch(ref, [sg.DeleteVertex(id=2), sg.AddVertex(id=25, x=[0.5] * F_IN),
                              sg.AddEdge(src=25, dst=7, weight=1.0)])
    second = valid_batch(ref, [sg.UpdateFeatures(id=4, x=[1.0] * F_IN),
                               sg.AddEdge(src=25, dst=1, weight=1.0)])
    ours.submit(first)
    ours.submit(second)
    with pytest.raises(RuntimeError, match="2 batches in flight"):
        ours.submit(second)
    with pytest.raises(RuntimeError, match="in flight"):
        ours.apply(second)
    for batch in (first, second):
        assert (ours.collect().changed_labels.triples()
                == twin.apply(batch).changed_labels.triples())
    assert_exact(ours, model, torch.float64, 1e-9)

    poisoned = Engine.from_pyg(randomise(ARCHS["graphconv-add"](2), 4), data,
                               partitions=partitions)  # float32: 3e38 features overflow
    poisoned.limits = ValueLimits(1e39, 1e39)
    poisoned.submit([sg.UpdateFeatures(id=4, x=[3e38] * F_IN)])
    poisoned.submit([sg.UpdateFeatures(id=5, x=[1.0] * F_IN)])
    with pytest.raises(sg.NonFiniteEmbeddingError):
        poisoned.collect()
    assert not poisoned._in_flight


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_planned_batch_is_submitted_with_its_copy_back_under_way(device_kernels,
                                                                    monkeypatch, partitions):
    """On the device path `submit` returns a planned batch with its one copy back started
    and not waited for (`transfer.Pending`): the engine is `computing` but takes no other
    batch and refuses its shards; `collect` waits and gives exactly what `apply` gives.
    Where a second batch is let in (`max_in_flight` raised), it closes the first before
    it plans; a batch that drives an embedding to inf raises at its `collect`."""
    waited = []
    wait = transfer.Pending.wait
    monkeypatch.setattr(transfer.Pending, "wait", lambda self: waited.append(self) or wait(self))
    data = start_graph(3)
    model = randomise(ARCHS["pyg-gcn"](2), 3).double()
    ours, twin = (Engine.from_pyg(model, data, partitions=partitions) for _ in range(2))
    ref = Reference(data)
    batches = [valid_batch(ref, [sg.DeleteVertex(id=2), sg.AddVertex(id=25, x=[0.5] * F_IN),
                                 sg.AddEdge(src=25, dst=7, weight=1.0)]),
               valid_batch(ref, [sg.UpdateFeatures(id=4, x=[1.0] * F_IN),
                                 sg.AddEdge(src=25, dst=1, weight=1.0)])]
    for batch in batches:
        ours.submit(batch)
        assert not waited and ours.computing and not ours.takes_another
        with pytest.raises(RuntimeError, match="in flight"):
            ours.lookup([1])
        got = ours.collect()
        assert len(waited) == 1 and not ours.computing
        want = twin.apply(batch)
        assert got.changed_labels.triples() == want.changed_labels.triples()
        assert got.recomputed == want.recomputed
        waited.clear()
    ids = ours.vertex_ids()
    np.testing.assert_array_equal(ours.lookup(ids), twin.lookup(ids))
    assert_exact(ours, model, torch.float64, 1e-9)

    monkeypatch.setattr(LocalWorkers, "max_in_flight", 2)
    waited.clear()
    last = [valid_batch(ref, [sg.UpdateFeatures(id=k, x=[k / 10] * F_IN)]) for k in (5, 6)]
    for batch in last:
        ours.submit(batch)
    assert len(waited) == 1  # the first closed before the second planned
    for batch in last:
        assert ours.collect().changed_labels.triples() == twin.apply(batch).changed_labels.triples()
    np.testing.assert_array_equal(ours.lookup(ids), twin.lookup(ids))

    poisoned = Engine.from_pyg(randomise(ARCHS["pyg-gcn"](2), 3), data,
                               partitions=partitions)  # float32: 3e38 features overflow
    poisoned.limits = ValueLimits(1e39, 1e39)
    poisoned.submit([sg.UpdateFeatures(id=4, x=[3e38] * F_IN)])
    with pytest.raises(sg.NonFiniteEmbeddingError):
        poisoned.collect()


def test_attention_pulls_when_removing_the_dominant_edge():
    """An edge whose logit dwarfs the others leaves, in float arithmetic, nothing of them
    in the denominator; deleting it must re-aggregate, not subtract."""
    from torch_geometric.nn import GATConv

    from streamgnn.models import GNN

    conv = GATConv(2, 2, heads=1)
    with torch.no_grad():
        conv.lin.weight.copy_(torch.eye(2))
        conv.att_src.copy_(torch.tensor([[[5.0, 0.0]]]))
        conv.att_dst.zero_()
        conv.bias.zero_()
    model = GNN([conv]).eval()
    data = sg.GraphData(ids=[1, 2, 3], src=[1, 2], dst=[3, 3], x=[[10, 0], [0, 1], [0, 0]])
    engine = Engine.from_pyg(model, data)
    result = engine.apply([sg.DeleteEdge(src=1, dst=3)])
    assert result.pulled[0] >= 1
    np.testing.assert_allclose(engine.lookup([3]), [[0.0, 0.5]], atol=1e-6)
    assert_exact(engine, model, torch.float32, 1e-6)


@pytest.mark.parametrize("aggr,sign", [("max", 1.0), ("min", -1.0)])
def test_extremum_deltas_pull_only_the_columns_whose_carriers_left(aggr, sign):
    """max/min, column by column: removing a carrier of the extremum while another ties
    with it, a message that does not reach it, or one whose new value beats it costs no
    pull; removing its last carrier re-aggregates that column only; a vertex losing every
    in-edge holds 0, and one gaining its first is re-aggregated whole. Edge weights and
    features change messages both ways."""
    from torch_geometric.nn import GraphConv

    from streamgnn.models import GNN

    conv = GraphConv(2, 2, aggr=aggr)
    with torch.no_grad():
        conv.lin_rel.weight.copy_(torch.eye(2))
        conv.lin_rel.bias.zero_()
        conv.lin_root.weight.zero_()
    model = GNN([conv]).eval()
    x = sign * np.array([[3, 0], [3, 0], [1, 0], [0, 2], [0, 0]], np.float32)
    data = sg.GraphData(ids=[1, 2, 3, 4, 5], src=[1, 2, 3, 4], dst=[5] * 4, x=x)
    engine = Engine.from_pyg(model, data)
    steps = [  # (updates, columns pulled at vertex 5, its value after)
        ([sg.DeleteEdge(src=1, dst=5)], 0, [3, 2]),  # 2 still carries column 0
        ([sg.DeleteEdge(src=2, dst=5)], 1, [1, 2]),  # the last carrier of column 0
        ([sg.UpdateFeatures(id=4, x=sign * np.array([5.0, 1.0]))], 1, [5, 1]),  # 0 beaten
        ([sg.UpdateEdge(src=3, dst=5, weight=2.0)], 0, [5, 1]),  # reaches neither
        ([sg.UpdateEdge(src=4, dst=5, weight=0.5)], 2, [2.5, 0.5]),  # 4 carried both
        ([sg.AddEdge(src=1, dst=5)], 0, [3, 0.5]),
        ([sg.UpdateFeatures(id=1, x=sign * np.array([4.0, 0.0]))], 0, [4, 0.5]),  # beats
        ([sg.DeleteEdge(src=s, dst=5) for s in (1, 3, 4)], 2, [0, 0]),  # no in-edge left
        ([sg.AddEdge(src=2, dst=5)], 2, [3, 0]),  # the first in-edge again: whole
    ]
    for updates, columns, value in steps:
        result = engine.apply(updates)
        assert result.pulled_columns == [columns], updates
        np.testing.assert_allclose(engine.lookup([5]), [sign * np.array(value)])
        assert_exact(engine, model, torch.float32, 1e-6)


def _recount_extremum(engine: Engine, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """Layer ``hop``'s max/min states and ties of every slot, from scratch: the extremum of
    each vertex's in-edge messages per column (0 without in-edges) and how many equal it."""
    shard, layer, g = engine.shards[0], engine.layers[hop - 1], engine.graph
    src, dst, w = g.edge_slots()
    table = g.x[:g.num_slots].astype(np.float64) if hop == 1 else shard.tables.h[hop - 1].numpy()
    msg = layer.aggr.sign * table[src] * (w[:, None].astype(np.float64)
                                          if layer.edge_weighted else 1.0)
    best = np.full((g.num_slots, table.shape[1]), -np.inf)
    np.maximum.at(best, dst, msg)
    count = np.zeros(best.shape, np.int64)
    np.add.at(count, dst, msg == best[dst])
    return np.where(np.isinf(best), 0.0, best), count


int_row = st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=F_IN, max_size=F_IN)
tying_update = update_strategy(ids, st.sampled_from([0.5, 1.0, 2.0]), int_row)


@given(arch=st.sampled_from(["graphconv-max", "graphconv-min", "sage-max"]),
       seed=st.integers(0, 10_000), batches=st.lists(st.lists(tying_update, max_size=40),
                                                     min_size=1, max_size=6))
def test_extremum_ties_count_every_carrier(arch, seed, batches):
    """Features from {-1, 0, 1} and weights from {0.5, 1, 2} tie everywhere (ReLU adds
    zeros): after every batch each max/min state and its ties equal a recount from
    scratch, and every layer equals PyG's forward."""
    data = start_graph(seed)
    data.x[:] = np.random.default_rng(seed).integers(-1, 2, data.x.shape)
    model = randomise(ARCHS[arch](2), seed).double()
    engine = Engine.from_pyg(model, data)
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
        alive = engine.graph.vertex_slots()
        for hop in (1, 2):
            state, ties = _recount_extremum(engine, hop)
            tables = engine.shards[0].tables
            np.testing.assert_array_equal(tables.state[hop - 1].numpy()[alive], state[alive])
            np.testing.assert_array_equal(tables.ties[hop - 1].numpy()[alive], ties[alive])
        assert_exact(engine, model, torch.float64, 1e-9)


@given(arch=st.sampled_from(["graphconv-add", "graphconv-narrowing", "sage-sum",
                             "pyg-sage-sum-bn", "graphconv-mean", "pyg-sage-mean",
                             "pyg-sage-bn", "sage-wide", "pyg-gin", "pyg-gin-bn", "gin-eps"]),
       num_layers=st.integers(1, 3), seed=st.integers(0, 10_000),
       batches=st.lists(st.lists(update, max_size=40), min_size=1, max_size=6))
def test_sum_mean_and_gin_layers_keep_their_preactivation_alone(arch, num_layers, seed,
                                                                batches):
    """A layer that is activate(sum or mean of messages + root + bias) keeps that
    pre-activation as its only table (no embeddings, no root terms): after every batch
    (in-degrees rising and falling: a mean's z rescaled) each row equals
    the layer's conv output from PyG's own inputs (before the activation; for GIN what
    PyG feeds its ``nn``, (1 + eps) h_v + sum_u h_u), and every layer equals PyG's forward
    (read through `Engine.lookup`, the activation's batch norm included)."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    engine = Engine.from_pyg(model, data)
    tables = engine.shards[0].tables
    assert all(layer.keeps_preactivation for layer in engine.layers)
    assert tables.h[1:] == [None] * num_layers and tables.root == [None] * num_layers
    ref = Reference(data)
    for candidates in batches:
        engine.apply(valid_batch(ref, candidates))
        current = engine.graph.to_data()
        g = current.to_pyg()
        inputs = pyg_layers(model, current, torch.float64)[:-1]
        slots = engine.graph.slots(current.ids)
        for k, (conv, h) in enumerate(zip(model.convs, inputs, strict=True)):
            np.testing.assert_allclose(tables.state[k].numpy()[slots],
                                       _preactivation(conv, h, g).numpy(), atol=1e-9)
        assert_exact(engine, model, torch.float64, 1e-9)


@torch.no_grad()
def _preactivation(conv: torch.nn.Module, h: torch.Tensor, g) -> torch.Tensor:
    """PyG's z of a conv over ``g`` from inputs ``h``: its output, but a GINConv's is the
    input of its ``nn``."""
    if isinstance(conv, GINConv):
        seen = []
        hook = conv.nn.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
        conv(h, g.edge_index)
        hook.remove()
        return seen[0]
    return (conv(h, g.edge_index, g.edge_weight.double())
            if isinstance(conv, WEIGHTED_CONVS) else conv(h, g.edge_index))


@pytest.mark.parametrize("name", ["graphconv-sum", "sage-mean", "gcn", "gin"])
def test_values_at_the_limits_come_and_go_without_leaving_error(name):
    """Features at +-1e6 and weights at 1e3 (the `ValueLimits` defaults) pushed in beside
    ordinary values, then taken back: the float32 embeddings stay within the contract of
    PyG's forward pass. One step past either limit is refused, naming the value."""
    data = sg.datasets.synthetic("tiny", 0)
    spec = ModelSpec(name, data.num_features, data.num_classes, 32, 2)
    torch.manual_seed(0)
    model = spec.build().eval()
    engine = Engine.from_pyg(model, data)
    limits = sg.ValueLimits()
    rng = np.random.default_rng(0)
    ids = data.ids[rng.choice(len(data.ids), 20, replace=False)]
    src, dst, w = engine.edges()
    picked = rng.choice(len(src), 20, replace=False)
    big = [sg.UpdateFeatures(id=int(v), x=(np.sign(rng.standard_normal(data.num_features))
                                           * limits.features).tolist()) for v in ids]
    heavy = [sg.UpdateEdge(src=int(src[i]), dst=int(dst[i]), weight=limits.weights)
             for i in picked]
    engine.apply(big[:10] + heavy[:10])
    engine.apply(big[10:] + heavy[10:])
    rows = {int(v): data.x[np.flatnonzero(data.ids == v)[0]].tolist() for v in ids}
    engine.apply([sg.UpdateFeatures(id=v, x=x) for v, x in list(rows.items())[:7]])
    engine.apply([sg.UpdateFeatures(id=v, x=x) for v, x in list(rows.items())[7:]]
                 + [sg.UpdateEdge(src=int(src[i]), dst=int(dst[i]), weight=float(w[i]))
                    for i in picked])
    ref = pyg_layers(model, data)[-1].numpy()
    assert np.abs(engine.lookup(data.ids) - ref).max() < 1e-4
    with pytest.raises(sg.OutOfRangeError, match="beyond the limit"):
        engine.apply([sg.UpdateFeatures(id=int(ids[0]), x=[2 * limits.features]
                                        * data.num_features)])
    with pytest.raises(sg.OutOfRangeError, match="weight"):
        engine.apply([sg.UpdateEdge(src=int(src[0]), dst=int(dst[0]),
                                    weight=2 * limits.weights)])


# Host/device crossings a batch makes on the device path, at most (2 layers; P = 1 / 2),
# counted on the CPU (`streamgnn.crossings`): most are a copy over the bus on a GPU, some
# the CPU's alone (the layer-0 exchange, which stays on the host). Batches run planned
# (`workers/planned.py`; at P = 2 all shards together, `planned_shards.py`): one upload,
# one download (issue 51).
CROSSINGS = {"graphconv-add": (2, 2), "graphconv-max": (2, 2), "pyg-gcn": (2, 2),
             "pyg-gat": (2, 2), "pyg-sage-mean": (2, 2), "pyg-gin": (2, 2)}


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("arch", sorted(CROSSINGS))
def test_a_batch_crosses_to_the_host_a_bounded_number_of_times_whatever_its_size(
        device_kernels, arch, partitions):
    """Counted on the CPU with the device kernels forced: batches of 100 and of 800
    updates cross within the same bound, the one the code reaches (nothing per vertex or
    per update, nothing per step added unnoticed). A first batch goes uncounted: what is
    made once, on first use (a layer's stacked weights, kept on the host on the CPU
    alone), is not a batch's."""
    data = random_graph(np.random.default_rng(5), n=300, m=1500, d=F_IN, hubs=3)
    model = randomise(ARCHS[arch](2), 5).double()
    engine = Engine.from_pyg(model, data, partitions=partitions)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=1)
    engine.apply(workload.applied(10))
    counts = {}
    for size in (100, 800, 100, 800):
        batch = workload.applied(size)
        with counted() as seen:
            engine.apply(batch)
        counts[size] = max(counts.get(size, 0), seen.total)
    assert max(counts.values()) <= CROSSINGS[arch][partitions - 1], seen.sites()
