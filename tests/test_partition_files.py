"""Initial placements and the partition files: the streaming partitioners (capacity, free
slots, far fewer edges cut than hash across clusters), a dataset written as partition
files and read back (the parts together are the dataset, each edge in its destination
owner's part, the map and the summary agree, the owners are the engine's), and
`streamgnn datasets partition` with its mistakes."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

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
