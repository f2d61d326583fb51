"""Drift soak: a long LinkBench stream per model family, then the engine's output
embeddings against a PyG forward pass on the final graph.

    python benchmarks/drift.py [--updates 1000000] [--batch-size 1000] [--models gcn gat]

For each model (arxiv-like, 2 layers, hidden 128, untrained; bootstrap on the 80 %
snapshot, LinkBench writes whose adds replay the held-out 20 %): apply ``--updates``
updates in batches, then compare the output layer with PyG's forward on the final graph
in float64 (the exact answer) and in float32 (what PyG itself serves). The floor is a
fresh engine bootstrapped on the final graph, compared the same way: what is left above
it is drift. Sum states are float32 with a rounding bound per row and re-anchored past
``drift_limit`` roundings (`SumAggregation`); the sum families also run once with
re-anchoring off to show what it costs and what it saves. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from engine import Trace, model_for, stream_split
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from streamgnn.allocator import keep_freed_memory
from streamgnn.models.aggr import SumAggregation
from streamgnn.models.gnn import takes_edge_weights
from streamgnn.workers import Engine

MODELS = ["graphconv-sum", "sage-mean", "gcn", "gin", "graphconv-max", "gat"]


@torch.inference_mode()
def forward(model: torch.nn.Module, data, dtype: torch.dtype) -> np.ndarray:
    """PyG's forward of ``model`` over ``data`` in ``dtype``."""
    g = data.to_pyg()
    weight = g.edge_weight.to(dtype) if takes_edge_weights(model) else None
    return copy.deepcopy(model).to(dtype)(g.x.to(dtype), g.edge_index,
                                          edge_weight=weight).numpy()


def errors(engine: Engine, model: torch.nn.Module) -> dict:
    """Max absolute and relative (to max(1, |exact|)) error of the output layer against
    PyG's forward in float64, and PyG's own float32 answer's error the same way."""
    data = engine.graph.to_data()
    exact, pyg32 = forward(model, data, torch.float64), forward(model, data, torch.float32)
    ours = engine.lookup(data.ids)
    scale = np.maximum(1.0, np.abs(exact))
    return {"max_abs": float(np.abs(ours - exact).max()),
            "max_rel": float((np.abs(ours - exact) / scale).max()),
            "pyg_float32_max_abs": float(np.abs(pyg32 - exact).max()),
            "pyg_float32_max_rel": float((np.abs(pyg32 - exact) / scale).max())}


def soak(name: str, updates: int, size: int, split, reanchor: bool) -> dict:
    snapshot, _ = split
    model = model_for(name, snapshot)
    engine = Engine.from_pyg(model, snapshot)
    trace = Trace(*split, weighted=False)
    limit = SumAggregation.drift_limit
    SumAggregation.drift_limit = limit if reanchor else float("inf")
    try:
        pulled, seconds = 0, []
        linear = [layer.aggr.linear for layer in engine.layers]
        for _ in tqdm(range(updates // size), desc=f"{name}{'' if reanchor else ' (off)'}",
                      unit="batch", leave=False):
            batch = trace.batch(size)
            t = time.perf_counter()
            result = engine.apply(batch)
            seconds.append(time.perf_counter() - t)
            pulled += sum(p for p, lin in zip(result.pulled, linear, strict=True) if lin)
    finally:
        SumAggregation.drift_limit = limit
    fresh = Engine.from_pyg(model, engine.graph.to_data())
    return {"model": name, "reanchor": reanchor, "updates": updates // size * size,
            "batch": size, "updates_per_s": size / float(np.median(seconds)),
            "reanchored_rows": pulled, "final": errors(engine, model),
            "fresh": errors(fresh, model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/drift.json"))
    args = parser.parse_args()
    keep_freed_memory()
    split = stream_split(args.preset, weighted=False)
    rows = []
    for name in args.models:
        linear = name not in ("graphconv-max", "gat")
        for reanchor in (True, False) if linear else (True,):
            rows.append(soak(name, args.updates, args.batch_size, split, reanchor))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1))
    table = Table(title=f"{args.preset}: output layer after {args.updates:,} LinkBench "
                        f"updates vs PyG float64 (fresh: an engine bootstrapped on the "
                        f"final graph; PyG f32: PyG's own float32 forward)")
    for col in ("model", "re-anchor", "updates/s (median batch)", "re-anchored rows",
                "max abs: ours", "fresh", "PyG f32", "max rel: ours", "fresh", "PyG f32"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        f, g = r["final"], r["fresh"]
        table.add_row(r["model"], "on" if r["reanchor"] else "off",
                      f"{r['updates_per_s']:,.0f}", f"{r['reanchored_rows']:,}",
                      f"{f['max_abs']:.1e}", f"{g['max_abs']:.1e}",
                      f"{f['pyg_float32_max_abs']:.1e}", f"{f['max_rel']:.1e}",
                      f"{g['max_rel']:.1e}", f"{f['pyg_float32_max_rel']:.1e}")
    Console(width=170).print(table)


if __name__ == "__main__":
    main()
