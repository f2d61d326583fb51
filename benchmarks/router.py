"""The coordinator's own work per batch, measured alone: `Engine.submit` on an engine
whose workers do nothing, so that what is timed is deciding the batch's vertex questions
in the vertex directory (`Directory.decide`), cutting it into the partitions' shares
(`placement.shares`) and the rest of `submit` around them. The coordinator holds no
graph: the edges' questions are the partitions' (docs/architecture.md "Partitions and MPI
ranks").

    python benchmarks/router.py [--preset arxiv-like] [--partitions 1 2 4 8 16]
                                [--batch-size 1000] [--batches 200] [--warm-up 10]
    python benchmarks/router.py --digest [--batches 300] [--partitions 1 2 4 16]

For each P: the graph is loaded from the arxiv-like 80 % snapshot and placed by METIS as
`Engine.from_pyg` does (GraphConv sum, 2 layers: the model only has to be decomposed), with
workers elsewhere (as under MPI: P = 1 is one worker); the LinkBench batches (adds replay
the held-out 20 %) are made first, on a graph of their own, and the same batches go to
every P in order, so each is valid where it is applied. Per batch, the thread's CPU time in
`Directory.decide` (a), `shares` (b) and the rest of `submit` (c: submit less a and b; the
workers' `submit` is a stub that returns at once) is timed, CPU time so that other
processes on a shared machine inflate it less, and `submit`'s wall time beside it; printed
in microseconds per update, median and p90 over the batches, with the ratio of a + b + c
to the goal of 1 us per update. Freed memory is kept for reuse, as `serve` does
(`keep_freed_memory`). Writes benchmarks/results/router.json.

``--digest`` instead prints, per P, a SHA-256 over every batch's rejections (the
directory's) and the partitions' shares (`Routed`): two runs that print the same digests
split the same batches the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from engine import Trace, model_for, stream_split
from rich.console import Console
from rich.table import Table

from streamgnn.allocator import keep_freed_memory
from streamgnn.graph import DynamicGraph
from streamgnn.graph.directory import Directory
from streamgnn.updates import UpdateBatch
from streamgnn.workers import Engine
from streamgnn.workers import engine as engine_module
from streamgnn.workers.placement import Routed

GOAL_US = 1.0  # per update


class Idle:
    """Workers that take a batch and do nothing: the coordinator's side of `submit`
    alone. Keeps the last shares it was given; names the high in-degree set as the
    partitions would, from the graph it was placed from."""

    max_in_flight = 1

    def __init__(self, size: int, graph: DynamicGraph) -> None:
        self.size = size
        self.given: list[Routed] = []
        n = graph.num_slots
        self._ids, self._in_degree = graph.ext[:n][graph.alive[:n]], graph.in_degree[:n][
            graph.alive[:n]]

    def high_in_degree(self, factor: float) -> Callable[[], np.ndarray]:
        high = self._ids[self._in_degree > factor * self._in_degree.mean()]
        return lambda: high

    def bootstrap(self, cut, recompute: bool) -> None:
        pass

    def submit(self, routed: list[Routed]) -> Callable[[], list]:
        self.given = routed
        return list


def coordinator(model, snapshot, partitions: int) -> tuple[Engine, Idle]:
    """An engine over ``snapshot`` in ``partitions`` (placed as `Engine.from_pyg` places
    them) whose workers are `Idle`."""
    graph = DynamicGraph.from_data(snapshot)
    idle = Idle(partitions, graph)
    engine = Engine(model, graph, partitions=partitions, workers=idle)
    return engine, idle


class Clock:
    """Wraps ``owner.name`` to add each call's seconds of this thread's CPU time to
    ``spent``."""

    def __init__(self, owner, name: str) -> None:
        self.spent = 0.0
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent += time.thread_time() - start

        self.owner, self.name, self.inner = owner, name, inner
        setattr(owner, name, timed)

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent

    def remove(self) -> None:
        setattr(self.owner, self.name, self.inner)


def run(model, snapshot, batches: list[UpdateBatch], partitions: int, warm_up: int
        ) -> dict[str, list[float]]:
    """Per batch after ``warm_up``: CPU seconds in `Directory.decide`, `shares` and the
    rest of `submit`, and `submit`'s wall seconds."""
    engine, _ = coordinator(model, snapshot, partitions)
    decide, share = Clock(Directory, "decide"), Clock(engine_module, "shares")
    out: dict[str, list[float]] = {"decide": [], "shares": [], "rest": [], "wall": []}
    try:
        for k, batch in enumerate(batches):
            decide.take(), share.take()
            start, cpu = time.perf_counter(), time.thread_time()
            engine.submit(batch, skip_invalid=True)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - start
            engine._in_flight.clear()
            a, b = decide.take(), share.take()
            if k >= warm_up:
                out["decide"].append(a)
                out["shares"].append(b)
                out["rest"].append(cpu - a - b)
                out["wall"].append(wall)
    finally:
        decide.remove()
        share.remove()
    return out


def _arrays(value) -> list[np.ndarray]:
    """The arrays of a diff or a routed part, in field order."""
    fields = value.__dict__.values()
    out = []
    for f in fields:
        if isinstance(f, np.ndarray):
            out.append(f)
        elif hasattr(f, "__dict__"):
            out.extend(_arrays(f))
    return out


def digest(model, snapshot, batches: list[UpdateBatch], partitions: int) -> str:
    """SHA-256 over each batch's rejections and shares."""
    engine, idle = coordinator(model, snapshot, partitions)
    h = hashlib.sha256()
    for batch in batches:
        engine.submit(batch, skip_invalid=True)
        flight = engine._in_flight.pop()
        h.update(repr([(type(e).__name__, str(e)) for e in flight.rejected]).encode())
        for part in idle.given:
            for a in _arrays(part):
                h.update(f"{a.dtype}{a.shape}".encode())
                h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--digest", action="store_true",
                        help="print a hash of every batch's rejections and shares per P")
    parser.add_argument("--out", default="benchmarks/results/router.json")
    args = parser.parse_args()
    keep_freed_memory()  # as `serve` does
    console = Console(width=140)
    snapshot, events = stream_split(args.preset, weighted=False)
    model = model_for("graphconv-sum", snapshot)
    trace = Trace(snapshot, events, weighted=False)
    count = args.batches + (0 if args.digest else args.warm_up)
    batches = [trace.batch(args.batch_size) for _ in range(count)]
    if args.digest:
        for p in args.partitions:
            console.print(f"P={p}: {digest(model, snapshot, batches, p)}")
        return
    rows = []
    for p in args.partitions:
        per = {k: np.array(v) / args.batch_size * 1e6
               for k, v in run(model, snapshot, batches, p, args.warm_up).items()}
        per["total"] = per["decide"] + per["shares"] + per["rest"]
        rows.append({"partitions": p, **{f"{k}_us": {"median": float(np.median(v)),
                                                     "p90": float(np.percentile(v, 90))}
                                         for k, v in per.items()}})
        console.print(rows[-1])
    table = Table(title=f"{args.preset}, bs={args.batch_size}, {args.batches} batches: the "
                        "coordinator's work per update, us of CPU time (median / p90), and "
                        "submit's wall time")
    for col in ("P", "Directory.decide", "shares", "rest of submit", "total", "total / goal",
                "wall"):
        table.add_column(col, justify="right")
    for r in rows:
        cells = [f"{r[k]['median']:.3f} / {r[k]['p90']:.3f}"
                 for k in ("decide_us", "shares_us", "rest_us", "total_us")]
        table.add_row(str(r["partitions"]), *cells,
                      f"{r['total_us']['median'] / GOAL_US:.2f}x",
                      f"{r['wall_us']['median']:.3f} / {r['wall_us']['p90']:.3f}")
    console.print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "preset": args.preset, "batch_size": args.batch_size, "batches": args.batches,
        "goal_us_per_update": GOAL_US, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
