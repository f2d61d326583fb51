"""Initial placements and the partition files: the streaming partitioners (capacity, free
slots, far fewer edges cut than hash across clusters), a dataset written as partition
files and read back (the parts together are the dataset, each edge in its destination
owner's part, the map and the summary agree, the owners are the engine's),
`streamgnn datasets partition` with its mistakes, and an engine started from the files
(each partition from its own, in one process and on MPI ranks): the engine started from
the dataset, exact against PyG through a stream; and `serve --partitions-from`."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.errors import InputError
from streamgnn.graph import DynamicGraph
from streamgnn.workers import Engine
from streamgnn.workers.partition_files import (
    owners,
    read_map,
    read_partition,
    write_partitions,
)
from streamgnn.workers.placement import SLACK, STRATEGIES, stream_parts
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import random_graph
from tests.test_cli_mistakes import STREAMGNN, mistake
from tests.test_engine import assert_exact, start_graph
from tests.test_mpi import MPIEXEC, mpiexec
from tests.test_partitions import assert_ghosts_are_needed, batches_of_updates, edge_set


@pytest.mark.parametrize("rule", ["fennel", "ldg"])
@pytest.mark.parametrize("order", ["id", "bfs"])
def test_a_streamed_placement_fills_no_partition_past_its_capacity(rule, order):
    data = random_graph(np.random.default_rng(1), n=300, m=2000, d=2, hubs=5)
    graph = DynamicGraph.from_data(data)
    graph.apply([sg.DeleteVertex(id=int(v)) for v in data.ids[:30]])
    part = stream_parts(graph, 4, rule, order)
    live = graph.vertex_slots()
    assert (part[live] >= 0).all() and (part[live] < 4).all()
    assert (np.delete(part, live) == -1).all()  # the free slots
    assert np.bincount(part[live]).max() <= np.ceil(SLACK * len(live) / 4)


@pytest.mark.parametrize("rule", ["fennel", "ldg"])
@pytest.mark.parametrize("order", ["id", "bfs"])
def test_a_streamed_placement_cuts_far_fewer_edges_than_hash_across_clusters(rule, order):
    """Four clusters of 100 vertices, six edges out of each vertex inside its cluster, 20
    edges across, ids shuffled."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 400, 2400)
    dst = np.r_[src // 100 * 100 + rng.integers(0, 100, 2400), rng.integers(0, 400, 20)]
    src = np.r_[src, rng.integers(0, 400, 20)]
    ids = rng.permutation(400)
    with pytest.warns(UserWarning, match="parallel edges"):
        data = sg.GraphData.cleaned(np.arange(400), ids[src], ids[dst], np.zeros((400, 1)))
    graph = DynamicGraph.from_data(data)
    s, d, _ = graph.edge_slots()
    cut = {name: (part[s] != part[d]).mean() for name, part in (
        ("stream", stream_parts(graph, 4, rule, order)), ("hash", graph.ext % 4))}
    assert cut["stream"] < 0.6 * cut["hash"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_partition_files_hold_the_dataset_split_by_the_engines_owners(tmp_path, strategy):
    data = random_graph(np.random.default_rng(0), n=200, m=900, d=F_IN)
    parts, folder = 3, tmp_path / "parts"
    owner = owners(data, parts, strategy)
    summary = write_partitions(data, owner, parts, strategy, folder, progress=False)
    model = randomise(ARCHS["pyg-sage-mean"](1), 0).double()
    engine = Engine.from_pyg(model, data, partitions=parts, placement=strategy)
    assert np.array_equal(engine.partition_of(data.ids), owner)

    mapped = read_map(folder)
    assert (mapped.parts, mapped.strategy) == (parts, strategy)
    assert np.array_equal(mapped.ids, data.ids) and mapped.ids.dtype == np.int64
    assert np.array_equal(mapped.part, owner) and mapped.part.dtype == np.int32
    files = [read_partition(folder, p) for p in range(parts)]
    ids = np.concatenate([f.ids for f in files])
    at = data.positions(ids)
    assert np.array_equal(np.sort(at), np.arange(data.num_vertices))  # each vertex once
    assert np.array_equal(np.concatenate([f.x for f in files]), data.x[at])
    assert np.array_equal(np.concatenate([f.y for f in files]), data.y[at])
    edges = {(s, d, w) for f in files for s, d, w in zip(
        f.src.tolist(), f.dst.tolist(), f.weight.tolist(), strict=True)}
    assert edges == set(zip(data.src.tolist(), data.dst.tolist(), data.weight.tolist(),
                            strict=True))
    assert sum(len(f.src) for f in files) == data.num_edges
    for p, f in enumerate(files):
        assert (mapped.part[data.positions(f.ids)] == p).all()
        assert (mapped.part[data.positions(f.dst)] == p).all()  # with its destination
        ghosts = np.setdiff1d(f.src, f.ids)
        assert (summary.vertices[p], summary.edges[p], summary.ghosts[p]) == (
            len(f.ids), len(f.src), len(ghosts))
    crossing = mapped.part[data.positions(data.src)] != mapped.part[data.positions(data.dst)]
    assert summary.cut == pytest.approx(crossing.mean())
    assert summary.balance == pytest.approx(summary.vertices.max() / (200 / parts))


def test_reading_a_partition_that_is_not_there_names_what_is(tmp_path):
    data = random_graph(np.random.default_rng(0), n=50, m=200, d=2)
    write_partitions(data, owners(data, 2, "hash"), 2, "hash", tmp_path, progress=False)
    with pytest.raises(InputError, match="holds partitions 0 to 1, not 2"):
        read_partition(tmp_path, 2)
    with pytest.raises(InputError, match="no partition file"):
        read_map(tmp_path / "elsewhere")


def test_the_command_writes_the_folder_and_prints_the_table(tmp_path):
    out = subprocess.run(
        [STREAMGNN, "datasets", "partition", "--dataset", "tiny", "--parts", "3",
         "--placement", "stream", "-o", str(tmp_path / "parts")], capture_output=True,
        text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}, check=True)
    assert "edge cut" in out.stdout and "balance" in out.stdout
    assert read_map(tmp_path / "parts").strategy == "stream"
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [
        "map.npz", "part-0.npz", "part-1.npz", "part-2.npz"]


@pytest.mark.parametrize(("args", "error", "hint"), [
    (("--parts", "0"), "cannot make 0 partitions", "--parts takes 1 to 64"),
    (("--parts", "65"), "cannot make 65 partitions", "--parts takes 1 to 64"),
    (("--placement", "nope"), "unknown placement 'nope'", "metis, hash, stream"),
    (("-o", "a-file/below"), "cannot write the partitions to a-file/below",
     "give -o a folder you can write to"),
])
def test_partition_mistakes_are_named(tmp_path, args, error, hint):
    (tmp_path / "a-file").write_text("")
    mistake("datasets", "partition", "--dataset", "tiny", "-o", "out", *args, cwd=tmp_path,
            error=error, hint=hint)
    assert not (tmp_path / "out" / "map.npz").exists()


# ---------------------------------------------------------------- engines from the files
@pytest.mark.parametrize("strategy", ["metis", "hash"])
@pytest.mark.parametrize("parts", [2, 3])
@settings(max_examples=8, deadline=None)
@given(arch=st.sampled_from(sorted(ARCHS)), num_layers=st.integers(1, 3),
       seed=st.integers(0, 10_000), batches=batches_of_updates)
def test_an_engine_from_partition_files_is_the_one_from_the_dataset(parts, strategy, arch,
                                                                     num_layers, seed,
                                                                     batches):
    """Every layer of every vertex equals the engine `from_pyg` starts with the same
    partitions, each partition holds the ghosts and knows the holders the cut gives it,
    and a stream of raw batches (invalid updates left out) keeps it exact against PyG,
    rejecting and relabelling as the other engine does."""
    data = start_graph(seed)
    model = randomise(ARCHS[arch](num_layers), seed).double()
    with tempfile.TemporaryDirectory() as folder:
        write_partitions(data, owners(data, parts, strategy), parts, strategy, Path(folder),
                         progress=False)
        engine = Engine.from_partitions(model, folder)
    cut = Engine.from_pyg(model, data, partitions=parts, placement=strategy)
    assert engine.graph is None and engine.index is engine.directory
    assert np.array_equal(engine.partition_of(data.ids), cut.partition_of(data.ids))
    assert (engine.num_edges, engine.num_features) == (cut.num_edges, cut.num_features)
    for layer in range(num_layers + 1):
        assert np.abs(engine.lookup(data.ids, layer) - cut.lookup(data.ids, layer)).max(
            initial=0.0) <= 1e-9, layer
    assert_ghosts_are_needed(engine)
    for batch in batches:
        a, b = engine.apply(batch, skip_invalid=True), cut.apply(batch, skip_invalid=True)
        assert [(type(e), e.index) for e in a.rejected] == [
            (type(e), e.index) for e in b.rejected]
        assert a.changed_labels == b.changed_labels
        assert_exact(engine, model, torch.float64, 1e-9)
        assert edge_set(engine) == edge_set(cut) and engine.num_edges == cut.num_edges


def test_an_engine_from_partition_files_survives_a_snapshot_and_refuses_other_workers(
        tmp_path):
    data = random_graph(np.random.default_rng(0), n=100, m=400, d=F_IN)
    write_partitions(data, owners(data, 2, "metis"), 2, "metis", tmp_path, progress=False)
    model = randomise(ARCHS["pyg-gcn"](2), 0).double()
    engine = Engine.from_partitions(model, tmp_path, recompute=True)
    restored = Engine.restore(model, engine.snapshot())
    assert np.array_equal(restored.lookup(data.ids), engine.lookup(data.ids))
    assert_exact(restored, model, torch.float64, 1e-9)
    with pytest.raises(ValueError, match="2 partitions for 3 workers"):
        Engine.from_partitions(model, tmp_path, workers=type("Three", (), {"size": 3})())
    with pytest.raises(InputError, match="no partition file"):
        Engine.from_partitions(model, tmp_path / "elsewhere")


def test_serve_refuses_partition_files_of_another_width_or_partition_count(tmp_path):
    from streamgnn.models.zoo import ModelFile, ModelSpec
    from streamgnn.serving import _from_partitions

    data = random_graph(np.random.default_rng(0), n=60, m=200, d=F_IN)
    write_partitions(data, owners(data, 2, "hash"), 2, "hash", tmp_path, progress=False)
    spec = ModelSpec("sage-mean", F_IN + 1, 3, 8, 2)
    wide = ModelFile(spec, spec.build().state_dict())
    with pytest.raises(InputError, match=f"takes {F_IN + 1} features per vertex, the "
                       f"partition files in {tmp_path} have {F_IN}"):
        _from_partitions(wide, tmp_path, "cpu", None)
    with pytest.raises(InputError, match="holds 2 partitions, not one per worker"):
        _from_partitions(wide, tmp_path, "cpu", type("Three", (), {"size": 3})())


MPI_PROGRAM = """\
import json, sys
from pathlib import Path
import numpy as np, torch
import streamgnn as sg
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from streamgnn.workers.mpi import spmd
from streamgnn.workers.partition_files import owners, write_partitions
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import pyg_layers, random_graph
folder, out = Path(sys.argv[1]), Path(sys.argv[2])
data = random_graph(np.random.default_rng(0), n=300, m=1500, d=F_IN, hubs=3)
model = randomise(ARCHS["pyg-gat"](2), 0).double()
def main(workers):
    write_partitions(data, owners(data, workers.size, "metis"), workers.size, "metis",
                     folder, progress=False)
    engine = Engine.from_partitions(model, folder, workers=workers)
    alone = Engine.from_partitions(model, folder)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=0)
    def apart():
        ids = engine.vertex_ids()
        return max(float(np.abs(engine.lookup(ids, layer) - alone.lookup(ids, layer)).max())
                   for layer in range(3))
    started = apart()
    for size in (10, 100, 1000):
        batch = workload.batch(size)
        workload.graph.apply(batch, skip_invalid=True)
        a, b = engine.apply(batch, skip_invalid=True), alone.apply(batch, skip_invalid=True)
        assert a.changed_labels == b.changed_labels
    current = engine.to_data()
    pyg = max(float(np.abs(engine.lookup(current.ids, layer) - ref.numpy()).max())
              for layer, ref in enumerate(pyg_layers(model, current, torch.float64)))
    out.write_text(json.dumps({"started": started, "alone": apart(), "pyg": pyg,
                               "halo": [s["halo"] for s in engine.stats()]}))
spmd(model, main)
"""


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec (pip install mpich) missing")
def test_mpi_workers_start_from_their_own_partition_files(tmp_path):
    """Three worker ranks each read their own file (rank 0 the map alone): the same
    engine, bit for bit, as the partitions started from the files in one process, and
    exact against PyG after a stream."""
    script, out = tmp_path / "program.py", tmp_path / "result.json"
    script.write_text(MPI_PROGRAM)
    run = mpiexec(4, str(script), str(tmp_path / "parts"), str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["started"] == 0.0 and r["alone"] == 0.0 and r["pyg"] < 1e-9
    assert all(h > 0 for h in r["halo"])


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec (pip install mpich) missing")
def test_serve_with_workers_starts_from_partition_files(broker, kafka, tmp_path):
    """`serve --workers 2 --partitions-from DIR` (the snapshot `serve` would load, written
    as partition files): each rank bootstraps from its own file, no dataset is loaded (the
    one named does not exist), and the stream is served exactly."""
    import uuid

    from streamgnn.stream import Topics
    from streamgnn.stream.kafka_tools import ensure_topics
    from tests.test_mpi import ROOT, assert_served_exactly, serve_command
    from tests.test_stream import linkbench_stream, tiny_setup
    from tests.test_torture import send

    _, snapshot, held_out, model = tiny_setup()
    events = linkbench_stream(snapshot, held_out, 10)
    model.save(tmp_path / "model.pt")
    folder = tmp_path / "parts"
    write_partitions(snapshot, owners(snapshot, 2, "metis"), 2, "metis", folder,
                     progress=False)
    topics = Topics.prefixed(f"f{uuid.uuid4().hex[:6]}-")
    ensure_topics(kafka, topics.all())
    send(kafka, topics.updates, events)
    state = tmp_path / "state"
    command = serve_command(tmp_path, broker, topics, state, "--until-idle", "3",
                            "--partitions-from", str(folder))
    command[command.index("--dataset") + 1] = str(tmp_path / "no-such-dataset.npz")
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert_served_exactly(state, model, kafka, topics, snapshot, events)
