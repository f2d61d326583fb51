"""Router parts without a broker: the arrivals gate and placement (RIPPLE++ Alg. 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import streamgnn as sg
from streamgnn.router import Arrivals, Checkpoints, Placement


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
    torch.save({"format": "streamgnn-service/1"}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"streamgnn-service/1.*fresh --state-dir"):
        Checkpoints(tmp_path).load()
    assert Checkpoints(tmp_path / "none").load() is None
