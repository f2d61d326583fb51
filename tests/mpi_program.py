"""Run under mpiexec by tests/test_mpi.py: rank 0 drives an engine whose shards live on
the other ranks through a LinkBench stream of all six update types (raw batches, invalid
updates left out; some submitted while the one before is still in flight), for each test
model; the answers go to the JSON file named by argv[1]:
per model, the max error against PyG's forward pass on the final graph at every layer,
against the same engine in one process, and after a snapshot restored in one process (the
engine checked is read back from a checkpoint while a batch was left in flight); and
a query's answers (exact, against PyG on the graph plus the query; exact and SRPE, against
the same query in one process)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

import streamgnn as sg
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from streamgnn.workers.mpi import spmd
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import pyg_layers, random_graph
from tests.test_queries import with_query

MODELS = ["pyg-gcn", "pyg-gat", "graphconv-max", "pyg-sage-mean"]


def check(model: torch.nn.Module, workers) -> dict:
    data = random_graph(np.random.default_rng(0), n=300, m=1500, d=F_IN, hubs=3)
    engine = Engine.from_pyg(model, data, partitions=workers.size, workers=workers)
    alone = Engine.from_pyg(model, data, partitions=workers.size)
    workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=0)
    rejected = 0
    batches = []
    for size in (1, 10, 100, 1000, 100):
        s, d, _ = workload.graph.edges()  # an edge there: only its destination's owner knows
        batches.append([sg.AddEdge(src=int(s[0]), dst=int(d[0])), *workload.batch(size),
                        sg.AddEdge(src=10**9, dst=0)])  # and a vertex the directory lacks
        workload.graph.apply(batches[-1], skip_invalid=True)
    for pair in (batches[:1], batches[1:3], batches[3:]):  # two in flight where paired
        for batch in pair:
            engine.submit(batch, skip_invalid=True)
        for batch in pair:
            a = engine.collect()
            b = alone.apply(batch, skip_invalid=True)
            assert a.changed_labels == b.changed_labels
            assert [(type(e), e.index, e.reason) for e in a.rejected] == [
                (type(e), e.index, e.reason) for e in b.rejected]
            rejected += len(a.rejected)
    s, d, _ = workload.graph.edges()
    whole = [sg.AddVertex(id=10**9 + 1, x=[0.0] * F_IN), sg.AddEdge(src=int(s[0]), dst=int(d[0]))]
    for which in (engine, alone):  # refused whole, as one process refuses it, nothing applied
        try:
            which.apply(whole)
        except sg.DuplicateEdgeError as e:
            assert e.index == 1 and not which.contains([10**9 + 1])[0]
        else:
            raise AssertionError("a duplicate edge was applied")
    current = engine.to_data()
    refs = pyg_layers(model, current, torch.float64)
    rng = np.random.default_rng(1)
    req = sg.QueryRequest(
        vertices=[sg.QueryVertex(id=-1 - i, x=rng.standard_normal(F_IN).tolist())
                  for i in range(3)],
        edges=[sg.QueryEdge(src=-1 - i, dst=int(v)) for i, v in enumerate(current.ids[:3])]
        + [sg.QueryEdge(src=int(v), dst=-1 - i) for i, v in enumerate(current.ids[-6:-3])]
        + [sg.QueryEdge(src=-1, dst=-2)])
    restored = Engine.restore(model, engine.snapshot())
    out = {"rejected": rejected, "partitions": engine.num_partitions, "stats": engine.stats()}
    with tempfile.TemporaryDirectory() as folder:
        engine.write(Path(folder))
        engine.submit(batches[0], skip_invalid=True)  # left in flight, as a failed engine
        engine = Engine.read(model, Path(folder), workers=workers)  # ... and its replies go
    query = engine.query(req)
    out["query_pyg"] = float(np.abs(query.embeddings - pyg_layers(
        model, with_query(current, req), torch.float64)[-1][-3:].numpy()).max())
    out["query_alone"] = max(float(np.abs(engine.query(req, budget=b).embeddings
                                          - alone.query(req, budget=b).embeddings).max())
                             for b in (None, 0.0, 0.5))
    for name, other in (("pyg", None), ("alone", alone), ("restored", restored)):
        out[name] = max(float(np.abs(engine.lookup(current.ids, layer) - (
            ref.numpy() if other is None else other.lookup(current.ids, layer))).max())
            for layer, ref in enumerate(refs))
    return out


def main() -> None:
    results = {}
    for name in MODELS:
        model = randomise(ARCHS[name](2), 0).double()
        results[name] = spmd(model, lambda workers, m=model: check(m, workers))
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
