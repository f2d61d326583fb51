"""Router parts without a broker: the arrivals gate and placement (RIPPLE++ Alg. 1)."""

from __future__ import annotations

import numpy as np
import pytest

import streamgnn as sg
from streamgnn.router import Arrivals, Checkpoints, Placement
from streamgnn.router.checkpoint import _sha256


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


def test_metis_keeps_clusters_together():
    ids, src, dst = two_clusters()
    p = Placement.from_edges(ids, src, dst, num_partitions=2)
    part = np.array([p.part[i] for i in range(20)])
    assert len(set(part[:10])) == 1 and len(set(part[10:])) == 1 and part[0] != part[10]
    assert p.cut_edges == int((part[src] != part[dst]).sum()) <= 2
    assert 0 in p.high  # in-degree well above twice the average


def test_alg1_routes_local_cut_and_new_vertices():
    ids, src, dst = two_clusters()
    p = Placement.from_edges(ids, src, dst, num_partitions=2)
    a, b = p.part[0], p.part[10]
    cut = p.cut_edges
    batch = [sg.AddEdge(src=1, dst=2),          # local
             sg.AddEdge(src=11, dst=3),         # cut: source's partition + copy to sink's
             sg.AddVertex(id=100, x=[0.0]),     # first linked to hub 0: joins its partition
             sg.AddEdge(src=100, dst=0),
             sg.AddVertex(id=101, x=[0.0]),     # linked to a non-hub: least-loaded
             sg.AddEdge(src=101, dst=12),
             sg.UpdateFeatures(id=12, x=[1.0]),
             sg.DeleteVertex(id=19)]
    load_before = p.load.copy()
    routed = p.route(batch)
    assert routed.partition[0] == a and routed.partition[1] == b
    assert routed.copies == [(1, a)] and p.cut_edges == cut + 1
    assert p.part[100] == a
    assert p.part[101] == int(np.argmin(load_before + np.eye(2, dtype=int)[a]))
    assert routed.partition[6] == p.part[12] and 19 not in p.part
    assert p.load.sum() == load_before.sum() + 2 - 1


def test_hash_placement_uses_the_id():
    ids, src, dst = two_clusters()
    p = Placement.from_edges(ids, src, dst, num_partitions=3, strategy="hash")
    p.route([sg.AddVertex(id=104, x=[0.0]), sg.AddEdge(src=104, dst=0)])
    assert p.part[104] == 104 % 3


def test_a_checkpoint_of_another_format_is_refused_by_name(tmp_path):
    (tmp_path / "gen-000001").mkdir()
    (tmp_path / "gen-000001" / "manifest.json").write_text('{"format": "streamgnn-state/1"}')
    with pytest.raises(ValueError, match=r"streamgnn-state/1.*fresh --state-dir"):
        Checkpoints(tmp_path).load()
    assert Checkpoints(tmp_path / "none").load() is None


def test_checkpoints_are_data_and_a_damaged_one_falls_back_to_the_previous(tmp_path):
    """Generations are npz files + a manifest with checksums, loaded without pickle; a
    torn, altered or missing file, or a missing manifest, makes a generation incomplete
    and loading takes the previous complete one; only ``keep`` complete ones stay."""
    store = Checkpoints(tmp_path, keep=2)
    for n in range(1, 4):
        assert store.save({"n": n}, {"a": {"x": np.full(1000, n)}}) == n
    assert store.generations() == [2, 3]  # the oldest dropped
    assert store.load().meta == {"n": 3}
    assert np.array_equal(store.load().files["a"]["x"], np.full(1000, 3))
    shard = tmp_path / "gen-000003" / "a.npz"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1  # one bit flipped
    shard.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="gen-000003/a.npz.*SHA-256"):
        assert store.load().meta == {"n": 2}
    shard.write_bytes(bytes(raw[:200]))  # torn
    with pytest.warns(UserWarning, match="does not match"):
        assert store.load().generation == 2
    (tmp_path / "gen-000004").mkdir()  # a save killed before its manifest
    (tmp_path / "gen-000004" / "a.npz.tmp77").write_bytes(b"half")
    store = Checkpoints(tmp_path)
    assert not list(tmp_path.glob("gen-*/*.tmp*"))  # stale temporary files removed
    with pytest.warns(UserWarning, match="gen-000004 is incomplete"):
        assert store.load().generation == 2
    pickled = tmp_path / "gen-000002" / "a.npz"
    np.savez(pickled, x=np.array([{"code": 1}], dtype=object))  # an object array: pickle
    entry = {"name": "a", "bytes": pickled.stat().st_size, "sha256": _sha256(pickled)}
    store.commit(2, {"n": 2}, [entry])
    with pytest.raises(ValueError, match="allow_pickle"):
        store.load()
