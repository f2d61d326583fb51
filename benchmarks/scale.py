"""Scale run: a large preset bootstrapped and streamed, in one process or by rank 0 + N
worker ranks.

    python benchmarks/scale.py --dataset products-like                # one process
    mpiexec -n 5 python benchmarks/scale.py --dataset products-like   # 4 workers

Rank 0 builds the graph (the 80 % snapshot); in one process the engine bootstraps it
there; under mpiexec rank 0 places it (METIS) and sends each worker its partition, and the
workers compute their first state layer by layer, exchanging ghost rows between layers.
Then LinkBench batches of ``--batch`` updates are streamed (the kernels compiled first,
`sg.warm_up`). Prints and writes (benchmarks/results/scale-<preset>-<model>-<workers>w.json,
0 workers: one process): bootstrap seconds, engine state, updates/s, the slowest batch
(one that grows the tables), and the peak resident memory of every rank (rank 0's also
as it stood after the bootstrap).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from engine import engine_bytes, peak_rss_mb
from mpi4py import MPI

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.graph import DynamicGraph
from streamgnn.models.zoo import ModelSpec
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from streamgnn.workers.mpi import spmd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="products-like",
                        help="a preset, or a .npz file `streamgnn datasets generate` wrote "
                             "(products-like takes minutes to generate)")
    parser.add_argument("--model", default="graphconv-sum")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as `streamgnn serve` runs the engine
    comm = MPI.COMM_WORLD
    meta = np.zeros(2, np.int64)  # features, classes: rank 0 knows them
    graph, name = None, None
    if comm.Get_rank() == 0:
        t = time.perf_counter()
        data = sg.datasets.open_dataset(args.dataset, seed=0)
        name, classes = data.name, data.num_classes
        data = sg.datasets.split_stream(data, frac=0.2, seed=0)[0]  # not the held out
        graph = DynamicGraph.from_data(data)
        del data  # the engine works on the graph alone: no second copy of the features
        print(f"{name}: {graph.num_vertices:,} vertices, {graph.num_edges:,} edges in "
              f"the snapshot ({time.perf_counter() - t:.0f} s to open)", flush=True)
        meta[:] = graph.num_features, classes
    comm.Bcast(meta, root=0)
    torch.manual_seed(0)
    model = ModelSpec(args.model, int(meta[0]), int(meta[1]), hidden=128,
                      num_layers=2).build().eval()

    def run(workers) -> dict:
        sg.warm_up(model, partitions=1 if workers is None else 2)  # compiled first, untimed
        t = time.perf_counter()
        engine = (Engine(model, graph) if workers is None else
                  Engine(model, graph, partitions=workers.size, workers=workers))
        bootstrap = time.perf_counter() - t
        print(f"bootstrapped in {bootstrap:.0f} s", flush=True)
        workload = LinkBenchWorkload(engine.graph, seed=1)
        peak_bootstrapped, times = peak_rss_mb(), []
        for _ in range(args.batches):
            batch = sg.UpdateBatch.from_updates(workload.batch(args.batch),
                                                engine.graph.num_features)
            t = time.perf_counter()
            engine.apply(batch)
            times.append(time.perf_counter() - t)
        stats = engine.stats()
        return {"dataset": name, "model": args.model,
                "workers": 0 if workers is None else workers.size,
                "bootstrap_s": bootstrap, "engine_state_mb": (
                    engine_bytes(engine) / 2**20 if workers is None else None),
                "batch": args.batch,
                "median_batch_s": float(np.median(times)),
                "updates_per_s": args.batch / float(np.median(times)),
                "max_batch_s": max(times),
                "halo": [s["halo"] for s in stats], "vertices": [s["vertices"] for s in stats],
                "peak_rss_mb_rank0_bootstrapped": peak_bootstrapped,
                "peak_rss_mb_rank0": peak_rss_mb()}

    result = run(None) if comm.Get_size() == 1 else spmd(model, run)
    peaks = comm.gather(peak_rss_mb(), root=0)  # after spmd: the workers have stopped
    if comm.Get_rank() == 0:
        result["peak_rss_mb"] = peaks
        print(json.dumps(result, indent=2), flush=True)
        out = Path(f"benchmarks/results/scale-{name}-{args.model}-"
                   f"{result['workers']}w.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
