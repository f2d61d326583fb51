"""Distributed-engine benchmark (one process): communication, placement and throughput of
the engine split into P partitions, each against its baseline in the same run.

    python benchmarks/distributed.py [--preset arxiv-like] [--parts communication ...]
    python benchmarks/distributed.py --parts placement --updates 200000 --batch 1000 \
        --high-every 50000

- communication: bytes exchanged per batch by the engine (ghost rows of the sources that
  changed, sent once per holding partition before each superstep but the first, and the
  ghosts' features the router sends with the batch) vs distributed RC (the
  same affected region recomputed, every remote in-neighbor row fetched on demand: 8-byte
  request + 8-byte id + the row), and what two other designs would send for the same
  batches: the engine with messages combined at the sender plus remote rows fetched for
  its pulls. GraphConv-sum and SAGE-max, 2 layers; P = 2, 4, 8; bs = 10, 100, 1000.
- placement: METIS vs hash initial owners (edge cut, halo, bytes, updates/s), and RIPPLE++
  Alg. 1 vs hash for new vertices (cut edges the stream creates per 10K updates), METIS
  with the high in-degree set named once and refreshed every ``--high-every`` updates;
  ``--updates`` and ``--batch`` set the stream's length (10,000) and batch size (100).
- ghosts: the bytes a shard keeps per ghost in each of its tables after bootstrap
  (GraphConv-sum, GAT and GraphConv-max, 2 layers, P = 4), beside the ghost's features,
  and the state in all (tables, graphs, directory) against one partition's.
- throughput: P = 1, 2, 4, GraphConv-sum 2 layers, bs = 100 and 1000: updates/s, the
  slowest over the mean partition's compute per superstep, memory.

Rows are written to benchmarks/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from engine import Trace, engine_bytes, model_for, stream_split
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.graph.directory import HIGH_EVERY
from streamgnn.updates import ADD_EDGE
from streamgnn.workers import Engine

console = Console(width=160)
HIDDEN = 128


def exchanged_bytes(engine: Engine) -> int:
    """What the last batch moved between partitions: the exchanges' buffers and the
    ghosts' features the router sent with it."""
    return sum(sum(s["sent_bytes"]) + s["ghost_feature_bytes"] for s in engine.stats())


def traffic(engine: Engine, batch) -> dict:
    """Bytes the batch exchanged, and the alternatives' estimates."""
    row = HIDDEN * 4  # float32 rows of every layer's input (features are 128-d too)
    result = engine.apply(batch)
    return {"exchange": exchanged_bytes(engine),
            "on_demand": sum(result.remote_reads) * (row + 16),
            "combined": sum(result.combined_messages) * (row + 8)}


def communication(split, sizes: list[int], parts: list[int]) -> list[dict]:
    snapshot, events = split
    rows = []
    for name in ("graphconv-sum", "sage-max"):
        model = model_for(name, snapshot)
        for p in parts:
            engine = Engine.from_pyg(model, snapshot, partitions=p)
            rc = Engine.from_pyg(model, snapshot, partitions=p, recompute=True)
            trace = Trace(snapshot, events, weighted=False)
            for size in sizes:
                batches = [trace.batch(size) for _ in range(max(3, 2000 // size))]
                ours = {k: np.mean(v) for k, v in _columns(
                    [traffic(engine, b) for b in batches]).items()}
                theirs = {k: np.mean(v) for k, v in _columns(
                    [traffic(rc, b) for b in batches]).items()}
                rows.append({"model": name, "partitions": p, "batch": size,
                             "engine_bytes": float(ours["exchange"]),
                             "engine_combined_bytes": float(ours["combined"]
                                                            + ours["on_demand"]),
                             "rc_bytes": float(theirs["on_demand"]),
                             "rc_over_engine": float(theirs["on_demand"]
                                                     / max(ours["exchange"], 1))})
                console.print(rows[-1])
            del engine, rc
    table = Table(title="Bytes exchanged per batch (mean), arxiv-like, 2 layers")
    for col in ("model", "P", "batch", "engine (ghost rows)", "engine, combined at sender",
                "RC (rows on demand)", "RC / engine"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["model"], str(r["partitions"]), str(r["batch"]),
                      _kb(r["engine_bytes"]), _kb(r["engine_combined_bytes"]),
                      _kb(r["rc_bytes"]), f"{r['rc_over_engine']:.1f}x")
    console.print(table)
    return rows


def throughput(split, sizes: list[int], parts: list[int], seconds: float) -> list[dict]:
    """Every P's engine (each on its own copy of the trace) takes batches in turn, the
    order rotating each round: the machine's drift over the run then falls on all of
    them alike, and the time ratios are between batches measured side by side."""
    snapshot, events = split
    model = model_for("graphconv-sum", snapshot)
    engines = {p: Engine.from_pyg(model, snapshot, partitions=p) for p in parts}
    traces = {p: Trace(snapshot, events, weighted=False) for p in parts}
    sg.warm_up(model, partitions=max(parts))  # every kernel compiled (untimed)
    for p in parts:
        for _ in range(10):  # warm caches
            engines[p].apply(traces[p].batch(sizes[0]))
    rows = []
    for size in sizes:
        times = {p: [] for p in parts}
        imbalance = {p: [] for p in parts}
        spent, rounds = time.perf_counter(), 0
        while time.perf_counter() - spent < seconds * len(parts) or rounds < 3:
            for p in parts[rounds % len(parts):] + parts[:rounds % len(parts)]:
                batch = traces[p].batch(size)
                t = time.perf_counter()
                engines[p].apply(batch)
                times[p].append(time.perf_counter() - t)
                busy = np.array([s["busy_s"] for s in engines[p].stats()])  # [P, steps]
                if p > 1:
                    imbalance[p].append(float((busy.max(axis=0) / busy.mean(axis=0)).mean()))
            rounds += 1
        for p in parts:
            rows.append({"partitions": p, "batch": size,
                         "median_ms": float(np.median(times[p])) * 1e3,
                         "updates_per_s": size / float(np.median(times[p])),
                         "max_over_mean_load": (float(np.mean(imbalance[p]))
                                                if imbalance[p] else 1.0),
                         "engine_mb": engine_bytes(engines[p]) / 2**20})
            console.print(rows[-1])
    rows.sort(key=lambda r: (r["partitions"], r["batch"]))
    base = {r["batch"]: r["median_ms"] for r in rows if r["partitions"] == parts[0]}
    table = Table(title="Throughput in one process, GraphConv-sum 2 layers, arxiv-like")
    for col in ("P", "batch", "updates/s", "median ms", f"time / P={parts[0]}",
                "slowest / mean partition", "state MB"):
        table.add_column(col, justify="right")
    for r in rows:
        r["time_over_p1"] = r["median_ms"] / base[r["batch"]]
        table.add_row(str(r["partitions"]), str(r["batch"]), f"{r['updates_per_s']:,.0f}",
                      f"{r['median_ms']:.2f}", f"{r['time_over_p1']:.2f}x",
                      f"{r['max_over_mean_load']:.2f}", f"{r['engine_mb']:.0f}")
    console.print(table)
    return rows


def placement(split, p: int, size: int, updates: int, high_every: int) -> list[dict]:
    """Per placement (METIS with the high in-degree set named once, then refreshed every
    ``high_every`` updates; hash) the cut and what the stream costs."""
    snapshot, events = split
    model = model_for("graphconv-sum", snapshot)
    rows = []
    for strategy, every in (("metis", 0), ("metis", high_every), ("hash", 0)):
        engine = Engine.from_pyg(model, snapshot, partitions=p, placement=strategy)
        engine.directory.high_every = every
        cut0 = cut_edges(engine)
        halo = sum(s["halo"] for s in engine.stats())
        trace = Trace(snapshot, events, weighted=False)
        sent, seconds, created = [], 0.0, 0
        for _ in range(updates // size):
            batch = trace.batch(size)
            t = time.perf_counter()
            engine.apply(batch)
            seconds += time.perf_counter() - t
            sent.append(exchanged_bytes(engine))
            created += cut_adds(engine, batch)
        edges = len(engine.edges()[0])
        rows.append({"placement": strategy, "partitions": p, "high_every": every,
                     "edge_cut": cut0 / len(snapshot.src), "halo": halo,
                     "bytes_per_batch": float(np.mean(sent)), "updates_per_s": updates / seconds,
                     "cut_edges_created_per_10k": created / updates * 1e4,
                     "edges_after": edges})
        console.print(rows[-1])
    table = Table(title=f"Placement, P={p}, GraphConv-sum 2 layers, bs={size}, {updates:,} "
                        "LinkBench updates")
    for col in ("placement", "high set refreshed", "edge cut", "halo vertices", "bytes/batch",
                "updates/s", "cut edges created / 10K updates"):
        table.add_column(col, justify="right")
    for r in rows:
        refreshed = (f"every {r['high_every']:,}" if r["high_every"] else
                     "never" if r["placement"] != "hash" else "-")
        table.add_row(r["placement"], refreshed, f"{r['edge_cut']:.1%}", f"{r['halo']:,}",
                      _kb(r["bytes_per_batch"]), f"{r['updates_per_s']:,.0f}",
                      f"{r['cut_edges_created_per_10k']:,.0f}")
    console.print(table)
    return rows


def ghost_bytes(split, p: int) -> list[dict]:
    """Per model and table, what the shards keep for their ghosts after bootstrap, per
    ghost: a table's rows past its shard's owned vertices (a table of every slot has one
    per ghost), and the features' rows of the ghosts in the shards' graphs; then per
    model the state in all (`engine_bytes`) split and in one partition."""
    snapshot, _ = split
    rows = []
    for name in ("graphconv-sum", "gat", "graphconv-max"):
        engine = Engine.from_pyg(model_for(name, snapshot), snapshot, partitions=p)
        kept: dict[str, int] = {}
        ghosts = 0
        for shard in engine.shards:
            tb, g = shard.tables, shard.graph
            owned = int(tb.owned[:g.num_slots].sum())
            ghosts += g.num_vertices - owned
            for table, rows_of in _per_vertex(tb):
                per_row = rows_of.nbytes // max(len(rows_of), 1)
                kept[table] = kept.get(table, 0) + per_row * max(len(rows_of) - owned, 0)
            kept["features"] = kept.get("features", 0) + (
                g.x[0].nbytes * (g.num_vertices - owned))
        for table, n in kept.items():
            rows.append({"model": name, "partitions": p, "table": table,
                         "bytes_per_ghost": n / ghosts})
        one = Engine.from_pyg(model_for(name, snapshot), snapshot)
        rows.append({"model": name, "partitions": p, "ghosts": ghosts,
                     "engine_mb": engine_bytes(engine) / 2**20,
                     "one_partition_mb": engine_bytes(one) / 2**20})
        tables = [r for r in rows if r["model"] == name and r.get("table", "features")
                  != "features"]
        console.print(name, {r["table"]: round(r["bytes_per_ghost"], 1) for r in tables},
                      "tables:", round(sum(r["bytes_per_ghost"] for r in tables), 1),
                      rows[-1])
    return rows


def _per_vertex(tb) -> list[tuple[str, np.ndarray | torch.Tensor]]:
    """A shard's tables with a row per vertex (or per slot), by name."""
    out = [(f"{name}/{k}", t) for name in ("h", "state", "drift", "ties", "root", "t")
           for k, t in enumerate(getattr(tb, name)) if t is not None]
    return out + [(name, a) for name in ("labels", "in_weight", "ghost", "holders",
                                         "ghost_owner", "row")
                  if (a := getattr(tb, name, None)) is not None]


def cut_edges(engine: Engine) -> int:
    src, dst, _ = engine.edges()
    return int((engine.partition_of(src) != engine.partition_of(dst)).sum())


def cut_adds(engine: Engine, batch) -> int:
    """Edges the batch added (and kept) whose ends different partitions own."""
    adds = batch.op == ADD_EDGE
    src, dst = batch.src[adds], batch.dst[adds]
    live = engine.contains(src) & engine.contains(dst)
    return int((engine.partition_of(src[live]) != engine.partition_of(dst[live])).sum())


def _columns(dicts: list[dict]) -> dict[str, list]:
    return {k: [d[k] for d in dicts] for k in dicts[0]}


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--parts", nargs="+", default=["communication", "placement",
                                                       "throughput"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--updates", type=int, default=10_000, help="placement's stream")
    parser.add_argument("--batch", type=int, default=100, help="placement's batch size")
    parser.add_argument("--high-every", type=int, default=HIGH_EVERY,
                        help="placement: updates between refreshes of the high in-degree set")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/distributed.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()
    split = stream_split(args.preset, weighted=False)
    out: dict = {"preset": args.preset}
    if "communication" in args.parts:
        out["communication"] = communication(split, [10, 100, 1000], [2, 4, 8])
    if "placement" in args.parts:
        out["placement"] = placement(split, 4, args.batch, args.updates, args.high_every)
    if "ghosts" in args.parts:
        out["ghosts"] = ghost_bytes(split, 4)
    if "throughput" in args.parts:
        out["throughput"] = throughput(split, [100, 1000], [1, 2, 4], args.seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
