"""Where a batch's time goes: inclusive wall time per step of the engine, by timers wrapped
around its phases and kernels (the engine's code untouched), on arxiv-like LinkBench
batches, one model, P partitions in one process.

    python benchmarks/phases.py [--model graphconv-sum] [--layers 2] [--partitions 1]
                                [--batch-size 100] [--batches 300]
    python benchmarks/phases.py --floor [--batch-size 100]
    python benchmarks/phases.py --shards --partitions 16 --batch-size 1000 [--threads 1]

Prints per step the microseconds a batch, the calls a batch and the microseconds a call,
largest first. Timers nest (a superstep's row includes its fold's), so rows do not add
up; each wrapper adds ~1 us a call, and the batch's own time with them is printed on
top. A small step costs several times its cost in a loop here: the step after a kernel
that streams megabytes finds the interpreter's code and data evicted (docs/tuning.md,
twenty-second round), so read these as the steps' costs in place. The batches are made
before the clock starts (the trace's own graph is not timed).

``--floor`` instead times only the compiled work: every numba kernel the engine calls from
Python and torch's matrix products, with RC (`recompute=True`) run on the same batches in
alternating blocks of 10, as `benchmarks/engine.py` does. The engine's time with no
Python at all would be that work's: RC's time over it bounds the ratio engine/RC any
removal of Python overhead can reach. Torch calls other than `torch.mm` (`F.linear` in
max and attention layers, index and elementwise ops) count as the rest: the compiled work
is a lower bound, the bound on the ratio an upper one.

``--shards`` instead reads each shard's compute per step (`Engine.stats`, ``busy_s``) against
its work (the rows it recomputed at each layer), in wall time and, in alternate batches, in
this thread's CPU time (which other processes on the machine do not inflate): per step the
median and the slowest shard over the partitions (medians over batches), and a
least-squares fit of a shard's step = fixed + per row x its region's rows at that layer.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
import types
from collections.abc import Callable, Sequence

import numba
import numpy as np
import torch
from engine import Trace, model_for, stream_split
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn import cores
from streamgnn.graph import DynamicGraph
from streamgnn.graph.directory import Directory
from streamgnn.models import aggr
from streamgnn.workers import Engine, fold, ghost_rows, shard, superstep, tables

# a batch's steps and kernels, each timed where its callers look it up
STEPS = ((shard.Shard, ("_begin", "_finish", "_label_changes")),
         (shard, ("superstep", "incoming", "outgoing")),
         (tables.Tables, ("h_rows",)),
         (superstep, ("fold", "pull", "superstep_region", "_compared", "activated_rows")),
         (fold, ("linear_step_inputs",)),
         (ghost_rows, ("pack", "unpack")))


def stopwatch(inner, label: str, spent: collections.Counter, calls: collections.Counter,
              on: Sequence[bool] = (True,)) -> Callable:
    """``inner`` wrapped to add its inclusive time and a call to ``spent`` and ``calls``
    under ``label`` while ``on[0]``."""

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        if not on[0]:
            return inner(*args, **kwargs)
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            calls[label] += 1

    return wrapper


def timed(owner, name: str, spent: collections.Counter, calls: collections.Counter) -> None:
    """Replace ``owner.name`` by a wrapper adding its inclusive time to ``spent``."""
    label = f"{getattr(owner, '__name__', owner)}.{name}"
    setattr(owner, name, stopwatch(getattr(owner, name), label, spent, calls))


def compiled_timed(spent: collections.Counter, on: list[bool]) -> None:
    """Wrap every numba kernel bound in a streamgnn module (each module's own name for it)
    and `torch.mm` with a timer adding to ``spent`` while ``on[0]``. Only calls from
    Python pass through the wrappers; kernels calling kernels are timed with their caller.
    Every kernel must be compiled already (`sg.warm_up`): one compiled later would find a
    wrapper where it expects a kernel."""
    wrappers, calls = {}, collections.Counter()
    for name, module in list(sys.modules.items()):
        if not name.startswith("streamgnn"):
            continue
        for key, value in list(vars(module).items()):
            if isinstance(value, cores.RowLoop | numba.core.dispatcher.Dispatcher):
                fn = value.fn if isinstance(value, cores.RowLoop) else value.py_func
                if id(value) not in wrappers:
                    wrappers[id(value)] = stopwatch(value, f"{fn.__module__}.{fn.__qualname__}",
                                                    spent, calls, on)
                setattr(module, key, wrappers[id(value)])
    torch.mm = stopwatch(torch.mm, "torch.mm", spent, calls, on)


def floor(args: argparse.Namespace) -> None:
    """`--floor`: the engine's compiled work against its batch and RC's."""
    snapshot, events = stream_split("arxiv-like", False)
    model = model_for(args.model, snapshot, args.layers)
    engine = Engine.from_pyg(model, snapshot, partitions=args.partitions)
    rc = Engine.from_pyg(model, snapshot, partitions=args.partitions, recompute=True)
    for recompute in (False, True):
        sg.warm_up(model, partitions=args.partitions, recompute=recompute)
    trace = Trace(snapshot, events, False)
    for _ in range(args.warm_up):
        batch = trace.batch(args.batch_size)
        engine.apply(batch)
        rc.apply(batch)
    spent, on = collections.Counter(), [False]
    compiled_timed(spent, on)
    times = {"engine": [], "rc": []}
    for _ in range(max(1, args.batches // 10)):
        block = [trace.batch(args.batch_size) for _ in range(10)]
        for key, target in (("engine", engine), ("rc", rc)):
            on[0] = key == "engine"
            for batch in block:
                start = time.perf_counter()
                target.apply(batch)
                times[key].append(time.perf_counter() - start)
    on[0] = False
    n = len(times["engine"])
    batch_ms, rc_ms = (float(np.mean(times[k])) * 1e3 for k in ("engine", "rc"))
    compiled_ms = sum(spent.values()) / n * 1e3
    table = Table(title=f"{args.model}, {args.layers} layers, P={args.partitions}, "
                        f"bs={args.batch_size}, {n} batches: engine {batch_ms:.3f} ms a "
                        f"batch (mean), RC {rc_ms:.3f} ms, engine/RC {rc_ms / batch_ms:.2f}x; "
                        f"compiled work {compiled_ms:.3f} ms "
                        f"({100 * compiled_ms / batch_ms:.0f} % of the batch): RC / compiled "
                        f"{rc_ms / compiled_ms:.2f}x")
    for column in ("compiled step", "ms a batch", "share of the batch"):
        table.add_column(column, justify="left" if column == "compiled step" else "right")
    for label, seconds in spent.most_common():
        ms = seconds / n * 1e3
        table.add_row(label.removeprefix("streamgnn."), f"{ms:.3f}",
                      f"{100 * ms / batch_ms:.1f} %")
    Console(width=140).print(table)


def shards(args: argparse.Namespace) -> None:
    """`--shards`: each shard's compute per step against the rows it recomputed."""
    snapshot, events = stream_split("arxiv-like", False)
    model = model_for(args.model, snapshot, args.layers)
    engine = Engine.from_pyg(model, snapshot, partitions=args.partitions)
    sg.warm_up(model, partitions=args.partitions)
    trace = Trace(snapshot, events, False)
    for _ in range(args.warm_up):
        engine.apply(trace.batch(args.batch_size))
    rows: list[list[list[int]]] = []
    run = shard.Shard.run

    def counted(self, diff, me=0, partitions=1, routed=None):
        result = yield from run(self, diff, me, partitions, routed)
        rows[-1][me] = list(result.recomputed)
        return result

    shard.Shard.run = counted
    busy: dict[str, list] = {"wall": [], "cpu": []}
    for k in range(args.batches):  # wall and CPU time in alternate batches
        cpu = k % 2 == 1
        shard.time = types.SimpleNamespace(perf_counter=time.thread_time) if cpu else time
        rows.append([[] for _ in range(args.partitions)])
        engine.apply(trace.batch(args.batch_size))
        busy["cpu" if cpu else "wall"].append([s["busy_s"] for s in engine.stats()])
    shard.time, shard.Shard.run = time, run
    table = Table(title=f"{args.model}, {args.layers} layers, P={args.partitions}, "
                        f"bs={args.batch_size}, {args.batches} batches: a shard's compute "
                        "per step (medians over batches)")
    for column in ("step", "clock", "median shard ms", "slowest shard ms", "fit: fixed ms",
                   "fit: us per region row", "median region rows"):
        table.add_column(column, justify="left" if column in ("step", "clock") else "right")
    for kind, seconds in busy.items():
        spent = np.array(seconds)  # [batch, shard, step]
        region = np.array(rows[1 if kind == "cpu" else 0::2])  # [batch, shard, layer]
        for step in range(spent.shape[2]):
            x = region[:, :, min(step, region.shape[2] - 1)].ravel().astype(float)
            y = spent[:, :, step].ravel()
            per_row, fixed = np.polyfit(x, y, 1)
            table.add_row(str(step), kind,
                          f"{np.median(np.median(spent[:, :, step], axis=1)) * 1e3:.3f}",
                          f"{np.median(spent[:, :, step].max(axis=1)) * 1e3:.3f}",
                          f"{fixed * 1e3:.3f}", f"{per_row * 1e6:.2f}", f"{np.median(x):.0f}")
    Console(width=140).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="graphconv-sum")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=30)
    parser.add_argument("--floor", action="store_true",
                        help="time the compiled work alone, against the batch and RC's")
    parser.add_argument("--shards", action="store_true",
                        help="each shard's compute per step against its region's rows")
    parser.add_argument("--threads", type=int, default=2, help="torch's thread count")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.floor:
        floor(args)
        return
    if args.shards:
        shards(args)
        return
    snapshot, events = stream_split("arxiv-like", False)
    model = model_for(args.model, snapshot, args.layers)
    engine = Engine.from_pyg(model, snapshot, partitions=args.partitions)
    trace = Trace(snapshot, events, False)
    for _ in range(args.warm_up):
        engine.apply(trace.batch(args.batch_size))
    batches = [trace.batch(args.batch_size) for _ in range(args.batches)]

    spent, calls = collections.Counter(), collections.Counter()
    for owner, names in STEPS:
        for name in names:
            timed(owner, name, spent, calls)
    for owner, name in ((Engine, "submit"), (Engine, "collect"), (DynamicGraph, "apply"),
                        (Directory, "decide"), (aggr.SumAggregation, "fold"),
                        (type(engine.layers[0]), "rel_root")):
        timed(owner, name, spent, calls)
    start = time.perf_counter()
    for batch in batches:
        engine.apply(batch)
    per_batch = (time.perf_counter() - start) / len(batches)

    table = Table(title=f"{args.model}, {args.layers} layers, P={args.partitions}, "
                        f"bs={args.batch_size}: {per_batch * 1e6:,.0f} us a batch with the "
                        f"timers ({len(batches)} batches)")
    for column in ("step", "us a batch", "calls a batch", "us a call"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for label, seconds in spent.most_common():
        table.add_row(label, f"{seconds / len(batches) * 1e6:,.1f}",
                      f"{calls[label] / len(batches):.2f}",
                      f"{seconds / calls[label] * 1e6:,.1f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
