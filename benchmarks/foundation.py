"""Foundation benchmark: dataset generation, layer-wise inference vs PyG's forward pass,
graph-store memory vs static CSR, and mixed-batch update latency.

    python benchmarks/foundation.py [--preset arxiv-like] [--out benchmarks/results/foundation.json]

Prints tables and writes JSON. All comparisons are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.models import decompose, layerwise_inference
from streamgnn.models.gnn import pyg_forward
from streamgnn.models.zoo import ModelSpec
from streamgnn.replay import LinkBenchWorkload

console = Console(width=160)
MODELS = ("sage-mean", "gcn", "gin", "graphconv-max", "gat")


def timed(fn, repeat: int = 1):
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def static_csr_bytes(n: int, m: int) -> int:
    """One CSR: int64 row pointers, int32 column indices, float32 weights."""
    return 8 * (n + 1) + 4 * m + 4 * m


def bench_generation(preset: str) -> dict:
    seconds, data = timed(lambda: sg.datasets.synthetic(preset, seed=0))
    return {"preset": preset, "seconds": seconds, "vertices": data.num_vertices,
            "edges": data.num_edges}, data


def bench_inference(data: sg.GraphData, graph: DynamicGraph) -> list[dict]:
    rows = []
    for name in MODELS:
        torch.manual_seed(0)
        model = ModelSpec(name, data.num_features, data.num_classes, hidden=128).build().eval()
        layers = decompose(model)
        t_ours, hs = timed(lambda ls=layers: layerwise_inference(ls, graph, progress=False), 2)

        t_pyg, ref = timed(lambda m=model: pyg_forward(m, data), 2)
        err = (hs[-1][graph.slots(data.ids)] - ref).abs().max().item()
        rows.append({"model": name, "ours_s": t_ours, "pyg_s": t_pyg,
                     "ratio": t_ours / t_pyg, "max_abs_err": err})
    return rows


def bench_updates(data: sg.GraphData, batches: int) -> tuple[list[dict], dict]:
    graph = DynamicGraph.from_data(data)
    n, m = graph.num_vertices, graph.num_edges
    csr = static_csr_bytes(n, m)
    memory = {"bootstrap": graph.nbytes(), "static_csr_one_direction": csr,
              "static_csr_both_directions": 2 * csr}
    workload = LinkBenchWorkload(graph, seed=1)
    graph.apply(workload.batch(1000))  # compile and warm up
    rows = []
    for size in (1, 10, 100, 1000):
        times = []
        for _ in range(batches if size > 1 else 5 * batches):
            batch = workload.batch(size)
            t = time.perf_counter()
            graph.apply(batch)
            times.append(time.perf_counter() - t)
        ms = np.array(times) * 1000
        rows.append({"batch": size, "median_ms": float(np.median(ms)),
                     "p99_ms": float(np.percentile(ms, 99)),
                     "updates_per_s": size / float(np.median(ms) / 1000)})
    memory["after_updates"] = graph.nbytes()
    memory["after_updates_static_csr_both_directions"] = 2 * static_csr_bytes(
        graph.num_vertices, graph.num_edges)
    return rows, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--batches", type=int, default=100,
                        help="batches per batch size in the update benchmark")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/foundation.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)

    gen, data = bench_generation(args.preset)
    console.print(f"generated {data} in [bold]{gen['seconds']:.2f} s[/]")

    graph = DynamicGraph.from_data(data)
    inference = bench_inference(data, graph)
    table = Table(title=f"full-graph inference on {args.preset} (2 layers, hidden 128)")
    for col in ("model", "layer-wise (all layers) s", "PyG forward s", "ratio", "max |err|"):
        table.add_column(col, justify="right")
    for r in inference:
        table.add_row(r["model"], f"{r['ours_s']:.2f}", f"{r['pyg_s']:.2f}",
                      f"{r['ratio']:.2f}x", f"{r['max_abs_err']:.1e}")
    console.print(table)

    updates, memory = bench_updates(data, args.batches)
    table = Table(title="graph store: LinkBench write mix, batches applied atomically")
    for col in ("batch size", "median ms", "p99 ms", "updates/s"):
        table.add_column(col, justify="right")
    for r in updates:
        table.add_row(str(r["batch"]), f"{r['median_ms']:.3f}", f"{r['p99_ms']:.3f}",
                      f"{r['updates_per_s']:,.0f}")
    console.print(table)

    table = Table(title="graph structure memory (features excluded)")
    for col in ("state", "dynamic store MB", "static CSR+CSC MB", "ratio"):
        table.add_column(col, justify="right")
    for label, ours, static in (
            ("bootstrap", memory["bootstrap"]["structure"], memory["static_csr_both_directions"]),
            ("after updates", memory["after_updates"]["structure"],
             memory["after_updates_static_csr_both_directions"])):
        table.add_row(label, f"{ours / 2**20:.1f}", f"{static / 2**20:.1f}",
                      f"{ours / static:.2f}x")
    console.print(table)
    console.print(f"(one-direction static CSR: {memory['static_csr_one_direction'] / 2**20:.1f} "
                  f"MB; features: {memory['bootstrap']['features'] / 2**20:.1f} MB)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"generation": gen, "inference": inference,
                                    "updates": updates, "memory": memory}, indent=2))
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
