"""Scale run: a large preset bootstrapped and streamed, in one process or by rank 0 + N
worker ranks.

    python benchmarks/scale.py --dataset products-like                # one process
    mpiexec -n 5 python benchmarks/scale.py --dataset products-like   # 4 workers
    streamgnn datasets partition --dataset arxiv-like --parts 4 --holdout 0.2 -o parts
    mpiexec -n 5 python benchmarks/scale.py --dataset arxiv-like --partitions-from parts

Rank 0 builds the graph (the 80 % snapshot); in one process the engine bootstraps it
there; under mpiexec rank 0 places it (METIS) and sends each worker its partition, and the
workers compute their first state layer by layer, exchanging ghost rows between layers.
With ``--partitions-from`` (the snapshot written as partition files) rank 0 reads the
map alone (and the labels, a part at a time, for the model's classes) and each worker its
own file (`Engine.from_partitions`). Then LinkBench batches of ``--batch`` updates are
streamed (the kernels compiled first, `sg.warm_up`); from partition files, where no rank
holds the whole graph to draw them from, batches of random edges between the vertices
and random features (half each; duplicate edges left out). Prints and writes
(benchmarks/results/scale-<preset>-<model>-<workers>w.json, 0 workers: one process;
``-files`` from partition files): bootstrap seconds, engine state, updates/s one batch at
a time and, under mpiexec, streamed as `serve` streams them (rank 0 routes the next batch
while the workers compute one: ``pipelined_updates_per_s``), the slowest batch (one that
grows the tables), the peak resident memory of every rank (rank 0's also as it stood
after the bootstrap) and, under mpiexec, each worker's share of a batch spent waiting in
the ghost-row exchanges (`idle.instrument_worker`: medians and 10th / 90th percentiles
over the batches taken one at a time). Under mpiexec rank 0 keeps the graph after the
bootstrap only to draw the batches from (its engine keeps the directory alone).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from engine import engine_bytes, peak_rss_mb
from idle import instrument_worker
from mpi4py import MPI

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.graph import DynamicGraph
from streamgnn.models.zoo import ModelSpec
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from streamgnn.workers.mpi import spmd
from streamgnn.workers.partition_files import read_map, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="products-like",
                        help="a preset, or a .npz file `streamgnn datasets generate` wrote "
                             "(products-like takes minutes to generate)")
    parser.add_argument("--model", default="graphconv-sum")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--partitions-from", type=Path, metavar="DIR",
                        help="start from the partition files of --dataset's snapshot in DIR "
                             "(`streamgnn datasets partition --holdout 0.2`), not the dataset")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as `streamgnn serve` runs the engine
    comm = MPI.COMM_WORLD
    meta = np.zeros(2, np.int64)  # features, classes: rank 0 knows them
    graph, name, folder = None, None, args.partitions_from
    if comm.Get_rank() == 0 and folder is not None:
        name, parts = Path(args.dataset).stem, read_map(folder).parts
        meta[:] = sizes(folder, parts)[0], _classes(folder, parts)
        print(f"{name}: {parts} partition files in {folder}", flush=True)
    elif comm.Get_rank() == 0:
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
        if folder is not None:
            engine = Engine.from_partitions(model, folder, workers=workers)
        elif workers is None:
            engine = Engine(model, graph)
        else:
            engine = Engine(model, graph, partitions=workers.size, workers=workers)
        bootstrap = time.perf_counter() - t
        print(f"bootstrapped in {bootstrap:.0f} s", flush=True)
        if folder is not None:
            draw = _random_updates(engine.vertex_ids(), engine.num_features, seed=1)
        else:
            workload = LinkBenchWorkload(graph, seed=1)
            # in one process the engine applies each batch to this graph; under mpiexec the
            # engine let go of it (the workers have their partitions): the workload
            # applies them
            draw = workload.batch if workers is None else workload.applied
        peak_bootstrapped, times, busy = peak_rss_mb(), [], []
        for _ in range(args.batches):
            batch = sg.UpdateBatch.from_updates(draw(args.batch), engine.num_features)
            t = time.perf_counter()
            engine.apply(batch, skip_invalid=True)
            times.append(time.perf_counter() - t)
            busy.append([s["busy_s"] for s in engine.stats()])  # untimed: a round trip
        pipelined = None if workers is None else args.batch * args.batches / _pipelined(
            engine, [sg.UpdateBatch.from_updates(draw(args.batch), engine.num_features)
                     for _ in range(args.batches)])
        stats = engine.stats()
        timed = [] if workers is None else [s["applies"][-2 * args.batches:-args.batches]
                                            for s in stats]  # (then the streamed ones)
        return {"exchange_share": [_spread([a["exchange_s"] / (a["exchange_s"] + a["own_s"])
                                            for a in log]) for log in timed],
                "dataset": name, "model": args.model,
                "source": "dataset" if folder is None else "partition files",
                "workers": 0 if workers is None else workers.size,
                "bootstrap_s": bootstrap, "engine_state_mb": (
                    engine_bytes(engine) / 2**20 if workers is None else None),
                "batch": args.batch,
                "median_batch_s": float(np.median(times)),
                "updates_per_s": args.batch / float(np.median(times)),
                "pipelined_updates_per_s": pipelined,
                "max_batch_s": max(times), "busy_s": _median_busy(busy),
                "halo": [s["halo"] for s in stats], "vertices": [s["vertices"] for s in stats],
                "peak_rss_mb_rank0_bootstrapped": peak_bootstrapped,
                "peak_rss_mb_rank0": peak_rss_mb()}

    if comm.Get_rank() > 0:
        instrument_worker([])  # its seconds in the exchanges, per batch
    result = run(None) if comm.Get_size() == 1 else spmd(model, run)
    peaks = comm.gather(peak_rss_mb(), root=0)  # after spmd: the workers have stopped
    if comm.Get_rank() == 0:
        result["peak_rss_mb"] = peaks
        print(json.dumps(result, indent=2), flush=True)
        busy = np.array(result["busy_s"]) * 1e3
        print("busy ms per partition, median per step: " + "; ".join(
            f"{part}: " + " / ".join(f"{ms:.2f}" for ms in steps)
            for part, steps in enumerate(busy.tolist())) + "; slowest / mean "
              "per step " + " / ".join(f"{r:.2f}" for r in busy.max(0) / busy.mean(0)),
              flush=True)
        for part, share in enumerate(result["exchange_share"]):
            print(f"worker {part}: share of a batch in the exchanges (waiting), median "
                  f"{share['median']:.3f} (p10 {share['p10']:.3f}, p90 {share['p90']:.3f})",
                  flush=True)
        print(f"updates/s: {result['updates_per_s']:,.0f} a batch at a time" + (
            "" if result["pipelined_updates_per_s"] is None else
            f", {result['pipelined_updates_per_s']:,.0f} streamed as serve streams"),
              flush=True)
        out = Path(f"benchmarks/results/scale-{name}-{args.model}-{result['workers']}w"
                   f"{'' if folder is None else '-files'}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))


def _pipelined(engine: Engine, batches: list[sg.UpdateBatch]) -> float:
    """Seconds to stream ``batches`` as `serve` does: each submitted while the workers may
    still compute the one before (up to the workers' `max_in_flight`: rank 0 decides and
    routes batch i + 1 while they compute batch i), collected oldest first."""
    in_flight = engine.workers.max_in_flight
    pending, start = 0, time.perf_counter()
    for batch in batches:
        if pending == in_flight:
            engine.collect()
            pending -= 1
        engine.submit(batch, skip_invalid=True)
        pending += 1
    for _ in range(pending):
        engine.collect()
    return time.perf_counter() - start


def _spread(values: list[float]) -> dict:
    """Median and 10th / 90th percentiles of ``values``."""
    p10, median, p90 = np.percentile(values, [10, 50, 90]).tolist()
    return {"median": median, "p10": p10, "p90": p90}


def _median_busy(busy: list[list[list[float]]]) -> list[list[float]]:
    """Per partition (a worker's shard, or the one process) and step between exchanges, the
    median over the batches of its compute seconds; ``busy`` is per batch, partition and
    step (a batch with fewer steps leaves its missing steps out of their medians)."""
    steps = max(len(b) for batch in busy for b in batch)
    table = np.full((len(busy), len(busy[0]), steps), np.nan)
    for i, batch in enumerate(busy):
        for part, b in enumerate(batch):
            table[i, part, :len(b)] = b
    return np.nanmedian(table, axis=0).tolist()


def _classes(folder: Path, parts: int) -> int:
    """The classes of the vertices' labels in the partition files (a part's at a time)."""
    most = -1
    for p in range(parts):
        with np.load(folder / f"part-{p}.npz", allow_pickle=False) as npz:
            most = max(most, int(npz["y"].max(initial=-1)))
    return most + 1


def _random_updates(ids: np.ndarray, num_features: int, seed: int
                    ) -> Callable[[int], list[sg.Update]]:
    """``draw(size)``: half edges between random vertices of ``ids`` (unit weight; one
    already there is left out when applied), half random features of random vertices."""
    rng = np.random.default_rng(seed)

    def draw(size: int) -> list[sg.Update]:
        edges, features = size // 2, size - size // 2
        ends = rng.choice(ids, (edges, 2)).tolist()
        rows = rng.standard_normal((features, num_features)).astype(np.float32).tolist()
        return ([sg.AddEdge(src=a, dst=b) for a, b in ends]
                + [sg.UpdateFeatures(id=v, x=row)
                   for v, row in zip(rng.choice(ids, features).tolist(), rows, strict=True)])

    return draw


if __name__ == "__main__":
    main()
