"""LinkBench-style workload: batches are valid in order and follow the write mix."""

from __future__ import annotations

import collections

import numpy as np

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.replay import WRITE_MIX, LinkBenchWorkload


def test_batches_apply_cleanly_and_follow_the_mix():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("tiny", seed=4))
    workload = LinkBenchWorkload(graph, seed=5)
    seen = collections.Counter()
    for size in (1, 10, 100, 1000, 1000, 1000):
        batch = workload.batch(size)
        assert len(batch) == size
        graph.apply(batch)  # raises if any update is invalid in order
        seen.update(type(u) for u in batch)
    total = sum(seen.values())
    expected = np.array(list(WRITE_MIX.values())) / sum(WRITE_MIX.values())
    observed = np.array([seen[k] / total for k in WRITE_MIX])
    assert np.abs(observed - expected).max() < 0.03


def test_link_writes_are_skewed():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("small", seed=1))
    batch = LinkBenchWorkload(graph, seed=2).batch(3000)
    counts = collections.Counter(u.src for u in batch if isinstance(u, sg.AddEdge))
    top = sum(c for _, c in counts.most_common(len(counts) // 100 + 1))
    assert top / sum(counts.values()) > 0.05  # the top 1 % of sources get > 5 % of links


def test_held_out_arrivals_replay_in_order():
    data = sg.datasets.synthetic("tiny", seed=6)
    snapshot, events = sg.datasets.split_stream(data, frac=0.2, seed=2)
    graph = DynamicGraph.from_data(snapshot)
    workload = LinkBenchWorkload(graph, seed=3, arrivals=events)
    seen = []
    for _ in range(10):
        batch = workload.batch(200)
        graph.apply(batch)
        seen += [u for u in batch if isinstance(u, (sg.AddVertex, sg.AddEdge))]
    arrived = [u for u in seen if u in events]
    assert len(arrived) > 0.9 * len(seen)  # the adds come from the held-out stream...
    order = [events.index(u) for u in arrived[:200]]
    assert order == sorted(order)          # ...in its order


def test_unit_weights():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("tiny", seed=1))
    batch = LinkBenchWorkload(graph, seed=2, unit_weights=True).batch(500)
    assert {u.weight for u in batch if isinstance(u, (sg.AddEdge, sg.UpdateEdge))} == {1.0}
