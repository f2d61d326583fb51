"""The sum superstep's fold as numba, torch and torch.compile, measured against each other.

The fold (`rowops.fold_rows_`) is the one kernel of a sum layer's superstep: the messages
``coef * t[rows]`` summed per destination in float64, added to the stored states, the
rounding bounds grown, the finalized rows read back. The engine runs it as a numba loop
on CPU and as its torch twin (a chain of ~15 torch ops) elsewhere. This benchmark puts a
third beside them, the torch twin compiled by ``torch.compile`` (inductor: C++ on CPU,
Triton on cuda), and measures all three on the same LinkBench batches of an arxiv-like
GraphConv-sum engine, 2 layers, hidden 128:

- per call: each kernel on the folds the engine made (recorded, then replayed, each
  kernel on fresh copies of the tables as the engine left them), median microseconds;
- in the engine: one engine per kernel, the same batches applied in turn in blocks of
  10 (the order rotating), median ms a batch; the engines' embeddings compared at the
  end.

Ratios are to the kernel the engine runs there (numba on cpu, torch on cuda).

    python benchmarks/kernels.py                 # cpu: numba, torch, compiled
    python benchmarks/kernels.py --device cuda   # cuda: torch, compiled
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from engine import Trace, model_for, stream_split
from rich.console import Console
from rich.table import Table

from streamgnn.models import aggr, rowops
from streamgnn.workers import Engine

BLOCK = 10


_EAGER = rowops.fold_rows_tensors
_COMPILED = torch.compile(_EAGER, dynamic=True)


def fold_rows_compiled(*args):
    """`rowops.fold_rows_torch` with its `rowops.fold_rows_tensors` compiled."""
    rowops.fold_rows_tensors = _COMPILED
    try:
        return rowops.fold_rows_torch(*args)
    finally:
        rowops.fold_rows_tensors = _EAGER


KERNELS = {"numba": rowops.fold_rows_numba, "torch": rowops.fold_rows_torch,
           "compiled": fold_rows_compiled}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call(engines: dict[str, Engine], trace: Trace, size: int, batches: int,
             repeats: int) -> dict[str, float]:
    """Median us a call of each kernel over the folds of ``batches`` batches, recorded
    from the first engine running its own kernel (the others apply them too, to stay in
    step with the trace)."""
    kernels, base = list(engines), next(iter(engines.values()))
    calls = []
    own = aggr.fold_rows_

    def record(state, drift, *args):
        calls.append((state, drift, *args))
        return own(state, drift, *args)

    aggr.fold_rows_ = record
    try:
        for _ in range(batches):
            batch = trace.batch(size)
            base.apply(batch)
            aggr.fold_rows_, recording = own, aggr.fold_rows_
            for engine in list(engines.values())[1:]:
                engine.apply(batch)
            aggr.fold_rows_ = recording
    finally:
        aggr.fold_rows_ = own
    medians = {}
    for name in kernels:  # each on fresh copies of the tables as the engine left them
        kernel, times, copies = KERNELS[name], [], {}
        for _ in range(repeats):
            for state, drift, *args in calls:
                key = (state.data_ptr(), drift.data_ptr())
                if key not in copies:
                    copies[key] = (state.clone(), drift.clone())
                _sync(state.device)
                start = time.perf_counter()
                kernel(*copies[key], *args)
                _sync(state.device)
                times.append(time.perf_counter() - start)
        medians[name] = float(np.median(times) * 1e6)
    return medians


def in_engine(engines: dict[str, Engine], trace: Trace, size: int, batches: int
              ) -> dict[str, float]:
    """Median ms a batch of each engine, each folding with its own kernel, on the same
    batches (blocks of `BLOCK` in turn, the order rotating from block to block)."""
    times = {name: [] for name in engines}
    own = aggr.fold_rows_
    order = list(engines)
    try:
        for k in range(max(1, batches // BLOCK)):
            block = [trace.batch(size) for _ in range(BLOCK)]
            for name in order[k % len(order):] + order[:k % len(order)]:
                engine = engines[name]
                aggr.fold_rows_ = KERNELS[name]
                for batch in block:
                    start = time.perf_counter()
                    engine.apply(batch)
                    _sync(engine.device)
                    times[name].append(time.perf_counter() - start)
    finally:
        aggr.fold_rows_ = own
    return {name: float(np.median(t) * 1e3) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 100, 1000])
    parser.add_argument("--batches", type=int, default=60,
                        help="batches per size (per call: their folds; in the engine: each)")
    parser.add_argument("--repeats", type=int, default=3, help="replays of the folds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default="benchmarks/results/kernels.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kernels = ["numba", "torch", "compiled"] if device.type == "cpu" else ["torch",
                                                                            "compiled"]
    base = kernels[0]
    snapshot, events = stream_split(args.preset, weighted=False)
    model = model_for("graphconv-sum", snapshot)
    engines = {name: Engine.from_pyg(model, snapshot, args.device) for name in kernels}
    trace = Trace(snapshot, events, weighted=False)
    warm = [trace.batch(size) for size in args.batch_sizes for _ in range(BLOCK)]
    for name, engine in engines.items():  # numba's JIT, inductor's compiles, untimed
        aggr.fold_rows_ = KERNELS[name]
        for batch in warm:
            engine.apply(batch)
    aggr.fold_rows_ = rowops.fold_rows_
    rows = []
    for size in args.batch_sizes:
        calls = per_call(engines, trace, size, args.batches, args.repeats)
        batches = in_engine(engines, trace, size, args.batches)
        rows.append({"batch": size, "us_a_call": calls, "ms_a_batch": batches})
    ids = engines[base].vertex_ids()
    reference = engines[base].lookup(ids)
    differ = {name: float(np.abs(engine.lookup(ids) - reference).max())
              for name, engine in engines.items()}

    table = Table(title=f"sum fold kernels, GraphConv sum 2L, {args.preset}, {device.type} "
                        f"({args.threads} threads); ratios: time / {base}'s")
    table.add_column("batch", justify="right")
    for name in kernels:
        table.add_column(f"{name} us a call", justify="right")
    for name in kernels:
        table.add_column(f"{name} ms a batch", justify="right")
    for row in rows:
        cells = [f"{row['batch']:,}"]
        for key in ("us_a_call", "ms_a_batch"):
            for name in kernels:
                value, ratio = row[key][name], row[key][name] / row[key][base]
                cells.append(f"{value:,.1f}" + ("" if name == base else f" ({ratio:.2f}x)"))
        table.add_row(*cells)
    console = Console()
    console.print(table)
    largest = float(np.abs(reference).max())
    console.print(f"max |embedding - {base}'s| after the run (embeddings up to {largest:,.1f}"
                  "): " + ", ".join(f"{name} {d:.1e}" for name, d in differ.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                               "threads": args.threads, "rows": rows,
                               "max_abs_difference": differ,
                               "max_abs_embedding": largest}, indent=2))
    console.print(f"-> {out}")


if __name__ == "__main__":
    main()
