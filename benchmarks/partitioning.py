"""Initial placement benchmark: METIS against hash and the one-pass streaming partitioners
(LDG and Fennel, vertices streamed in id order and in breadth-first order) on the whole
graph of a preset, for P = 2, 4, 8, 16: the share of edges whose ends two partitions own
(edge cut), the largest partition over the mean in vertices (balance) and in the edges
into them (edge balance), the ghosts a partition holds (mean), the rows the largest
partition holds (its vertices and ghosts: its memory), and the seconds to place (from the
loaded graph to an owner per vertex). Ratios are against METIS in the same run; the
strategies take turns within each repeat.

    python benchmarks/partitioning.py [--presets arxiv-like products-like]
                                      [--parts 2 4 8 16] [--repeats 3]
                                      [--strategies metis hash ldg-id ... fennel-bfs]
                                      [--out benchmarks/results/partitioning.json]

Prints a table per preset and writes JSON after each row, keeping the rows of the presets
it does not run. Products-like: ``--presets products-like --parts 4 16 --repeats 1
--strategies fennel-id ldg-id fennel-bfs hash metis`` (~20 min on 2 cores; METIS last, as
at P = 16 it does not fit 24 GB: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.workers.partition_files import summarize
from streamgnn.workers.placement import initial_owners, metis_parts, stream_parts

console = Console(width=160)
Placer = Callable[[DynamicGraph, int], np.ndarray]
PLACERS: dict[str, Placer] = {
    "metis": metis_parts,
    "hash": lambda g, p: initial_owners(g, p, "hash"),
    "ldg-id": lambda g, p: stream_parts(g, p, "ldg", "id"),
    "ldg-bfs": lambda g, p: stream_parts(g, p, "ldg", "bfs"),
    "fennel-id": lambda g, p: stream_parts(g, p, "fennel", "id"),
    "fennel-bfs": lambda g, p: stream_parts(g, p, "fennel", "bfs"),
}


def measure(preset: str, parts: list[int], repeats: int, names: list[str],
            done: Callable[[dict], None]) -> None:
    """Hands ``done`` a row per (P, strategy) on ``preset``'s whole graph as soon as the
    strategy's last repeat at that P is placed."""
    t = time.perf_counter()
    data = sg.datasets.synthetic(preset, seed=0)
    graph = DynamicGraph.from_data(data)  # slot i holds data.ids[i]
    src, dst = data.positions(data.src), data.positions(data.dst)
    n = data.num_vertices
    console.print(f"{data} loaded in {time.perf_counter() - t:.0f} s")
    for p in parts:
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # turns rotate
                start = time.perf_counter()
                owner = PLACERS[name](graph, p)[:n]
                seconds[name].append(time.perf_counter() - start)
                if r < repeats - 1:
                    continue
                s = summarize(src, dst, owner, p)
                done({"preset": preset, "vertices": n, "edges": data.num_edges,
                      "partitions": p, "strategy": name, "edge_cut": s.cut,
                      "balance": s.balance,
                      "edge_balance": float(s.edges.max() / s.edges.mean()),
                      "ghosts_mean": float(s.ghosts.mean()),
                      "rows_max": int((s.vertices + s.ghosts).max()),
                      "repeats": repeats, "seconds": float(np.median(seconds[name])),
                      "seconds_each": seconds[name]})
        console.print(f"P={p} done")


def show(rows: list[dict]) -> None:
    """One table per preset, each strategy against METIS at the same P."""
    metis = {(r["preset"], r["partitions"]): r for r in rows if r["strategy"] == "metis"}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        table = Table(title=f"initial placement, {preset} (whole graph)")
        for col in ("P", "strategy", "edge cut", "/ METIS", "balance", "edge balance",
                    "ghosts mean", "/ METIS", "largest rows", "/ METIS", "s to place",
                    "/ METIS"):
            table.add_column(col, justify="left" if col == "strategy" else "right")
        order = list(PLACERS)
        for r in sorted((r for r in rows if r["preset"] == preset),
                        key=lambda r: (r["partitions"], order.index(r["strategy"]))):
            m = metis[preset, r["partitions"]]
            table.add_row(str(r["partitions"]), r["strategy"], f"{r['edge_cut']:.1%}",
                          f"{r['edge_cut'] / m['edge_cut']:.2f}", f"{r['balance']:.3f}",
                          f"{r['edge_balance']:.3f}", f"{r['ghosts_mean']:,.0f}",
                          f"{r['ghosts_mean'] / m['ghosts_mean']:.2f}",
                          f"{r['rows_max']:,}", f"{r['rows_max'] / m['rows_max']:.2f}",
                          f"{r['seconds']:.2f}", f"{r['seconds'] / m['seconds']:.3f}")
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["arxiv-like", "products-like"])
    parser.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", choices=list(PLACERS),
                        default=list(PLACERS), help="(METIS must be among them)")
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/partitioning.json"))
    args = parser.parse_args()
    tiny = DynamicGraph.from_data(sg.datasets.synthetic("tiny", seed=0))
    for placer in PLACERS.values():  # compiled (or loaded from numba's cache) before timing
        placer(tiny, 2)
    rows = []  # the other presets' rows in --out stay
    if args.out.exists():
        rows = [r for r in json.loads(args.out.read_text())["rows"]
                if r["preset"] not in args.presets]
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def done(row: dict) -> None:  # written at once: a later strategy may run out of memory
        rows.append(row)
        args.out.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "machine": platform.processor()
            or platform.machine(), "cpus": os.cpu_count(), "rows": rows}, indent=1))

    for preset in args.presets:
        measure(preset, args.parts, args.repeats, args.strategies, done)
        show([r for r in rows if r["preset"] == preset])
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
