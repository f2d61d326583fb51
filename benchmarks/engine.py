"""Engine benchmark: RIPPLE++'s seven workloads and GraphConv min on the 80/20 protocol
with LinkBench's write mix; the incremental engine vs layer-wise recompute of the affected
region (RC) vs a full PyG forward pass, measured in the same run.

    python benchmarks/engine.py [--preset arxiv-like] [--layers 2 3] [--batch-sizes 1 10 100 1000]
    python benchmarks/engine.py --profile --workloads "GraphConv sum" --layers 2 --batch-sizes 100
    python benchmarks/engine.py --memory

For each workload and depth: bootstrap on the 80 % snapshot; then, per batch size, blocks
of LinkBench writes (adds replay the held-out 20 %) go to the engine and then to RC (the
same batches, so both see the same graph), each batch timed; a full forward pass on the
current graph is timed too. Blocks of ``BLOCK`` batches rather than batch-by-batch turns:
each side runs as it would alone, instead of finding its data evicted from the caches by
the other after every batch (which costs the engine ~30 % at bs=100). Batches are generated
on a graph of their own (so neither side finds the graph warm from the generator) and handed
over as `UpdateBatch` columns, as the router ships them to workers (building those from
update objects costs ~2 us per update more). Prints a table per workload and writes JSON.
``--profile`` instead runs the engine alone under cProfile (first workload, depth and batch
size chosen) and prints where a batch's time goes; ``--memory`` only bootstraps each
workload and reports engine and RC state per vertex and per edge.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.crossings import counted
from streamgnn.models.gnn import pyg_forward
from streamgnn.models.zoo import ModelSpec
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine

console = Console(width=160)
BLOCK = 10  # batches each side applies in a row
# RIPPLE++'s workloads and max's mirror: (label, model, uses edge weights)
WORKLOADS = [
    ("GraphConv sum", "graphconv-sum", False),
    ("GraphSAGE sum", "sage-sum", False),
    ("GraphConv mean", "graphconv-mean", False),
    ("GIN sum", "gin", False),
    ("GraphConv weighted", "graphconv-sum", True),
    ("GraphConv max", "graphconv-max", False),
    ("GraphConv min", "graphconv-min", False),
    ("GAT", "gat", False),
]


def stream_split(preset: str, weighted: bool):
    data = sg.datasets.synthetic(preset, seed=0)
    if not weighted:
        data.weight[:] = 1.0
    return sg.datasets.split_stream(data, frac=0.2, seed=0)


def table_bytes(engine: Engine) -> int:
    """The engine's per-vertex tables beside the graph: embeddings, states and what it
    keeps with them."""
    return sum(t.nbytes for tb in (shard.tables for shard in engine.shards)
               for t in (*tb.h[1:], *tb.state, *tb.drift, *tb.ties, *tb.root, *tb.t)
               if t is not None)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engine_bytes(engine: Engine) -> int:
    """The engine's state: its tables and its graph; with partitions, the shards' graphs
    (ghosts included) and the coordinator's directory."""
    if engine.directory is None:
        return table_bytes(engine) + _graph_bytes(engine.graph)
    return (table_bytes(engine) + sum(_graph_bytes(shard.graph) for shard in engine.shards)
            + engine.directory.nbytes)


def _graph_bytes(graph: sg.DynamicGraph) -> int:
    parts = graph.nbytes()
    return parts["structure"] + parts["features"]


def memory(label: str, name: str, weighted: bool, layers: int, split) -> dict:
    """Engine and RC state after bootstrap, per vertex (tables and features) and per edge
    (graph structure)."""
    _, engine, rc, _ = bootstrap(name, weighted, layers, split, "cpu")
    g = engine.graph.nbytes()
    vertices, edges = engine.graph.num_vertices, engine.graph.num_edges
    return {"workload": label, "layers": layers, "vertices": vertices, "edges": edges,
            "engine_table_bytes_per_vertex": table_bytes(engine) / vertices,
            "rc_table_bytes_per_vertex": table_bytes(rc) / vertices,
            "feature_bytes_per_vertex": g["features"] / vertices,
            "structure_bytes_per_edge": g["structure"] / edges,
            "engine_mb": engine_bytes(engine) / 2**20, "rc_mb": engine_bytes(rc) / 2**20}


def print_memory(rows: list[dict]) -> None:
    table = Table(title="State after bootstrap: per vertex (tables beside the graph, and "
                        "features) and per edge (structure); both sides keep the same graph")
    for col in ("workload", "L", "engine B / vertex", "RC B / vertex", "features B / vertex",
                "structure B / edge", "engine / RC MB", "ratio"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["workload"], str(r["layers"]),
                      f"{r['engine_table_bytes_per_vertex']:,.0f}",
                      f"{r['rc_table_bytes_per_vertex']:,.0f}",
                      f"{r['feature_bytes_per_vertex']:,.0f}",
                      f"{r['structure_bytes_per_edge']:.1f}",
                      f"{r['engine_mb']:.0f} / {r['rc_mb']:.0f}",
                      f"{r['engine_mb'] / r['rc_mb']:.2f}x")
    console.print(table)


def full_forward_seconds(model: torch.nn.Module, engine: Engine, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        pyg_forward(model, engine.graph.to_data(), str(engine.device))
        _sync(engine.device)
        best = min(best, time.perf_counter() - t)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trace:
    """LinkBench batches generated against a graph of its own, kept in step with the
    engines by applying each batch to it too."""

    def __init__(self, snapshot: sg.GraphData, events, weighted: bool) -> None:
        self.graph = sg.DynamicGraph.from_data(snapshot)
        self.workload = LinkBenchWorkload(self.graph, seed=1, arrivals=events,
                                          unit_weights=not weighted)

    def batch(self, size: int) -> sg.UpdateBatch:
        batch = sg.UpdateBatch.from_updates(self.workload.batch(size), self.graph.num_features)
        self.graph.apply(batch)
        return batch


def percentiles(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1000
    return {"median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "batches": len(ms)}


def model_for(name: str, snapshot: sg.GraphData, layers: int = 2) -> torch.nn.Module:
    """The benchmarks' model: untrained, seeded, hidden 128."""
    torch.manual_seed(0)
    return ModelSpec(name, snapshot.num_features, snapshot.num_classes, hidden=128,
                     num_layers=layers).build().eval()


def bootstrap(name: str, weighted: bool, layers: int, split, device: str,
              recompute: bool = True):
    """The model, its engine, RC (if asked) and the LinkBench trace."""
    snapshot, events = split
    model = model_for(name, snapshot, layers)
    engine = Engine.from_pyg(model, snapshot, device)
    rc = Engine.from_pyg(model, snapshot, device, recompute=True) if recompute else None
    return model, engine, rc, Trace(snapshot, events, weighted)


def run(label: str, name: str, weighted: bool, layers: int, split, sizes, budget: float,
        full_repeat: int, device: str) -> list[dict]:
    model, engine, rc, trace = bootstrap(name, weighted, layers, split, device)
    memory = {"engine_mb": engine_bytes(engine) / 2**20, "rc_mb": engine_bytes(rc) / 2**20}
    rows = []
    for recompute in (False, True):  # every kernel compiled, threaded builds too (untimed)
        sg.warm_up(model, device, recompute=recompute)
    for batch in [trace.batch(sizes[0]) for _ in range(BLOCK)]:  # warm caches, untimed
        engine.apply(batch)
        rc.apply(batch)
    for size in sizes:
        times = {"engine": [], "rc": []}
        work = {"engine": [], "rc": []}  # recomputed, pulled vertices, pulled columns
        spent = time.perf_counter()
        while (time.perf_counter() - spent < budget and len(times["engine"]) < 300) or len(
                times["engine"]) < 2:
            block = [trace.batch(size) for _ in range(BLOCK)]
            for key, target in (("engine", engine), ("rc", rc)):
                for batch in block:
                    t = time.perf_counter()
                    result = target.apply(batch)
                    _sync(target.device)
                    times[key].append(time.perf_counter() - t)
                    work[key].append((result.recomputed, result.pulled,
                                      result.pulled_columns))
        full = full_forward_seconds(model, engine, full_repeat)
        row = {"workload": label, "layers": layers, "batch": size,
               "engine": percentiles(times["engine"]), "rc": percentiles(times["rc"]),
               "full": {"median_ms": full * 1000}}
        if engine.device.type != "cpu":  # host/device copies of one more batch, untimed
            with counted() as crossed:
                engine.apply(trace.batch(size))
            row["crossings_per_batch"] = crossed.total
        for key in ("engine", "rc", "full"):
            row[key]["updates_per_s"] = size / (row[key]["median_ms"] / 1000)
        for key in ("engine", "rc"):  # means per layer
            recomputed, pulled, columns = np.mean(work[key], axis=0).round(1).tolist()
            row[key] |= {"recomputed_per_layer": recomputed, "pulled_per_layer": pulled,
                         "pulled_columns_per_layer": columns}
        rows.append(row)
    ids = engine.vertex_ids()
    a, b = engine.lookup(ids), rc.lookup(ids)
    for row in rows:
        row |= memory
        row["engine_vs_rc_max_abs"] = float(np.abs(a - b).max())
        row["engine_vs_rc_max_rel"] = float((np.abs(a - b) / np.maximum(1, np.abs(b))).max())
    return rows


def profile(label: str, name: str, weighted: bool, layers: int, split, size: int,
            batches: int, device: str, top: int = 30) -> None:
    """cProfile of ``engine.apply`` over ``batches`` batches (after a warm-up and 10
    unprofiled batches)."""
    model, engine, _, trace = bootstrap(name, weighted, layers, split, device, recompute=False)
    sg.warm_up(model, device)  # every kernel compiled, threaded builds too (unprofiled)
    for _ in range(10):
        engine.apply(trace.batch(size))
    profiler, spent = cProfile.Profile(), 0.0
    for _ in range(batches):
        batch = trace.batch(size)
        t = time.perf_counter()
        profiler.enable()
        engine.apply(batch)
        _sync(engine.device)
        profiler.disable()
        spent += time.perf_counter() - t
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, _, self, cumulative, _)
    table = Table(title=f"{label}, {layers} layers, bs={size}: {spent / batches * 1e3:.2f} ms "
                        f"a batch under cProfile, {batches} batches; top {top} by own time")
    for col in ("function", "calls/batch", "own us/batch", "with callees us/batch"):
        table.add_column(col, justify="left" if col == "function" else "right")
    by_own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, func), (calls, _, own, cumulative, _) in by_own:
        where = f"{Path(file).name}:{line} {func}" if line else func
        table.add_row(where, f"{calls / batches:.1f}", f"{own / batches * 1e6:.0f}",
                      f"{cumulative / batches * 1e6:.0f}")
    console.print(table)


def machine() -> dict:
    """What sets this run's figures apart from another machine's: the CPU, and the cost of
    a Python call, a numba call, a one-row torch product and a large one (GFLOP/s). The
    engine's small steps follow the first three, RC's large ones the last: ratios move
    from machine to machine (docs/tuning.md, twentieth round)."""
    from numba import njit

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown")
    nothing = njit(lambda a: a)
    a, w = np.zeros(8), torch.randn(256, 128)
    one, many = torch.randn(1, 128), torch.randn(1024, 128)

    def us(call, n: int) -> float:
        call()
        start = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - start) / n * 1e6

    return {"cpu": model, "cores": os.cpu_count(), "avx512": " avx512f" in info,
            "python_call_us": us(lambda: None, 100_000), "numba_call_us": us(
                lambda: nothing(a), 100_000),
            "torch_one_row_product_us": us(lambda: F.linear(one, w), 10_000),
            "torch_product_gflops": 2 * 1024 * 128 * 256 / us(
                lambda: F.linear(many, w), 200) / 1e3}


def print_table(rows: list[dict]) -> None:
    first = rows[0]
    table = Table(title=f"{first['workload']}, {first['layers']} layers "
                        f"(engine {first['engine_mb']:.0f} MB, RC {first['rc_mb']:.0f} MB; "
                        f"max |engine - RC| {first['engine_vs_rc_max_abs']:.1e}, relative "
                        f"{first['engine_vs_rc_max_rel']:.1e})")
    crossings = "crossings_per_batch" in first
    for col in ("batch", "engine upd/s", "RC upd/s", "full upd/s", "engine/RC",
                "engine p50/p99 ms", "RC p50/p99 ms", "full ms",
                *(["host/device copies"] if crossings else [])):
        table.add_column(col, justify="right")
    for r in rows:
        e, c, f = r["engine"], r["rc"], r["full"]
        table.add_row(str(r["batch"]), f"{e['updates_per_s']:,.0f}", f"{c['updates_per_s']:,.0f}",
                      f"{f['updates_per_s']:,.1f}",
                      f"{e['updates_per_s'] / c['updates_per_s']:.1f}x",
                      f"{e['median_ms']:.2f} / {e['p99_ms']:.2f}",
                      f"{c['median_ms']:.2f} / {c['p99_ms']:.2f}", f"{f['median_ms']:.0f}",
                      *([str(r["crossings_per_batch"])] if crossings else []))
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--workloads", nargs="+", default=[w[0] for w in WORKLOADS],
                        help="labels to run (default: all)")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="time budget per batch size (engine and RC together)")
    parser.add_argument("--full-repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine.json"))
    parser.add_argument("--profile", action="store_true",
                        help="profile the engine instead (first workload, depth, batch size)")
    parser.add_argument("--profile-batches", type=int, default=300)
    parser.add_argument("--memory", action="store_true",
                        help="only bootstrap each workload and report its state per vertex "
                             "and per edge (writes engine-memory.json beside --out)")
    parser.add_argument("--device", default="cpu", help="where engine and RC run: cpu or cuda")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (with both cores busy elsewhere, 2 threads wait on "
                             "each other in every parallel torch call: use 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `streamgnn serve` runs the engine

    if args.profile:
        label, name, weighted = next(w for w in WORKLOADS if w[0] in args.workloads)
        profile(label, name, weighted, args.layers[0], stream_split(args.preset, weighted),
                args.batch_sizes[0], args.profile_batches, args.device)
        return
    splits = {}
    results = []
    host = machine()
    console.print(", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in host.items()))
    if args.memory:
        for label, name, weighted in WORKLOADS:
            if label in args.workloads:
                split = splits.setdefault(weighted, stream_split(args.preset, weighted))
                results += [memory(label, name, weighted, layers, split)
                            for layers in args.layers]
        print_memory(results)
        out = args.out.with_name("engine-memory.json")
        out.write_text(json.dumps({"preset": args.preset, "rows": results}, indent=2))
        console.print(f"-> {out}")
        return
    for label, name, weighted in WORKLOADS:
        if label not in args.workloads:
            continue
        if weighted not in splits:
            splits[weighted] = stream_split(args.preset, weighted)
        for layers in args.layers:
            rows = run(label, name, weighted, layers, splits[weighted], args.batch_sizes,
                       args.seconds, args.full_repeat, args.device)
            print_table(rows)
            results += rows
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({
                "preset": args.preset, "device": args.device, "threads": args.threads,
                "machine": host, "rows": results,
                "peak_rss_mb": peak_rss_mb()},
                indent=2))
    console.print(f"peak RSS {peak_rss_mb():.0f} MB"
                  f" -> {args.out}")


if __name__ == "__main__":
    main()
