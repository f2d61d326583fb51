"""Scaling past 2 cores by measurement and a stated model (RIPPLE++ reports 77 % strong
scaling from 4 to 16 workers).

    python benchmarks/scaling.py [--preset arxiv-like] [--batch 1000] [--batches 30]

1. mpich's cost here: the workers' exchange (`mpi.alltoallv`: a count exchange, then
   a nonblocking send per peer) between 2 ranks at sizes 8 B to 4 MB; a least-squares
   fit of time = latency + bytes / bandwidth.
2. Per-shard work: the engine split into P = 1, 2, 4, 8, 16 shards in one process (each
   shard's compute timed alone, as if it had its own core), the same LinkBench batches:
   per superstep the slowest shard's compute and the most bytes any shard sent, and the
   router's own time (validation, routing) per batch.
3. The model: a batch's wall time = router + sum over supersteps of (slowest shard's
   compute + latency + most bytes sent / bandwidth).
4. Checked against real ``mpiexec`` runs (rank 0 + P workers) at P = 1, 2 and 4, on this
   2-core machine (the ranks share 2 cores, so the measured time is an upper bound).
5. Projected: P = 8 and 16 on arxiv-like, strong-scaling efficiency 4 -> 16; and a
   papers100M-sized graph (111M vertices, 1.6B edges, 128 features) on 32 and 64 ranks:
   memory per rank from the measured bytes per vertex and per edge, latency per batch
   from the measured per-update work.

Writes benchmarks/results/scaling.json (``--out``; one file per ``--batch``).

    python benchmarks/scaling.py --work 100 1000 10000 [--batches 15]

Step 2 alone at each batch size, printed: per P = 1, 2, 4, 8 the slowest and the mean
shard's compute a batch, and all shards' compute against one shard's (what the P > 1 path
adds: ghost rows, sources replicated on every partition holding them, per-step costs).

    python benchmarks/scaling.py --check benchmarks/results/scaling-16core.json [--models
        benchmarks/results/scaling.json benchmarks/results/scaling-bs10000.json]

6. Measures nothing: the model in those files against real ``mpiexec`` runs of
   benchmarks/scale.py on another machine, at each batch size of both; calibrated there
   (a per-core factor and the MPI path's fixed cost, from its P=1 runs at two batch
   sizes), then refitted with a term where P > 1 (see `check`); and from the real runs
   alone, wall = serial + parallel / P.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from engine import Trace, engine_bytes, model_for, stream_split
from rich.console import Console
from rich.table import Table

from streamgnn.workers import Engine

console = Console(width=160)
PAPERS = {"vertices": 111_059_956, "edges": 1_615_685_872, "features": 128}


# ---------------------------------------------------------------- under mpiexec
def rank_job(args) -> None:
    """Rank 0 drives P worker ranks through the batches; writes wall times per batch."""
    from mpi4py import MPI

    from streamgnn.workers.mpi import alltoallv, spmd

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if args.fit:
        sizes = [8 << k for k in range(0, 20, 2)]
        out = []
        for size in sizes:
            buffers = [np.zeros(size, np.uint8) for _ in range(comm.Get_size())]
            for _ in range(3):
                alltoallv(comm, buffers)
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(20):
                alltoallv(comm, buffers)
            out.append((size, (time.perf_counter() - t) / 20))
        if comm.Get_rank() == 0:
            Path(args.out).write_text(json.dumps(out))
        return
    snapshot, events = stream_split(args.preset, weighted=False)
    model = model_for("graphconv-sum", snapshot)

    def main(workers):
        engine = Engine.from_pyg(model, snapshot, partitions=workers.size, workers=workers)
        trace = Trace(snapshot, events, weighted=False)
        for _ in range(5):
            engine.apply(trace.batch(args.batch))
        walls = []
        for _ in range(args.batches):
            batch = trace.batch(args.batch)
            t = time.perf_counter()
            engine.apply(batch)
            walls.append(time.perf_counter() - t)
        return {"partitions": workers.size, "median_s": float(np.median(walls)),
                "stats": engine.stats()}

    result = spmd(model, main)
    if comm.Get_rank() == 0:
        Path(args.out).write_text(json.dumps(result))


def mpiexec(ranks: int, *extra: str) -> dict | list:
    out = Path(f"/tmp/streamgnn-scaling-{os.getpid()}-{ranks}.json")
    exe = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    subprocess.run([exe, "-n", str(ranks), sys.executable, __file__, "--rank-job",
                    "--out", str(out), *extra], check=True, env=env)
    return json.loads(out.read_text())


# ---------------------------------------------------------------- in one process
def per_shard_work(split, parts: list[int], size: int, batches: int) -> dict[int, dict]:
    """Per P: median over batches of (router seconds, per superstep the slowest shard's
    compute and the most bytes one shard sent), and state bytes."""
    snapshot, events = split
    model = model_for("graphconv-sum", snapshot)
    out = {}
    for p in parts:
        engine = Engine.from_pyg(model, snapshot, partitions=p)
        trace = Trace(snapshot, events, weighted=False)
        for _ in range(5):
            engine.apply(trace.batch(size))
        router, slowest, mean, sent, walls = [], [], [], [], []
        for _ in range(batches):
            batch = trace.batch(size)
            t = time.perf_counter()
            engine.apply(batch)
            wall = time.perf_counter() - t
            stats = engine.stats()
            busy = np.array([s["busy_s"] for s in stats])   # [P, steps]
            bytes_ = np.array([s["sent_bytes"] for s in stats]) if p > 1 else np.zeros((1, 0))
            router.append(wall - busy.sum())
            slowest.append(busy.max(axis=0))
            mean.append(busy.mean(axis=0))
            sent.append(bytes_.max(axis=0) if bytes_.size else np.zeros(0))
            walls.append(wall)
        out[p] = {"router_s": float(np.median(router)),
                  "slowest_s": np.median(slowest, axis=0).tolist(),
                  "mean_s": np.median(mean, axis=0).tolist(),
                  "max_sent_bytes": np.median(sent, axis=0).tolist(),
                  "one_process_s": float(np.median(walls)),
                  "state_bytes": engine_bytes(engine),
                  "vertices": engine.num_vertices, "edges": engine.num_edges,
                  "halo": sum(s["halo"] for s in engine.stats())}
        console.print(p, out[p])
        del engine
    return out


def compute_s(work: dict) -> float:
    """The model's work on cores: the router's and, per superstep, the slowest shard's."""
    return work["router_s"] + sum(work["slowest_s"])


def exchange_s(work: dict, latency: float, bandwidth: float) -> float:
    """The model's exchanges: a latency each, and the most bytes any shard sent."""
    return len(work["max_sent_bytes"]) * latency + sum(work["max_sent_bytes"]) / bandwidth


def modelled(work: dict, latency: float, bandwidth: float) -> float:
    """The model's wall seconds a batch."""
    return compute_s(work) + exchange_s(work, latency, bandwidth)


def work_table(preset: str, sizes: list[int], batches: int) -> None:
    """Step 2 alone, at each batch size: per P the slowest and the mean shard's compute a
    batch, and all shards' compute against one shard's (P=1): what grows with P."""
    split = stream_split(preset, weighted=False)
    table = Table(title=f"{preset}, GraphConv-sum 2 layers: each shard's compute a batch "
                        "(ms), shards timed alone in one process, median over batches")
    for col in ("batch", "P", "slowest shard", "mean shard", "all shards / P=1",
                "outside the shards ms"):
        table.add_column(col, justify="right")
    for size in sizes:
        work = per_shard_work(split, [1, 2, 4, 8], size, batches)
        one = sum(work[1]["mean_s"])
        for p, w in work.items():
            mean = sum(w["mean_s"])
            table.add_row(f"{size:,}", str(p), f"{sum(w['slowest_s']) * 1e3:.2f}",
                          f"{mean * 1e3:.2f}", f"{mean * p / one:.2f}x",
                          f"{w['router_s'] * 1e3:.2f}")
    console.print(table)


# ---------------------------------------------------------------- against real runs
def real_runs(path: Path) -> dict[tuple[int, int], float]:
    """Real ``mpiexec`` runs of benchmarks/scale.py, as in scaling-16core.json: the median
    seconds a batch by (batch size, workers)."""
    runs = json.loads(path.read_text())["mpiexec"]
    return {(r["batch"], r["workers"]): r["median_batch_s"] for r in runs}


def model_terms(paths: list[Path]) -> dict[tuple[int, int], tuple[float, float]]:
    """From files this script wrote (one per batch size): by (batch size, P), the
    model's compute seconds and exchange seconds as measured here."""
    out = {}
    for path in paths:
        run = json.loads(path.read_text())
        for w in run["rows"]:
            out[run["batch"], w["partitions"]] = (
                compute_s(w), exchange_s(w, run["latency_s"], run["bandwidth_bytes_s"]))
    return out


def least_squares(columns: list[np.ndarray], target: np.ndarray) -> np.ndarray:
    """The coefficients of ``columns`` that fit ``target`` best (least squares)."""
    return np.linalg.lstsq(np.stack(columns, axis=1), target, rcond=None)[0]


def amdahl(real: dict[tuple[int, int], float]) -> dict[int, tuple[float, float]]:
    """From the real runs alone, per batch size: wall = serial + parallel / P fitted to the
    runs with P > 1 (P=1 has no exchange); the serial part bounds the speed-up."""
    out = {}
    for batch in sorted({b for b, _ in real}):
        runs = [(p, wall) for (b, p), wall in real.items() if b == batch and p > 1]
        if len(runs) > 1:
            ranks, walls = np.array(runs, float).T
            out[batch] = tuple(least_squares([np.ones(len(ranks)), 1 / ranks], walls))
    return out


def fitted(compute: np.ndarray, exchange: np.ndarray, batches: np.ndarray,
           ranks: np.ndarray, walls: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """The model's rows (compute and exchange seconds as measured here, batch size, P)
    fitted to real walls (NaN: no real run) in two steps of stated terms: calibrated,
    wall = s * compute + exchange + c0, the per-core factor s and the MPI path's fixed
    cost a batch c0 from the P=1 runs alone (rank 0 and one worker: no exchange);
    refitted, + a + u * bs where P > 1, fitted to those runs: what splitting adds or the
    model measured here gets wrong, a part fixed a batch and a part per update. Returns
    both models' seconds per row and the terms."""
    one, split, known = ranks == 1, (ranks > 1).astype(float), ~np.isnan(walls)
    if (one & known).sum() < 2:
        raise SystemExit("calibrating needs P=1 runs and the model at two batch sizes")
    fit = one & known
    s, c0 = least_squares([compute[fit], np.ones(fit.sum())], walls[fit] - exchange[fit])
    calibrated = s * compute + exchange + c0
    fit = ~one & known
    a, u = least_squares([split[fit], batches[fit]], walls[fit] - calibrated[fit])
    terms = {"s": s, "c0": c0, "a": a, "u": u}
    return calibrated, calibrated + split * (a + u * batches), terms


def check(real_path: Path, model_paths: list[Path]) -> None:
    """The model against real runs on another machine (`fitted`), at each batch size of
    both; rows of the model without a real run are projections. Then the real runs'
    serial part (`amdahl`)."""
    real, terms = real_runs(real_path), model_terms(model_paths)
    keys = sorted(k for k in terms if any(b == k[0] for b, _ in real))
    compute, exchange, batches, ranks = (np.array(v, float) for v in zip(
        *((*terms[k], *k) for k in keys), strict=True))
    walls = np.array([real.get(k, np.nan) for k in keys])
    known = ~np.isnan(walls)
    calibrated, refitted, t = fitted(compute, exchange, batches, ranks, walls)
    console.print(f"from the P=1 runs: per-core factor s = {t['s']:.2f} (the other machine's "
                  f"time for this machine's second), the MPI path's fixed cost c0 = "
                  f"{t['c0'] * 1e3:.2f} ms a batch; from P > 1: a = {t['a'] * 1e3:+.2f} ms "
                  f"a batch, u = {t['u'] * 1e6:+.3f} us an update")
    table = Table(title=f"model vs real mpiexec runs ({real_path.name})")
    for col in ("bs", "P", "compute ms (here)", "exchange ms (here)", "calibrated ms",
                "error", "refitted ms", "error", "real ms"):
        table.add_column(col, justify="right")
    for i, (batch, p) in enumerate(keys):
        errors = [f"{(m - walls[i]) / walls[i]:+.0%}" if known[i] else ""
                  for m in (calibrated[i], refitted[i])]
        table.add_row(f"{batch:,}", str(p), f"{compute[i] * 1e3:.2f}",
                      f"{exchange[i] * 1e3:.2f}", f"{calibrated[i] * 1e3:.2f}", errors[0],
                      f"{refitted[i] * 1e3:.2f}", errors[1],
                      f"{walls[i] * 1e3:.2f}" if known[i] else "")
    console.print(table)
    for batch, (serial, parallel) in amdahl(real).items():
        console.print(f"real runs, bs={batch:,}: wall = {serial * 1e3:.1f} ms + "
                      f"{parallel * 1e3:.1f} ms / P; at most {batch / serial:,.0f} updates/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv-like")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    parser.add_argument("--check", type=Path, metavar="REAL",
                        help="measure nothing: compare the model in --models with the real "
                             "mpiexec runs in REAL (scaling-16core.json's layout)")
    parser.add_argument("--models", type=Path, nargs="+", metavar="JSON", default=[
        Path("benchmarks/results/scaling.json"),
        Path("benchmarks/results/scaling-bs10000.json")],
                        help="this script's results, one per batch size (with --check)")
    parser.add_argument("--work", type=int, nargs="+", metavar="BATCH",
                        help="measure step 2 alone at these batch sizes: each shard's "
                             "compute per P, and all shards' against one shard's")
    args = parser.parse_args()
    if args.rank_job:
        rank_job(args)
        return
    if args.check:
        check(args.check, args.models)
        return
    torch.set_num_threads(1)
    if args.work:
        work_table(args.preset, args.work, args.batches)
        return
    common = ["--preset", args.preset, "--batch", str(args.batch),
              "--batches", str(args.batches)]
    points = mpiexec(2, "--fit")
    sizes, seconds = np.array(points).T
    slope, latency = np.polyfit(sizes, seconds, 1)
    bandwidth = 1 / slope
    console.print(f"the exchange on mpich, 2 ranks: latency {latency * 1e6:.1f} us, bandwidth "
                  f"{bandwidth / 1e9:.2f} GB/s")
    split = stream_split(args.preset, weighted=False)
    work = per_shard_work(split, [1, 2, 4, 8, 16], args.batch, args.batches)
    measured = {p: mpiexec(p + 1, *common) for p in (1, 2, 4)}

    table = Table(title=f"{args.preset}, GraphConv-sum 2 layers, bs={args.batch}: wall time "
                        "per batch, model vs measured")
    for col in ("P", "router ms", "slowest shard, per superstep ms", "most bytes sent",
                "model ms", "mpiexec ms (2 cores)", "model error", "updates/s (model)"):
        table.add_column(col, justify="right")
    rows = []
    for p, w in work.items():
        model_s = modelled(w, latency, bandwidth) if p > 1 else w["one_process_s"]
        real = measured.get(p, {}).get("median_s")
        rows.append({"partitions": p, "model_s": model_s, "measured_s": real, **w})
        table.add_row(str(p), f"{w['router_s'] * 1e3:.2f}",
                      " / ".join(f"{s * 1e3:.2f}" for s in w["slowest_s"]),
                      " / ".join(f"{b / 1024:.0f} KB" for b in w["max_sent_bytes"]),
                      f"{model_s * 1e3:.2f}", f"{real * 1e3:.2f}" if real else "",
                      f"{(real - model_s) / real:+.0%}" if real else "",
                      f"{args.batch / model_s:,.0f}")
    console.print(table)
    for p, m in measured.items():  # per rank, the last batch under mpiexec
        busy = np.array([r["busy_s"] for r in m["stats"]])  # [rank, step]
        console.print(f"mpiexec P={p}: compute per rank (ms, per step) "
                      f"{np.round(busy * 1e3, 2).tolist()}; slowest / mean per step "
                      f"{np.round(busy.max(axis=0) / busy.mean(axis=0), 2).tolist()}")
    t4, t16 = (next(r["model_s"] for r in rows if r["partitions"] == p) for p in (4, 16))
    efficiency = t4 / t16 / 4  # strong scaling: 4x the ranks should take 1/4 of the time
    console.print(f"strong-scaling efficiency 4 -> 16 (model): {efficiency:.0%} "
                  "(RIPPLE++: 77 %)")

    # papers100M: memory per rank from bytes per vertex and per edge at P=16
    w16 = work[16]
    per_vertex = w16["state_bytes"] / (w16["vertices"] + w16["halo"])
    halo_ratio = w16["halo"] / w16["vertices"]
    papers = []
    for ranks in (32, 64):
        vertices = PAPERS["vertices"] / ranks * (1 + halo_ratio)
        memory = vertices * per_vertex * PAPERS["features"] / 128 + (
            PAPERS["edges"] / ranks * 24)
        # per-batch latency: the router's work and the exchanges as measured at 16;
        # shard compute scales with a batch's affected region, which grows with the
        # average degree (14.5 on papers100M vs 6.9 here), split over the ranks
        degree = PAPERS["edges"] / PAPERS["vertices"] / (w16["edges"] / w16["vertices"])
        compute = sum(w16["slowest_s"]) * 16 / ranks * degree ** 2
        latency_s = (w16["router_s"] + compute + len(w16["slowest_s"]) * latency
                     + sum(w16["max_sent_bytes"]) * degree / bandwidth)
        papers.append({"ranks": ranks, "memory_gb_per_rank": memory / 2**30,
                       "batch_latency_ms": latency_s * 1e3})
        console.print(papers[-1])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "preset": args.preset, "batch": args.batch, "date": time.strftime("%Y-%m-%d"),
        "latency_s": latency, "bandwidth_bytes_s": bandwidth, "rows": rows,
        "mpiexec": {str(p): m for p, m in measured.items()},
        "efficiency_4_to_16": efficiency, "papers100M": papers}, indent=2))


if __name__ == "__main__":
    main()
