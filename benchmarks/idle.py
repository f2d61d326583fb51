"""Per-rank fixed cost (issue 52): what a shard that a batch does not touch costs per
superstep, beside a shard the batch keeps busy, in one process and under MPI.

    python benchmarks/idle.py [--partitions 2] [--batches 200] [--batch-size 5]
    python benchmarks/idle.py --profile    # also: where the idle shard's time goes
    python benchmarks/idle.py --no-mpi     # one process only

GraphConv-sum, 2 layers (``--layers``), arxiv-like, METIS placement. The batches add
``--batch-size`` edges into partition 0 and then delete them again (the graph comes back
after each pair): each edge ends at a vertex whose out-neighbourhood up to L-1 hops lies in
partition 0 and is held by no other partition as a ghost, so the batch stays inside
partition 0 for L supersteps and every other shard is idle through it. "All" batches
do the same in every partition at once.

- In one process (``Engine(partitions=P)``): each shard's generator steps (`Shard.run`,
  which the engine drives in lock step) are timed one by one, by a wrapper around
  ``next``/``send``. Baseline: the same wrapper around a generator that does nothing.
  Also an idle shard's batch driven alone, batch after batch: its cost with its caches
  warm, where in lock step it runs after a busy shard's kernels have evicted them.
  ``--profile``: cProfile over the idle shard in a pass of its own (the timed pass is
  not profiled).
- Under ``mpiexec -n P+1`` (``MPIR_CVAR_ENABLE_HEAVY_YIELD=1``; the ``MPIEXEC`` env var
  names the mpiexec, else the one beside Python's executable): each worker's own clock
  per batch (wall and CPU time): the time it spends on the batch's command outside the
  ghost-row exchanges (`mpi.alltoallv` and its `Arrivals`' waits, where a worker waits
  for the others: reported too, "in the exchanges"), with the command's decoding and its
  reply's encoding; its superstep code alone (`Shard.summary`'s ``busy_s``, which leaves
  out the waits for buffers inside it, `mpi.Arrivals.waited`) and the rest (own clock
  less superstep code: the command's decoding, the reply's encoding, driving the
  program); and rank 0's wall time per batch, batches of one partition against batches
  of all.

Per-superstep figures are a batch's over L. Batches of both kinds alternate in blocks of
10; figures are medians with the 10th and 90th percentiles. Writes
benchmarks/results/idle.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from datetime import date
from pathlib import Path

import numpy as np
import torch
from engine import machine, model_for, stream_split
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.updates import ADD_EDGE, DELETE_EDGE, NO_X
from streamgnn.workers import Engine
from streamgnn.workers.placement import Routed

console = Console(width=140)
BLOCK = 10  # batches of one kind in a row


# ---------------------------------------------------------------- the batches
def owners(engine: Engine, g: sg.DynamicGraph) -> np.ndarray:
    """The partition owning each slot of ``g`` (-1: free)."""
    part = np.full(g.num_slots, -1)
    part[g.vertex_slots()] = engine.partition_of(g.vertex_ids())
    return part


def quiet_targets(engine: Engine, g: sg.DynamicGraph, q: int) -> np.ndarray:
    """Slots of ``g`` (the graph ``engine`` bootstrapped from, as it was then) in partition
    ``q`` whose out-neighbourhood up to L-1 hops is owned by ``q`` and held by no other
    partition: an edge into one stays in ``q`` for L supersteps."""
    n = g.num_slots
    part = owners(engine, g)
    src, dst, _ = g.edge_slots()
    ok = g.alive[:n] & (part == q)
    ok[src[part[src] != part[dst]]] = False  # held as a ghost elsewhere
    for _ in range(engine.num_layers - 1):
        reaches_out = np.zeros(n, bool)
        reaches_out[src[~ok[dst]]] = True
        ok &= ~reaches_out
    return np.flatnonzero(ok)


def local_batches(engine: Engine, g: sg.DynamicGraph, parts: list[int], size: int,
                  pairs: int, rng: np.random.Generator) -> list[sg.UpdateBatch]:
    """``pairs`` pairs of batches: ``size`` new edges into each of ``parts`` (from a vertex
    of the same partition to one of its `quiet_targets`), then the same edges deleted."""
    part = owners(engine, g)
    live = g.vertex_slots()
    pools = {q: (live[part[live] == q], quiet_targets(engine, g, q)) for q in parts}
    out = []
    for _ in range(pairs):
        src, dst = [], []
        for q in parts:
            owned, targets = pools[q]
            u, v = rng.choice(owned, 4 * size), rng.choice(targets, 4 * size)
            new = (u != v) & ~g.has_edges(u, v)
            _, first = np.unique(u[new] << 32 | v[new], return_index=True)
            pick = np.flatnonzero(new)[np.sort(first)][:size]
            src.append(g.ext[u[pick]])
            dst.append(g.ext[v[pick]])
        a, b = np.concatenate(src), np.concatenate(dst)
        for op in (ADD_EDGE, DELETE_EDGE):
            out.append(sg.UpdateBatch(np.full(len(a), op), a, b, np.ones(len(a)),
                                      np.full(len(a), NO_X), np.zeros((0, g.num_features))))
    return out


def blocks(engine: Engine, snapshot: sg.GraphData, size: int, count: int, seed: int
           ) -> list[tuple[str, sg.UpdateBatch]]:
    """``count`` batches or more for ``engine`` just bootstrapped from ``snapshot``, "one"
    (partition 0's) and "all" (every partition's) in alternating blocks of `BLOCK`."""
    rng, g = np.random.default_rng(seed), sg.DynamicGraph.from_data(snapshot)
    every = list(range(engine.num_partitions))
    out = []
    while len(out) < count:
        for kind, parts in (("one", [0]), ("all", every)):
            out += [(kind, b) for b in local_batches(engine, g, parts, size, BLOCK // 2,
                                                     rng)]
    return out


def spread(seconds: list[float], per: int = 1) -> dict:
    """Median and 10th / 90th percentiles, in microseconds, of ``seconds`` / ``per``."""
    us = np.asarray(seconds) / per * 1e6
    return {"median_us": float(np.median(us)), "p10_us": float(np.percentile(us, 10)),
            "p90_us": float(np.percentile(us, 90)), "n": len(us)}


def show(s: dict) -> str:
    return f"{s['median_us']:,.1f} ({s['p10_us']:,.0f}-{s['p90_us']:,.0f})"


# ---------------------------------------------------------------- in one process
class TimedSteps:
    """A BSP program (a generator) whose steps each add their seconds to ``steps``; what
    `lockstep` drives, in place of the program."""

    def __init__(self, program: Generator, steps: list[float],
                 around: Callable[[], object] | None = None) -> None:
        self.program, self.steps, self.around = program, steps, around

    def __iter__(self) -> TimedSteps:
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        profile = self.around() if self.around else None
        if profile is not None:
            profile.enable()
        start = time.perf_counter()
        try:
            return next(self.program) if value is None else self.program.send(value)
        finally:
            self.steps.append(time.perf_counter() - start)
            if profile is not None:
                profile.disable()


def time_steps(shard, steps: list[float], around: Callable[[], object] | None) -> None:
    """From now on the programs of ``shard``'s batches are `TimedSteps` adding to
    ``steps``."""
    run = shard.run_routed
    shard.run_routed = lambda *args: TimedSteps(run(*args), steps, around)


def nothing_program(steps: int) -> Generator[list, list, None]:
    """A BSP program that does nothing for ``steps`` steps: the baseline."""
    for _ in range(steps - 1):
        yield [np.zeros(0, np.uint8)]  # (to itself)


def in_process(args: argparse.Namespace, model: torch.nn.Module, snapshot) -> dict:
    """Per shard and batch, its steps' seconds; the idle shards' against the busy one's
    and a program doing nothing; an idle shard's steps with no other shard between them
    (its caches warm); with ``--profile``, the idle shard's functions in a pass of its
    own."""
    engine = Engine.from_pyg(model, snapshot, partitions=args.partitions)
    profile = cProfile.Profile() if args.profile else None
    steps: list[list[float]] = [[] for _ in engine.shards]
    profiling = [False]
    for p, shard in enumerate(engine.shards):
        time_steps(shard, steps[p], (lambda: profile if profiling[0] else None) if p == 1
                   else None)
    batches = blocks(engine, snapshot, args.batch_size, args.batches, seed=0)
    for _, batch in batches[:2 * BLOCK]:  # warm
        engine.apply(batch)
    per_batch = {kind: [[] for _ in engine.shards] for kind in ("one", "all")}
    walls = {"one": [], "all": []}
    for kind, batch in batches:
        for s in steps:
            s.clear()
        start = time.perf_counter()
        engine.apply(batch)
        walls[kind].append(time.perf_counter() - start)
        for p, s in enumerate(steps):
            per_batch[kind][p].append(sum(s))
    alone = []
    for _ in range(len(batches)):
        steps[1].clear()
        drive(engine.shards[1].run_routed(nothing_routed(engine.num_features), 1,
                                          args.partitions), args.partitions)
        alone.append(sum(steps[1]))
    nothing: list[float] = []
    for _ in range(len(batches)):
        drive(TimedSteps(nothing_program(len(steps[0])), nothing), 1)
    L = engine.num_layers
    idle = [t for p in range(1, args.partitions) for t in per_batch["one"][p]]
    out = {"partitions": args.partitions, "layers": L, "steps_per_batch": len(steps[0]),
           "idle_per_superstep": spread(idle, L),
           "idle_alone_per_superstep": spread(alone, L),
           "busy_per_superstep": spread(per_batch["one"][0], L),
           "all_busy_per_superstep": spread(per_batch["all"][0], L),
           "nothing_per_step": spread(nothing),
           "wall_one": spread(walls["one"]), "wall_all": spread(walls["all"])}
    if profile is not None:
        profiling[0] = True
        ones = [batch for kind, batch in batches if kind == "one"]  # (pairs: add, delete)
        for batch in ones:
            engine.apply(batch)
        profiling[0] = False
        out["profile"] = top_functions(profile, len(ones))
    return out


def nothing_routed(num_features: int) -> Routed:
    """A partition's part of a batch that does not touch it."""
    none = np.zeros(0, np.int64)
    return Routed(sg.UpdateBatch(none, none, none, none, none, np.zeros((0, num_features))),
                  none, none, none, none, none, none)


def drive(program: Generator | TimedSteps, partitions: int) -> None:
    """Run a BSP program alone, sending it empty buffers from every partition."""
    received = [np.zeros(0, np.uint8)] * partitions
    try:
        next(program)
        while True:
            program.send(received)
    except StopIteration:
        pass


def top_functions(profile: cProfile.Profile, batches: int, n: int = 25) -> list[dict]:
    """The ``n`` functions with the most own time, per batch of the one idle shard
    profiled."""
    stats = pstats.Stats(profile).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"function": f"{Path(file).name}:{line} {name}", "calls": calls / batches,
             "own_us": own / batches * 1e6, "inclusive_us": inclusive / batches * 1e6}
            for (file, line, name), (_, calls, own, inclusive, _) in rows]


# ---------------------------------------------------------------- under mpiexec
def instrument_worker(log: list[dict]) -> None:
    """On a worker rank: per APPLY command, its seconds in all (`mpi._execute`: the
    command's decoding and the reply's encoding included), in the exchanges, and in the
    shard's superstep code, appended to ``log``; `Shard.summary` hands ``log`` to rank
    0."""
    from streamgnn.workers import mpi, shard

    clock = {"exchange": 0.0, "exchange_cpu": 0.0}
    execute, summary = mpi._execute, shard.Shard.summary

    def timed(function: Callable) -> Callable:
        def exchange(*args):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args)
            finally:
                clock["exchange"] += time.perf_counter() - start
                clock["exchange_cpu"] += time.thread_time() - cpu
        return exchange

    def timed_execute(command, message, worker_shard, *rest):
        if command != mpi.APPLY:
            return execute(command, message, worker_shard, *rest)
        clock.update(dict.fromkeys(clock, 0.0))
        start, cpu = time.perf_counter(), time.thread_time()
        reply = execute(command, message, worker_shard, *rest)
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
        busy = sum(worker_shard.busy)
        log.append({"own_s": wall - clock["exchange"], "exchange_s": clock["exchange"],
                    "own_cpu_s": cpu - clock["exchange_cpu"], "busy_s": busy,
                    "rest_s": wall - clock["exchange"] - busy})
        return reply

    mpi.alltoallv, mpi._execute = timed(mpi.alltoallv), timed_execute
    mpi.Arrivals._complete_one = timed(mpi.Arrivals._complete_one)
    mpi.Arrivals.finish = timed(mpi.Arrivals.finish)
    shard.Shard.summary = lambda self: {**summary(self), "applies": log}


def rank_job(args: argparse.Namespace) -> None:
    """Under mpiexec: rank 0 drives the workers through the batches; writes its wall
    times and the workers' logs to ``--out``."""
    from mpi4py import MPI

    from streamgnn.workers.mpi import spmd

    comm = MPI.COMM_WORLD
    snapshot, _ = stream_split("arxiv-like", False)
    model = model_for("graphconv-sum", snapshot, args.layers)
    sg.warm_up(model, partitions=2)
    if comm.Get_rank() != 0:
        instrument_worker([])

    def main(workers) -> dict:
        engine = Engine.from_pyg(model, snapshot, partitions=workers.size, workers=workers)
        batches = blocks(engine, snapshot, args.batch_size, args.batches, seed=0)
        batches = batches[:2 * BLOCK] + batches  # the first blocks warm
        walls = []
        for _, batch in batches:
            start = time.perf_counter()
            engine.apply(batch)
            walls.append(time.perf_counter() - start)
        logs = [s["applies"] for s in engine.stats()]
        warm = 2 * BLOCK
        return {"kinds": [k for k, _ in batches[warm:]], "walls": walls[warm:],
                "workers": [log[warm:] for log in logs]}

    result = spmd(model, main)
    if comm.Get_rank() == 0:
        Path(args.out).write_text(json.dumps(result))


def under_mpi(args: argparse.Namespace) -> dict:
    """`rank_job` under ``mpiexec -n P+1``; its figures."""
    out = Path(f"/tmp/streamgnn-idle-{os.getpid()}.json")
    exe = (os.environ.get("MPIEXEC")  # (device.sh names mpich's, beside an image's Open MPI)
           or shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec")
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    subprocess.run([exe, "-n", str(args.partitions + 1), sys.executable, __file__,
                    "--rank-job", "--out", str(out), "--partitions", str(args.partitions),
                    "--layers", str(args.layers), "--batches", str(args.batches),
                    "--batch-size", str(args.batch_size)], check=True, env=env)
    raw = json.loads(out.read_text())
    out.unlink()
    kinds, L = np.array(raw["kinds"]), args.layers

    def column(worker: int, key: str, kind: str) -> list[float]:
        return [r[key] for r, k in zip(raw["workers"][worker], kinds, strict=True)
                if k == kind]

    def idle(key: str) -> list[float]:
        return [t for w in range(1, args.partitions) for t in column(w, key, "one")]

    walls = np.array(raw["walls"])
    return {"idle_per_superstep": spread(idle("own_s"), L),
            "idle_cpu_per_superstep": spread(idle("own_cpu_s"), L),
            "idle_superstep_code_per_superstep": spread(idle("busy_s"), L),
            "idle_rest_per_superstep": spread(idle("rest_s"), L),
            "busy_per_superstep": spread(column(0, "own_s", "one"), L),
            "busy_cpu_per_superstep": spread(column(0, "own_cpu_s", "one"), L),
            "busy_superstep_code_per_superstep": spread(column(0, "busy_s", "one"), L),
            "busy_rest_per_superstep": spread(column(0, "rest_s", "one"), L),
            "all_busy_per_superstep": spread(column(0, "own_s", "all"), L),
            "busy_exchange_per_superstep": spread(column(0, "exchange_s", "one"), L),
            "all_busy_exchange_per_superstep": spread(column(0, "exchange_s", "all"), L),
            "wall_one": spread(walls[kinds == "one"].tolist()),
            "wall_all": spread(walls[kinds == "all"].tolist())}


# ---------------------------------------------------------------- report
def report(args: argparse.Namespace, local: dict, mpi: dict | None) -> None:
    table = Table(title=f"GraphConv-sum, {args.layers} layers, arxiv-like, P="
                        f"{args.partitions}, {args.batch_size} edges a partition a batch: "
                        "microseconds, median (p10-p90)")
    for column in ("", "per superstep", "idle / busy", "idle / nothing"):
        table.add_column(column, justify="left" if not column else "right")
    nothing = local["nothing_per_step"]["median_us"]

    def rows(where: str, figures: dict, keys: list[tuple[str, str]]) -> None:
        """A row per (key, label); an idle figure ``idle_X`` against its busy ``busy_X``
        (or the busy shard's in the same batches)."""
        for key, label in keys:
            s, idle = figures[key], key.startswith("idle")
            versus = figures.get(key.replace("idle", "busy"),
                                 figures["busy_per_superstep"])["median_us"]
            table.add_row(f"{where}: {label}", show(s),
                          f"{s['median_us'] / versus:.3f}" if idle else "",
                          f"{s['median_us'] / nothing:,.0f}" if idle else "")
        one, every = figures["wall_one"], figures["wall_all"]
        table.add_row(f"{where}: wall per batch, one partition / all",
                      f"{show(one)} / {show(every)}",
                      f"{one['median_us'] / every['median_us']:.2f}", "", end_section=True)

    rows("one process", local, [("idle_per_superstep", "idle shard"),
                                ("idle_alone_per_superstep", "idle shard, run alone (warm)"),
                                ("busy_per_superstep", "busy shard (one-partition batch)"),
                                ("all_busy_per_superstep", "busy shard (batch of all)")])
    table.add_row("one process: a generator doing nothing, per step", show(
        local["nothing_per_step"]), "", "1", end_section=True)
    if mpi is not None:
        rows("MPI", mpi, [("idle_per_superstep", "idle worker, own clock"),
                          ("idle_cpu_per_superstep", "idle worker, own CPU time"),
                          ("idle_superstep_code_per_superstep", "idle worker, superstep code"),
                          ("idle_rest_per_superstep", "idle worker, own clock less that"),
                          ("busy_per_superstep", "busy worker, own clock"),
                          ("busy_cpu_per_superstep", "busy worker, own CPU time"),
                          ("busy_superstep_code_per_superstep", "busy worker, superstep code"),
                          ("busy_rest_per_superstep", "busy worker, own clock less that"),
                          ("all_busy_per_superstep", "worker 1, batch of all, own clock"),
                          ("busy_exchange_per_superstep", "busy worker, in the exchanges"),
                          ("all_busy_exchange_per_superstep",
                           "worker 1, batch of all, in the exchanges")])
    console.print(table)
    if "profile" in local:
        prof = Table(title="Where an idle shard's time goes (cProfile, a pass of its own, "
                           "per batch; cProfile's own cost inflates small calls)")
        for column in ("function", "calls", "own us", "inclusive us"):
            prof.add_column(column, justify="left" if column == "function" else "right")
        for r in local["profile"]:
            prof.add_row(r["function"], f"{r['calls']:.1f}", f"{r['own_us']:.1f}",
                         f"{r['inclusive_us']:.1f}")
        console.print(prof)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=5,
                        help="edges a touched partition gets a batch")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the idle shard (in one process)")
    parser.add_argument("--no-mpi", action="store_true", help="skip the mpiexec run")
    parser.add_argument("--out", default="benchmarks/results/idle.json")
    parser.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rank_job:
        rank_job(args)
        return
    snapshot, _ = stream_split("arxiv-like", False)
    model = model_for("graphconv-sum", snapshot, args.layers)
    sg.warm_up(model, partitions=2)
    local = in_process(args, model, snapshot)
    mpi = None if args.no_mpi else under_mpi(args)
    report(args, local, mpi)
    Path(args.out).write_text(json.dumps(
        {"date": date.today().isoformat(), "machine": machine(), "args": vars(args),
         "one_process": local, "mpi": mpi}, indent=1))


if __name__ == "__main__":
    main()
