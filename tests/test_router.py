"""Router parts without a broker: the arrivals gate, placement and the shares of a batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.graph.directory import Directory
from streamgnn.npz import sha256 as _sha256
from streamgnn.npz import write_arrays
from streamgnn.router import Arrivals, Checkpoints
from streamgnn.router.journal import runs
from streamgnn.router.pending import AdmittedColumns, Cut, Origin, Pending
from streamgnn.stream import Record, decode_updates, encode_columns
from streamgnn.updates import ADD_EDGE, ADD_VERTEX, DELETE_VERTEX, UPDATE_FEATURES, UpdateBatch
from streamgnn.workers.engine import _cutter
from streamgnn.workers.placement import initial_owners, shares
from tests.reference import update_strategy


def gate(existing, wait_s=1.0) -> Arrivals:
    known = set(existing)
    return Arrivals(lambda ids: np.array([int(i) in known for i in ids]), wait_s)


def test_an_update_waits_for_its_vertex_and_follows_it_in_order():
    g = gate({1, 2})
    e1, e2 = sg.AddEdge(src=1, dst=9), sg.DeleteEdge(src=1, dst=9)
    f = sg.UpdateFeatures(id=9, x=[1.0])
    other = sg.AddEdge(src=1, dst=2)
    assert g.admit([(e1, "a"), (e2, "b"), (other, "c")], now=0.0) == [(other, "c")]
    assert len(g) == 2
    add = sg.AddVertex(id=9, x=[0.0])
    out = g.admit([(add, "d"), (f, "e")], now=0.5)
    assert [s for _, s in out] == ["d", "a", "b", "e"]  # right after the vertex, in order
    assert len(g) == 0 and g.expired(now=10.0) == []


def test_a_deleted_vertex_is_missing_again_within_the_batch():
    g = gate({1, 2})
    out = g.admit([(sg.DeleteVertex(id=2), 0), (sg.AddEdge(src=1, dst=2), 1)], now=0.0)
    assert [s for _, s in out] == [0] and len(g) == 1
    g.all_applied()


def test_what_waits_too_long_is_given_up_and_the_rest_stays():
    g = gate({1}, wait_s=1.0)
    g.admit([(sg.AddEdge(src=1, dst=5), "old")], now=0.0)
    g.admit([(sg.AddEdge(src=1, dst=5), "new"), (sg.DeleteVertex(id=6), "x")], now=0.8)
    gone = g.expired(now=1.5)
    assert [(w.source, w.vertex) for w in gone] == [("old", 5)]
    assert len(g) == 2
    assert {w.source for w in g.expired(now=2.0)} == {"new", "x"}


UPDATES = st.lists(update_strategy(st.integers(0, 7), st.just(1.0),
                                   st.just([0.5])), max_size=12)


@given(st.sets(st.integers(0, 7)), UPDATES, UPDATES)
def test_admitting_columns_at_once_is_admitting_them_one_by_one(existing, before, updates):
    """`admit_columns` takes the columns whole exactly when `admit` would pass every one
    through in order and none is a vertex something waits for, tracking the same; else it
    changes nothing."""
    one, whole = gate(existing), gate(existing)
    for g in (one, whole):
        g.admit([(u, None) for u in before], now=0.0)
    admitted, waiting = dict(whole._admitted), {v: list(w) for v, w in whole.waiting.items()}
    passed = one.admit([(u, i) for i, u in enumerate(updates)], now=0.0)
    in_order = [s for _, s in passed] == list(range(len(updates)))
    releases = not waiting.keys().isdisjoint(u.id for u in updates if isinstance(u, sg.AddVertex))
    if whole.admit_columns(UpdateBatch.from_updates(updates, 1)):
        assert in_order and not releases
        assert whole._admitted == one._admitted and whole.waiting == one.waiting
    else:
        assert not in_order or releases
        assert whole._admitted == admitted and whole.waiting == waiting


def entries(messages: list[tuple[bool, list[sg.Update]]]) -> tuple[list, list]:
    """Pending entries of ``messages`` (as columns, or as single updates, each its own
    record), and every update with its origin, in order."""
    out, flat = [], []
    for offset, (columnar, updates) in enumerate(messages):
        width = next((len(u.x) for u in updates if hasattr(u, "x")), 0)
        if columnar and updates:
            record = Record("t", 0, offset, b"")
            rows = decode_updates(encode_columns(UpdateBatch.from_updates(updates, width)))
            out.append(AdmittedColumns(rows, record))
            flat += [(u, Origin(record, i)) for i, u in enumerate(updates)]
        else:
            for k, u in enumerate(updates):
                item = (u, Origin(Record("t", 0, 1000 * offset + k, b"")))
                out.append(item)
                flat.append(item)
    return out, flat


@st.composite
def message(draw) -> tuple[bool, list[sg.Update]]:
    """Updates of one message: as columns or not, features of the graph's width (1) or
    another (one width a message)."""
    width = draw(st.sampled_from([1, 2]))
    return draw(st.booleans()), draw(st.lists(update_strategy(
        st.integers(0, 7), st.just(0.5), st.just([0.5] * width)), max_size=6))


@given(st.lists(message(), max_size=6), st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_batches_cut_from_pending_are_its_updates_in_order_in_columns(messages, sizes):
    pending, flat = entries(messages)
    queue = Pending()
    queue.extend(pending)
    assert len(queue) == len(flat)
    for size in sizes:
        cut = Cut.of(queue.take(size), 1)
        taken, flat = flat[:size], flat[size:]
        assert len(queue) == len(flat)
        expected = UpdateBatch.from_updates([u for u, _ in taken], 1)
        for name in ("op", "src", "dst", "w", "xrow", "x"):
            assert np.array_equal(getattr(cut.updates, name), getattr(expected, name))
        assert [cut.item(i) for i in range(len(taken))] == taken
        assert cut.runs() == runs(o.key for _, o in taken)


@given(st.sets(st.integers(0, 7)), st.lists(st.tuples(st.booleans(), UPDATES), max_size=12),
       st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_the_gate_forgets_what_was_taken_and_admits_as_if_it_remembered(existing, messages,
                                                                          takes):
    """A queue that never empties (a long backlog): the gate told what the service took
    off it remembers no more vertices than updates are queued, and admits exactly what a
    gate remembering everything until the queue empties admits (the graph, applying
    what was taken, says the rest)."""
    graph = set(existing)

    def exists(ids):
        return np.array([int(i) in graph for i in ids], bool)

    forgets, remembers = Arrivals(exists, 1.0), Arrivals(exists, 1.0)
    queue: list[sg.Update] = []
    for i, (as_columns, updates) in enumerate(messages):
        items = [(u, (i, k)) for k, u in enumerate(updates)]
        if as_columns and updates and forgets.admit_columns(UpdateBatch.from_updates(
                updates, 1)):
            assert remembers.admit_columns(UpdateBatch.from_updates(updates, 1))
            out = items
        else:
            out = forgets.admit(items, now=0.0)
            assert remembers.admit(items, now=0.0) == out
        queue += [u for u, _ in out]
        take = takes[i % len(takes)]
        for u in queue[:take]:  # what an engine does with them (a duplicate add: nothing)
            if isinstance(u, sg.AddVertex):
                graph.add(u.id)
            elif isinstance(u, sg.DeleteVertex):
                graph.discard(u.id)
        forgets.taken(len(queue[:take]))
        queue = queue[take:]
        if not queue:
            forgets.all_applied()
            remembers.all_applied()
        assert len(forgets._admitted) <= len(queue)


def two_clusters():
    """Vertices 0-9 and 10-19, dense inside, one edge across; vertex 0 is a hub."""
    rng = np.random.default_rng(0)
    src, dst = [], []
    for base in (0, 10):
        for _ in range(40):
            a, b = rng.choice(10, 2, replace=False) + base
            src.append(a)
            dst.append(b)
    src += [1, 2, 3, 4, 5, 10]
    dst += [0, 0, 0, 0, 0, 0]
    return np.arange(20), np.array(src), np.array(dst)


def placed(num_partitions: int, strategy: str = "metis"
           ) -> tuple[DynamicGraph, np.ndarray, Directory]:
    """The two-cluster graph, its initial owners by slot and a directory of them."""
    with pytest.warns(UserWarning, match="parallel edges"):
        data = sg.GraphData.cleaned(*two_clusters(), np.arange(1.0, 21.0)[:, None])
    graph = DynamicGraph.from_data(data)
    owner = initial_owners(graph, num_partitions, strategy)
    slots = graph.vertex_slots()
    return graph, owner, Directory(graph.ext[slots], owner[slots], num_partitions,
                                   graph.num_features, strategy=strategy)


def test_metis_keeps_clusters_together_and_cut_edges_make_ghosts():
    graph, owner, _ = placed(2)
    src, dst, _ = graph.edges()
    part = owner[graph.slots(np.arange(20))]
    assert len(set(part[:10])) == 1 and len(set(part[10:])) == 1 and part[0] != part[10]
    cut = part[src] != part[dst]
    assert cut.sum() <= 2
    cutter = _cutter(graph, owner)
    for q in (0, 1):  # each cut edge's source is a ghost at its sink's, held there
        shard = cutter(q)
        ids = shard["graph/ext"][:len(shard["ghost"])]
        assert set(ids[shard["ghost"]].tolist()) == set(src[cut & (part[dst] == q)].tolist())
        held = set(ids[shard["holders"] != 0].tolist())
        assert held == set(src[cut & (part[src] == q)].tolist())


def test_shares_send_edges_to_their_sink_features_to_owners_deletions_everywhere():
    _, _, directory = placed(2)
    a, b = directory.owners(np.array([0, 10])).tolist()
    batch = UpdateBatch.from_updates([
        sg.AddEdge(src=1, dst=2),          # local
        sg.AddEdge(src=11, dst=3),         # cut: lives at the sink's, 11 a ghost there
        sg.AddVertex(id=100, x=[7.5]),     # least-loaded
        sg.AddEdge(src=100, dst=0),
        sg.UpdateFeatures(id=12, x=[1.0]),
        sg.DeleteVertex(id=19)], 1)
    load_before = directory.load.copy()
    decided = directory.decide(batch)
    routed = shares(decided, batch, 2, (np.zeros(0, np.int64),) * 3)
    directory.commit(decided)
    new = int(directory.owners(np.array([100]))[0])
    assert new == int(np.argmin(load_before))
    edges = {q: set(zip(r.batch.src[r.batch.op == ADD_EDGE].tolist(),
                        r.batch.dst[r.batch.op == ADD_EDGE].tolist()))
             for q, r in enumerate(routed)}
    assert (1, 2) in edges[a] and (11, 3) in edges[a] and (100, 0) in edges[a]
    assert 11 in routed[a].ghosts.tolist()
    assert 11 in routed[b].subscribed[routed[b].subscribers == a].tolist()
    for r in routed:  # every partition deletes 19 (its edges may be anywhere)
        assert 19 in r.batch.src[r.batch.op == DELETE_VERTEX].tolist()
    featured = {(q, int(r.batch.src[i]), int(r.batch.op[i])) for q, r in enumerate(routed)
                for i in np.flatnonzero(r.batch.xrow >= 0)}
    assert featured == {(new, 100, ADD_VERTEX), (b, 12, UPDATE_FEATURES)}
    for r in routed:
        np.testing.assert_array_equal(r.positions, np.sort(r.positions))
        assert r.batch.x[r.batch.xrow[r.batch.xrow >= 0]].tolist() == [
            {100: [7.5], 12: [1.0]}[int(v)] for v in r.batch.src[r.batch.xrow >= 0]]
    assert directory.load.sum() == load_before.sum() + 1 - 1


def test_hash_placement_uses_the_id():
    _, _, directory = placed(3, "hash")
    batch = UpdateBatch.from_updates([sg.AddVertex(id=104, x=[0.0]),
                                      sg.AddEdge(src=104, dst=0)], 1)
    directory.commit(directory.decide(batch))
    assert directory.owners(np.array([104]))[0] == 104 % 3


def test_a_checkpoint_of_another_format_is_refused_by_name(tmp_path):
    (tmp_path / "gen-000001").mkdir()
    (tmp_path / "gen-000001" / "manifest.json").write_text('{"format": "streamgnn-state/1"}')
    with pytest.raises(ValueError, match=r"(?s)streamgnn-state/1.*fresh --state-dir"):
        Checkpoints(tmp_path).load()
    assert Checkpoints(tmp_path / "none").load() is None


def test_a_generation_written_in_the_background_reports_how_it_ended(tmp_path):
    """A forked writer: complete once reaped (also when something else reaped it: the
    manifest tells), failed when the child died or ran past its deadline, and the arrays
    are as they were at the fork whatever the parent wrote after."""
    import os
    import signal

    store = Checkpoints(tmp_path)
    x = np.zeros(1000)

    def files(folder):
        return [write_arrays(folder, "a", {"x": x})]

    writing = store.write(store.begin(), files, {"n": 1}, background=True)
    x[:] = 1  # the parent goes on: the child writes its copy
    assert writing.wait() and writing.done()
    assert np.array_equal(store.load().files["a"]["x"], np.zeros(1000))
    writing = store.write(store.begin(), files, {"n": 2}, background=True)
    os.waitpid(writing._pid, 0)  # reaped elsewhere
    assert writing.wait() and store.load().meta == {"n": 2}

    def stuck(folder):
        signal.pause()  # until killed
        return []

    writing = store.write(store.begin(), stuck, {"n": 3}, background=True)
    assert writing.done() is None
    os.kill(writing._pid, signal.SIGKILL)
    assert writing.wait() is False
    writing = store.write(store.begin(), stuck, {"n": 4}, background=True, deadline_s=0.3)
    assert writing.wait() is False  # killed at its deadline
    with pytest.warns(UserWarning, match="incomplete"):
        assert store.load().meta == {"n": 2}


def test_checkpoints_are_data_and_a_damaged_one_falls_back_to_the_previous(tmp_path):
    """Generations are npz files + a manifest with checksums, loaded without pickle; a
    torn or altered file makes a generation corrupt: loading moves it aside and takes the
    previous one; a missing manifest makes it incomplete: skipped; only ``keep``
    verified ones stay."""
    store = Checkpoints(tmp_path, keep=3)
    for n in range(1, 5):
        generation = store.begin()
        entry = write_arrays(store.folder(generation), "a", {"x": np.full(1000, n)})
        store.commit(generation, {"n": n}, [entry])
        assert generation == n
    assert store.generations() == [2, 3, 4]  # the oldest dropped
    assert store.load().meta == {"n": 4}
    assert np.array_equal(store.load().files["a"]["x"], np.full(1000, 4))
    shard = tmp_path / "gen-000004" / "a.npz"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1  # one bit flipped
    shard.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="gen-000004/a.npz.*SHA-256.*corrupt-gen-000004"):
        assert store.load().meta == {"n": 3}
    shard = tmp_path / "gen-000003" / "a.npz"
    shard.write_bytes(shard.read_bytes()[:200])  # torn
    with pytest.warns(UserWarning, match="does not match"):
        assert store.load().generation == 2
    assert (store.generations(), store.corrupt()) == ([2], [3, 4])
    (tmp_path / "gen-000005").mkdir()  # a save killed before its manifest
    (tmp_path / "gen-000005" / "a.npz.tmp77").write_bytes(b"half")
    store = Checkpoints(tmp_path)
    assert not list(tmp_path.glob("gen-*/*.tmp*"))  # stale temporary files removed
    with pytest.warns(UserWarning, match="gen-000005 is incomplete"):
        assert store.load().generation == 2
    assert store.next_generation() == 6  # numbers moved aside are never reused
    pickled = tmp_path / "gen-000002" / "a.npz"
    np.savez(pickled, x=np.array([{"code": 1}], dtype=object))  # an object array: pickle
    entry = {"name": "a", "bytes": pickled.stat().st_size, "sha256": _sha256(pickled)}
    store.commit(2, {"n": 2}, [entry])
    with pytest.raises(ValueError, match="allow_pickle"):
        store.load()
