"""The dynamic graph store against a plain-Python reference: random batches of all six
update types (valid and invalid), atomicity, error types and positions, the net diff."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from tests.conftest import random_graph
from tests.reference import D, Reference, update_strategy


def assert_same(graph: DynamicGraph, ref: Reference) -> None:
    assert sorted(graph.vertex_ids().tolist()) == sorted(ref.x)
    s, d, w = graph.edges()
    assert dict(zip(zip(s.tolist(), d.tolist()), w.tolist())) == ref.e
    slots = graph.slots(np.array(sorted(ref.x), np.int64))
    if len(slots):
        np.testing.assert_array_equal(graph.x[slots], np.array([ref.x[i] for i in sorted(ref.x)],
                                                               np.float32))
    indeg = {v: 0 for v in ref.x}
    wsum = {v: 0.0 for v in ref.x}
    outdeg = {v: 0 for v in ref.x}
    for (a, b), wt in ref.e.items():
        indeg[b] += 1
        outdeg[a] += 1
        wsum[b] += wt
    order = sorted(ref.x)
    if order:
        np.testing.assert_array_equal(graph.in_degree[slots], [indeg[v] for v in order])
        np.testing.assert_array_equal(graph.out_degree[slots], [outdeg[v] for v in order])
        np.testing.assert_allclose(graph.in_weight[slots], [wsum[v] for v in order], rtol=1e-12)
        begin, end, src, w = graph.in_blocks(slots)  # in place: the same in-edges
        for i, v, a, b in zip(slots, order, begin, end, strict=True):
            assert sorted(zip(graph.ext[src[a:b]].tolist(), w[a:b].tolist())) == sorted(
                (u, wt) for (u, t), wt in ref.e.items() if t == v)
            summed = 0.0  # the block summed in float64, in order: what a fresh count gives
            for wt in w[a:b].tolist():
                summed += wt
            assert graph.in_weight[i] == summed, v  # bit for bit, kept up or summed again
    assert graph.num_vertices == len(ref.x)
    assert graph.num_edges == len(ref.e)


ids = st.integers(0, 14)  # a small id pool: collisions, deletes and re-adds are common
# Mostly valid values, sometimes not: most batches apply, some must be rejected whole.
_finite = st.floats(-2, 2, allow_nan=False, width=32)
weights = st.one_of(*[_finite] * 8, st.sampled_from([float("nan"), float("inf")]))
_row = st.lists(st.floats(-3, 3, width=32), min_size=D, max_size=D)
feats = st.one_of(*[_row] * 8, st.lists(st.floats(-3, 3, width=32), min_size=1, max_size=5),
                  st.just([0.0, float("nan"), 1.0]))
updates = update_strategy(ids, weights, feats)


def _start(seed: int, whole: bool = False) -> sg.GraphData:
    """A random graph on ids 0..9 (inside the update id pool); ``whole``: its weights
    rounded to whole numbers (the weighted in-degrees then follow by their changes)."""
    data = random_graph(np.random.default_rng(seed), n=10, m=30, d=D)
    weight = np.round(2 * data.weight) if whole else data.weight
    return sg.GraphData(ids=np.arange(10), src=data.positions(data.src),
                        dst=data.positions(data.dst), x=data.x, weight=weight)


@given(seed=st.integers(0, 1000), batches=st.lists(st.lists(updates, max_size=12),
                                                   min_size=1, max_size=8), whole=st.booleans())
def test_random_batches_match_reference(seed, batches, whole):
    data = _start(seed, whole)
    graph, ref = DynamicGraph.from_data(data), Reference(data)
    for batch in batches:
        before = ref.snapshot()
        try:
            ref.apply(batch)
            expected = None
        except sg.InvalidUpdateError as err:
            expected = err
        event("batch applied" if expected is None else "batch rejected")
        if expected is None:
            diff = graph.apply(batch)
            check_diff(graph, diff, before, ref)
        else:
            with pytest.raises(sg.InvalidUpdateError):
                graph.apply(batch)
        assert_same(graph, ref)


def check_diff(graph: DynamicGraph, diff: sg.GraphDiff, before, ref: Reference) -> None:
    """The diff is the net change: keyed by (id, incarnation is new in this batch)."""
    x0, inc0, e0, _ = before

    def key(slot, new_slots):
        return int(graph.ext[slot]), int(slot) in new_slots

    new_slots = set(diff.added.tolist())
    alive_before = {(v, False) for v in x0}
    alive_after = {(v, ref.inc[v] != inc0.get(v)) for v in ref.x}
    assert {key(s, new_slots) for s in diff.added} == alive_after - alive_before
    assert {key(s, new_slots) for s in diff.removed} == alive_before - alive_after
    for s, row in zip(diff.removed, diff.removed_x):
        assert tuple(row) == x0[int(graph.ext[s])]
    changed = {(v, False) for v in x0 if v in ref.x and inc0[v] == ref.inc[v] and
               x0[v] != ref.x[v]}
    assert {key(s, new_slots) for s in diff.changed} == changed
    for s, row in zip(diff.changed, diff.changed_x_before):
        assert tuple(row) == x0[int(graph.ext[s])]

    def edge_map(edges, inc, inc_before):
        return {((a, inc[a] != inc_before.get(a)), (b, inc[b] != inc_before.get(b))): w
                for (a, b), w in edges.items()}

    e_before = edge_map(e0, inc0, inc0)
    e_after = edge_map(ref.e, ref.inc, inc0)
    expected = {k: (e_before.get(k), e_after.get(k)) for k in set(e_before) | set(e_after)
                if e_before.get(k) != e_after.get(k)}
    got = {}
    for s, d, b, a in zip(diff.edges.src, diff.edges.dst, diff.edges.before, diff.edges.after):
        got[(key(s, new_slots), key(d, new_slots))] = (
            None if np.isnan(b) else float(b), None if np.isnan(a) else float(a))
    assert got == expected


@given(seed=st.integers(0, 1000), position=st.integers(0, 9), data=st.data())
def test_single_bad_update_names_id_reason_and_position(seed, position, data):
    g = _start(seed)
    graph = DynamicGraph.from_data(g)
    ref = Reference(g)
    e = sorted(ref.e)[0]
    good = [sg.UpdateFeatures(id=int(i % 10), x=[float(i)] * D) for i in range(9)]
    bad, err_type, needle = data.draw(st.sampled_from([
        (sg.AddEdge(src=e[0], dst=e[1]), sg.DuplicateEdgeError, f"({e[0]}, {e[1]})"),
        (sg.AddEdge(src=1, dst=1), sg.SelfLoopError, "(1, 1)"),
        (sg.AddEdge(src=1, dst=99), sg.UnknownVertexError, "vertex 99"),
        (sg.AddEdge(src=1, dst=2, weight=float("nan")), None, "not finite"),
        (sg.DeleteEdge(src=99, dst=1), sg.UnknownVertexError, "vertex 99"),
        (sg.UpdateEdge(src=3, dst=3, weight=1.0), sg.UnknownEdgeError, "(3, 3)"),
        (sg.AddVertex(id=4, x=[0.0] * D), sg.DuplicateVertexError, "vertex 4"),
        (sg.AddVertex(id=77, x=[0.0] * (D + 1)), sg.FeatureDimensionError, "vertex 77"),
        (sg.AddVertex(id=77, x=[float("inf")] * D), sg.NonFiniteValueError, "vertex 77"),
        (sg.DeleteVertex(id=55), sg.UnknownVertexError, "vertex 55"),
        (sg.UpdateFeatures(id=5, x=[1.0, float("nan"), 0.0]), sg.NonFiniteValueError,
         "vertex 5"),
    ]))
    if err_type is None:  # an edge that may or may not exist: NaN wins only if it does not
        err_type = sg.InvalidUpdateError
    batch = [*good[:position], bad, *good[position:]]
    with pytest.raises(err_type, match=needle.replace("(", r"\(").replace(")", r"\)")) as info:
        graph.apply(batch)
    assert info.value.index == position
    assert_same(graph, ref)


def test_unknown_vertex_error_is_a_key_error():
    graph = DynamicGraph.from_data(_start(0))
    with pytest.raises(KeyError):
        graph.apply([sg.DeleteVertex(id=12345)])


def test_growth_and_compaction_keep_the_graph():
    """Many inserts into few vertices force block moves and compactions."""
    data = random_graph(np.random.default_rng(3), n=300, m=600, d=D)
    graph, ref = DynamicGraph.from_data(data), Reference(data)
    rng = np.random.default_rng(4)
    for _ in range(30):
        hub = int(rng.choice(data.ids))
        others = rng.choice(data.ids, size=40, replace=False)
        batch = [sg.AddEdge(src=int(o), dst=hub, weight=1.5) for o in others
                 if o != hub and (int(o), hub) not in ref.e]
        batch += [sg.DeleteEdge(src=s, dst=t) for s, t in list(ref.e)[:5]
                  if (s, t) not in {(b.src, b.dst) for b in batch}]
        ref.apply(batch)
        graph.apply(batch)
    assert_same(graph, ref)
    structure = graph.nbytes()["structure"]
    assert structure < 40 * (len(ref.e) + len(ref.x)) + 200_000


def test_split_stream_replays_to_the_original():
    data = sg.datasets.synthetic("tiny", seed=3)
    snapshot, events = sg.datasets.split_stream(data, frac=0.2, seed=1)
    assert 0.1 < 1 - snapshot.num_vertices / data.num_vertices < 0.3
    graph = DynamicGraph.from_data(snapshot)
    for i in range(0, len(events), 97):
        graph.apply(events[i:i + 97])
    now = graph.to_data()
    assert sorted(now.ids.tolist()) == sorted(data.ids.tolist())
    assert set(zip(now.src.tolist(), now.dst.tolist(), now.weight.tolist())) == set(
        zip(data.src.tolist(), data.dst.tolist(), data.weight.tolist()))
    np.testing.assert_array_equal(now.x[now.positions(data.ids)], data.x)


def test_held_out_updates_read_like_a_list():
    """`split_stream`'s updates are built when read: indexing, slicing and iterating
    agree with each other, as a list's would."""
    _, events = sg.datasets.split_stream(sg.datasets.synthetic("tiny", seed=3), 0.2, 1)
    every = list(events)
    assert len(every) == len(events) > 100
    assert events[5:40:3] == every[5:40:3] and events[-1] == every[-1]
    assert events[len(events) - 1:] == every[-1:] and events[len(events):] == []
    with pytest.raises(IndexError):
        events[len(events)]


@given(st.lists(st.lists(st.sampled_from(["delete", "add"]), min_size=1, max_size=8),
                min_size=1, max_size=6), st.integers(0, 1000))
def test_slot_map_follows_reused_slots_on_both_sides(rounds, seed):
    """`SlotMap` answers what the target's id map would, while vertices are deleted and
    added (slots reused) on both graphs in different orders."""
    from streamgnn.graph.slotmap import SlotMap

    rng = np.random.default_rng(seed)
    data = _start(seed)
    source, target = DynamicGraph.from_data(data), DynamicGraph.from_data(data)
    spare = [sg.AddVertex(id=1000 + k, x=[0.0] * D) for k in range(5)]
    target.apply(spare)  # the target reuses these slots first: its slots differ
    target.apply([sg.DeleteVertex(id=u.id) for u in spare])
    to_target = SlotMap(source, target)
    next_id = 100
    for ops in rounds:
        batch = []
        for op in ops:
            alive = source.ext[source.vertex_slots()]
            if op == "delete" and len(alive) > 1:
                batch.append(sg.DeleteVertex(id=int(rng.choice(alive))))
            else:
                batch.append(sg.AddVertex(id=next_id, x=[0.0] * D))
                next_id += 1
        batch = [u for i, u in enumerate(batch) if not any(  # each vertex once a batch
            getattr(v, "id", None) == u.id for v in batch[:i])]
        source.apply(batch)
        target.apply(batch[::-1] if all(isinstance(u, sg.AddVertex) for u in batch)
                     else batch)
        slots = source.vertex_slots()
        assert to_target(slots).tolist() == target.slots(source.ext[slots]).tolist()


def test_diff_of_update_then_delete_reports_features_from_before_the_batch():
    data = _start(1)
    graph = DynamicGraph.from_data(data)
    diff = graph.apply([sg.UpdateFeatures(id=3, x=[9.0] * D), sg.DeleteVertex(id=3),
                        sg.AddVertex(id=3, x=[7.0] * D)])
    np.testing.assert_array_equal(diff.removed_x, data.x[3:4])
    assert graph.ext[diff.removed].tolist() == [3] and graph.ext[diff.added].tolist() == [3]
    assert diff.removed[0] != diff.added[0] and len(diff.changed) == 0


def test_an_empty_batch_gives_the_diff_a_batch_without_net_effect_gives():
    """An empty batch (a partition's share of a batch that does not touch it) skips the
    kernels: its diff has the columns, dtypes and widths of the kernels' diff of a batch
    whose updates cancel, and the graph's counters end as that batch leaves them."""
    data = _start(3)
    (s, d), w = sorted(Reference(data).e.items())[0]
    cancelling = [sg.DeleteEdge(src=s, dst=d), sg.AddEdge(src=s, dst=d, weight=w)]
    columns = {}
    for batch in ([], cancelling, sg.UpdateBatch.from_updates([], D)):
        graph = DynamicGraph.from_data(data)
        graph.apply([sg.UpdateFeatures(id=3, x=[9.0] * D)])
        diff = graph.apply(batch)
        arrays = {**vars(diff.edges), **{k: v for k, v in vars(diff).items()
                                         if isinstance(v, np.ndarray)}}
        columns[len(batch)] = ({k: (a.dtype, a.shape) for k, a in arrays.items()},
                               graph.to_arrays()["counts"].tolist(), diff.rejected)
    assert columns[0] == columns[len(cancelling)]


def test_update_batch_columns_apply_like_the_updates_they_hold():
    """Columns a producer built itself (its own dtypes, x rows out of order) change the
    graph as the same updates as objects do."""
    data = _start(2)
    by_list, by_columns = DynamicGraph.from_data(data), DynamicGraph.from_data(data)
    (s1, d1), (s2, d2) = sorted(Reference(data).e)[:2]
    x = np.arange(2 * D, dtype=np.float64).reshape(2, D)
    by_columns.apply(sg.UpdateBatch(
        op=[3, 0, 5, 2, 1, 4], src=[40, 1, 2, s1, s2, 5], dst=[0, 40, 0, d1, d2, 0],
        w=[0, 0.5, 0, 2.0, 0, 0], xrow=[1, -1, 0, -1, -1, -1], x=x))
    by_list.apply([sg.AddVertex(id=40, x=x[1].tolist()), sg.AddEdge(src=1, dst=40, weight=0.5),
                   sg.UpdateFeatures(id=2, x=x[0].tolist()),
                   sg.UpdateEdge(src=s1, dst=d1, weight=2.0), sg.DeleteEdge(src=s2, dst=d2),
                   sg.DeleteVertex(id=5)])
    for g in (by_columns, by_list):
        np.testing.assert_array_equal(g.x[g.slots(np.array([2, 40]))], x)
        assert 5 not in g.vertex_ids()
    assert set(zip(*map(np.ndarray.tolist, by_columns.edges()))) == set(
        zip(*map(np.ndarray.tolist, by_list.edges())))


def test_update_batch_of_the_wrong_width_rejects_its_feature_updates_by_index():
    graph = DynamicGraph.from_data(_start(3))
    batch = sg.UpdateBatch(op=[5, 0, 3], src=[1, 2, 50], dst=[0, 3, 0], w=[0, 1, 0],
                           xrow=[0, -1, 1], x=np.zeros((2, D + 2)))
    diff = graph.apply(batch, skip_invalid=True)
    assert [(type(e), e.index) for e in diff.rejected] == [(sg.FeatureDimensionError, 0),
                                                          (sg.FeatureDimensionError, 2)]
    assert f"{D + 2} features" in str(diff.rejected[0])
    with pytest.raises(sg.FeatureDimensionError, match="vertex 1"):
        graph.apply(batch)


@pytest.mark.parametrize(("columns", "needle"), [
    ({"op": [0, 6]}, "codes outside"),
    ({"op": [0, 261]}, "codes outside"),
    ({"src": [1.5, 2]}, "must hold integers"),
    ({"src": [1]}, "UpdateBatch.src has shape"),
    ({"xrow": [-1, -1]}, "needs a row of x"),
    ({"xrow": [-1, 3]}, "needs a row of x"),
    ({"x": np.zeros(3)}, "2-D"),
])
def test_update_batch_names_malformed_columns(columns, needle):
    good = {"op": [0, 5], "src": [1, 2], "dst": [2, 0], "w": [1, 0], "xrow": [-1, 0],
            "x": np.zeros((1, D))}
    with pytest.raises(ValueError, match=needle):
        sg.UpdateBatch(**(good | columns))
