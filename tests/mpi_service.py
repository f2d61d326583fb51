"""Run under mpiexec by tests/test_mpi.py: rank 0 serves a backlog of LinkBench updates
(all six types, some invalid) with the other ranks as its workers, starting each full
batch before the one in flight is finished; the same backlog is then served in one
process, one batch at a time. The JSON file named by argv[1] gets how many batches
started before the one before was finished (`Stats.started_early`) and whether the label
changes (every message; event times are the production times), the dead letters (as a
set: the arrivals gate gives up on waiting updates in the order their deadlines pass) and
every layer's embeddings were the same, and whether every vertex had the same owner (the
high in-degree set refreshed every 200 updates: asked of the workers behind the batches
in flight)."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

import streamgnn as sg
from streamgnn.graph import directory
from streamgnn.router import Service, ServiceConfig
from streamgnn.stream import encode
from streamgnn.stream.memory import MemoryBroker, MemoryTransport
from streamgnn.workers import Engine
from streamgnn.workers.mpi import spmd
from tests.test_faults import TOPICS, outputs
from tests.test_stream import linkbench_stream, tiny_setup


def served(snapshot, updates, checkpoint, workers=None) -> tuple[dict, Engine, int]:
    broker = MemoryBroker()
    for u in updates:
        broker.produce(TOPICS.updates, encode(u))
    engine = Engine(checkpoint.model(), sg.DynamicGraph.from_data(snapshot), partitions=2,
                    workers=workers)
    service = Service(engine, checkpoint, MemoryTransport(broker, TOPICS.updates),
                      ServiceConfig(batch_size=50, topics=TOPICS))
    service.run(idle_exit_s=0.5)
    labels, letters = outputs(broker)  # (updates the gate gave up on go in expiry order)
    return {"labels": labels, "letters": sorted(letters)}, engine, service.stats.started_early


def main() -> None:
    torch.set_num_threads(1)
    directory.HIGH_EVERY = 200
    _, snapshot, held_out, checkpoint = tiny_setup()
    updates = linkbench_stream(snapshot, held_out, 30)
    updates[::97] = [sg.AddEdge(src=10**9 + i, dst=0) for i in range(len(updates[::97]))]

    def router(workers) -> dict:
        ranks, engine, early = served(snapshot, updates, checkpoint, workers)
        alone, twin, early_alone = served(snapshot, updates, checkpoint)
        ids = twin.vertex_ids()
        return {"early": early, "early_alone": early_alone, "letters": len(ranks["letters"]),
                "same_outputs": ranks == alone,
                "same_owners": bool(np.array_equal(engine.partition_of(ids),
                                                   twin.partition_of(ids))),
                "rows": max(float(np.abs(engine.lookup(ids, layer)
                                         - twin.lookup(ids, layer)).max())
                            for layer in range(engine.num_layers + 1))}

    result = spmd(checkpoint.model(), router)
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
