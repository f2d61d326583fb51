"""The coordinator without the graph: a `Directory` (ids and owners only) decides a batch's
vertex questions and each partition its edges (`DynamicGraph.apply(..., ghosts=True)` on its
share); together they must reject exactly what the whole graph rejects, in both modes, and
leave each partition the edges into its vertices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.graph.directory import Directory
from streamgnn.updates import UpdateBatch
from streamgnn.workers.placement import shares
from tests.reference import D
from tests.test_graph import _start, updates


def _partitions(data: sg.GraphData, owner: np.ndarray, parts: int) -> list[DynamicGraph]:
    """Each partition's graph: its vertices, the edges into them, their sources as ghosts."""
    pos = {int(v): i for i, v in enumerate(data.ids)}
    out = []
    for q in range(parts):
        into = owner[[pos[int(d)] for d in data.dst]] == q
        mine = data.ids[owner == q]
        ghosts = np.setdiff1d(data.src[into], mine)
        ids = np.concatenate([mine, ghosts])
        x = np.concatenate([data.x[owner == q], np.zeros((len(ghosts), D), np.float32)])
        out.append(DynamicGraph.from_data(sg.GraphData(
            ids, data.src[into], data.dst[into], x, weight=data.weight[into])))
    return out


def _edges(graph: DynamicGraph) -> dict[tuple[int, int], float]:
    src, dst, w = graph.edges()
    return dict(zip(zip(src.tolist(), dst.tolist()), w.tolist()))


def _distributed(directory: Directory, graphs: list[DynamicGraph], batch: UpdateBatch,
                 skip: bool) -> list[int]:
    """The batch through the directory and the partitions; the rejected positions (or,
    atomically, raises the first rejection's error with everything as it was)."""
    decided = directory.decide(batch, skip)
    errors = list(decided.rejected)
    saved = [{k: a.copy() for k, a in g.to_arrays().items()} for g in graphs]
    none = (np.zeros(0, np.int64),) * 3  # no ghosts let go of before
    for graph, r in zip(graphs, shares(decided, batch, len(graphs), none), strict=True):
        share, at = r.batch, r.positions
        try:
            diff = graph.apply(share, skip, ghosts=True)
            errors += [e.at(int(at[e.index])) for e in diff.rejected]
        except sg.InvalidUpdateError as e:
            errors.append(e.at(int(at[e.index])))
    if errors and not skip:
        directory.undo(decided)
        for q, arrays in enumerate(saved):
            graphs[q] = DynamicGraph.from_arrays(arrays)
        raise min(errors, key=lambda e: e.index)
    directory.commit(decided)
    return sorted(e.index for e in errors)


@given(seed=st.integers(0, 1000), parts=st.integers(1, 3),
       batches=st.lists(st.lists(updates, max_size=12), min_size=1, max_size=8),
       skip=st.booleans())
def test_the_directory_and_the_partitions_reject_what_the_whole_graph_rejects(
        seed, parts, batches, skip):
    data = _start(seed)
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, parts, data.num_vertices)
    whole = DynamicGraph.from_data(data)
    directory = Directory(data.ids, owner, parts, D)
    graphs = _partitions(data, owner, parts)
    for updates_ in batches:
        batch = UpdateBatch.from_updates(updates_, D)
        try:
            expected = [e.index for e in whole.apply(batch, skip).rejected]
        except sg.InvalidUpdateError as e:
            event("batch rejected")
            with pytest.raises(type(e)) as got:
                _distributed(directory, graphs, batch, skip)
            assert got.value.index == e.index and str(got.value) == str(e)
        else:
            event(f"{len(expected)} rejected")
            assert _distributed(directory, graphs, batch, skip) == expected
        # the same vertices, each at its owner; the same edges, each at its destination's
        assert sorted(whole.vertex_ids().tolist()) == sorted(directory_ids(directory))
        held = {}
        for q, graph in enumerate(graphs):
            mine = directory_ids(directory, q)
            edges = _edges(graph)
            assert all(d in mine for _, d in edges), "an edge away from its owner"
            held.update(edges)
            ids = graph.vertex_ids()
            owned = np.isin(ids, mine)
            assert np.array_equal(
                graph.x[graph.slots(ids[owned])], whole.x[whole.slots(ids[owned])])
        assert held == _edges(whole)


def directory_ids(directory: Directory, q: int | None = None) -> list[int]:
    n = int(directory._counts[1])
    live = directory.alive[:n] & ((directory.owner[:n] == q) if q is not None else True)
    return directory._ids.ext[np.flatnonzero(live)].tolist()


@pytest.mark.parametrize("strategy", ["metis", "hash"])
def test_a_new_vertex_joins_the_high_in_degree_vertex_it_first_sends_to(strategy):
    """RIPPLE++'s Algorithm 1: a new vertex whose first edge goes into a vertex of the high
    in-degree set is placed with it; one whose edges do not, on the least-loaded
    partition; with hash placement, id % P whatever its edges. A checkpoint keeps the
    set."""
    ids = np.arange(12, dtype=np.int64)
    owner = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2])  # partition 2 least loaded
    directory = Directory(ids, owner, 3, D, strategy=strategy)
    assert directory.high_due == (strategy != "hash")
    directory.mark_high(np.array([1, 3, 99]))  # 99: not a vertex (gone since it was named)
    assert not directory.high_due
    x = [0.0] * D
    batch = UpdateBatch.from_updates([
        sg.AddVertex(id=20, x=x), sg.AddEdge(src=20, dst=7), sg.AddEdge(src=20, dst=3),
        sg.AddVertex(id=21, x=x), sg.AddEdge(src=21, dst=6),
        sg.AddVertex(id=22, x=x), sg.AddEdge(src=22, dst=3)], D)
    directory.commit(directory.decide(batch))
    got = directory.owners(np.array([20, 21, 22])).tolist()
    assert got == ([20 % 3, 21 % 3, 22 % 3] if strategy == "hash" else [0, 2, 0])
    restored = Directory.from_arrays(directory.to_arrays())  # the set kept: a replay
    assert not restored.high_due and restored.ext[restored.high].tolist() == [1, 3]
    directory.commit(directory.decide(UpdateBatch.from_updates([sg.DeleteVertex(id=3)], D)))
    if strategy != "hash":  # a deleted vertex leaves the set
        assert directory.ext[directory.high].tolist() == [1]
