"""Growth benchmark: what a growing graph costs when the engine's tables run out of rows.
A stream of vertex additions (1,000 updates a batch: one in four adds a vertex, the rest
add edges) on a preset, until the tables have grown ``--growths`` times; per model, the
batches that grew them against the median of the others in the same run, and how much
each raised the process's peak resident memory.

    python benchmarks/growth.py [--preset arxiv-like] [--models graphconv-sum gat]
                                [--out benchmarks/results/growth.json]

Each model runs in a process of its own (peak memory is per process). Prints a table and
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from engine import model_for, peak_rss_mb
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine

console = Console(width=160)
BATCH = 1000
MIX = {sg.AddVertex: 1.0, sg.AddEdge: 3.0}


def measure(preset: str, name: str, growths: int) -> dict:
    """One model's run (in this process)."""
    keep_freed_memory()
    torch.set_num_threads(1)
    data = sg.datasets.synthetic(preset, seed=0)
    model = model_for(name, data, 2)
    engine = Engine.from_pyg(model, data)
    sg.warm_up(model)
    tables = engine.shards[0].tables
    workload = LinkBenchWorkload(engine.graph, seed=0, mix=MIX)
    grew, other = [], []
    while len(grew) < growths or len(other) < 10:  # (ordinary batches to compare with)
        batch, rows, peak = workload.batch(BATCH), len(tables.state[-1]), peak_rss_mb()
        start = time.perf_counter()
        engine.apply(batch)
        ms = (time.perf_counter() - start) * 1000
        if len(tables.state[-1]) == rows:
            other.append(ms)
        else:
            grew.append({"ms": ms, "rows_before": rows, "rows_after": len(tables.state[-1]),
                         "peak_mb_added": peak_rss_mb() - peak})
    return {"model": name, "preset": preset, "growth_batches": grew,
            "other_batches": len(other), "other_median_ms": float(np.median(other)),
            "peak_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--models", nargs="+", default=["graphconv-sum", "gat"])
    parser.add_argument("--growths", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/growth.json"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a model's run, as a child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.preset, args.one, args.growths)))
        return
    rows = []
    for name in args.models:
        out = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--growths",
                              str(args.growths), "--one", name], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
    table = Table(title=f"{args.preset}: batches of {BATCH:,} vertex and edge additions")
    for col in ("model", "rows before -> after", "growth batch ms", "other batches ms (p50)",
                "growth / other", "peak MB added"):
        table.add_column(col, justify="right")
    for r in rows:
        for g in r["growth_batches"]:
            table.add_row(r["model"], f"{g['rows_before']:,} -> {g['rows_after']:,}",
                          f"{g['ms']:.1f}", f"{r['other_median_ms']:.1f}",
                          f"{g['ms'] / r['other_median_ms']:.1f}x", f"{g['peak_mb_added']:.0f}")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"batch": BATCH, "rows": rows}, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
