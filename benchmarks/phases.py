"""Where a batch's time goes: inclusive wall time per step of the engine, by timers wrapped
around its phases and kernels (the engine's code untouched), on arxiv-like LinkBench
batches, one model, P partitions in one process.

    python benchmarks/phases.py [--model graphconv-sum] [--layers 2] [--partitions 1]
                                [--batch-size 100] [--batches 300]

Prints per step the microseconds a batch, the calls a batch and the microseconds a call,
largest first. Timers nest (a superstep's row includes its fold's), so rows do not add
up; each wrapper adds ~1 us a call, and the batch's own time with them is printed on
top. A small step costs several times its cost in a loop here: the step after a kernel
that streams megabytes finds the interpreter's code and data evicted (docs/tuning.md,
twenty-second round), so read these as the steps' costs in place. The batches are made
before the clock starts (the trace's own graph is not timed).
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

import torch
from engine import Trace, model_for, stream_split
from rich.console import Console
from rich.table import Table

from streamgnn.graph import DynamicGraph
from streamgnn.models import aggr
from streamgnn.workers import Engine, Placement, shard

SHARD_STEPS = ("_begin", "_superstep", "_fold", "_finish", "_label_changes", "_incoming",
               "_outgoing", "_rows", "_pull")
KERNELS = ("superstep_region", "linear_step_inputs", "_compared", "activated_rows", "pack",
           "unpack")


def timed(owner, name: str, spent: collections.Counter, calls: collections.Counter) -> None:
    """Replace ``owner.name`` by a wrapper adding its inclusive time to ``spent``."""
    inner = getattr(owner, name)
    label = f"{getattr(owner, '__name__', owner)}.{name}"

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="graphconv-sum")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    snapshot, events = stream_split("arxiv-like", False)
    model = model_for(args.model, snapshot, args.layers)
    engine = Engine.from_pyg(model, snapshot, partitions=args.partitions)
    trace = Trace(snapshot, events, False)
    for _ in range(args.warm_up):
        engine.apply(trace.batch(args.batch_size))
    batches = [trace.batch(args.batch_size) for _ in range(args.batches)]

    spent, calls = collections.Counter(), collections.Counter()
    for name in SHARD_STEPS:
        timed(shard.Shard, name, spent, calls)
    for name in KERNELS:
        timed(shard, name, spent, calls)
    for owner, name in ((Engine, "submit"), (Engine, "collect"), (DynamicGraph, "apply"),
                        (Placement, "route"), (aggr.SumAggregation, "fold"),
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
