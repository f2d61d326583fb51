"""End-to-end streaming benchmark: updates produced to Kafka (the embedded broker), served
by `Service` (consume, decode, arrivals gate, placement, engine, publish label changes,
acknowledged), next to the in-process engine on the same batches in the same run.

    python benchmarks/streaming.py [--preset arxiv-like] [--batch-sizes 100 1000]
                                   [--encodings json columns] [--workers 0 1]

``--workers N`` (N > 0) serves as `streamgnn serve --workers N` does: an MPI job of N + 1
ranks, rank 0 the router (consume, decode, validate, route, publish; its reading of the
next batch overlaps the workers' batch) and ranks 1..N one partition each, one torch
thread per rank; 0 serves in this process.

Throughput: a backlog of N LinkBench writes (adds replay the held-out 20 %) is produced
first, once per encoding on the wire (``json``: arrays of updates; ``columns``: `Columns`
messages, features in binary); a fresh service drains it; events/s = N / (first record
consumed -> last label change acknowledged). In-process runs and the drains of each
encoding alternate for ``--rounds``; best of each.
The in-process figure applies the same batches to a fresh engine directly. Latency: a
producer process sends updates paced at ``--pace`` (half) of the end-to-end rate, stamping event
time; latency = label change acknowledged by the broker - event time, over the events after
a warm-up. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.replay import LinkBenchWorkload
from streamgnn.router import Service, ServiceConfig
from streamgnn.stream import Topics, encode
from streamgnn.stream.broker import EmbeddedBroker
from streamgnn.stream.kafka import KafkaTransport
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import UpdateSender, ensure_topics

console = Console(width=160)


def workload(snapshot, events, n: int) -> list[sg.Update]:
    graph = sg.DynamicGraph.from_data(snapshot)
    gen = LinkBenchWorkload(graph, seed=1, arrivals=events)
    out: list[sg.Update] = []
    while len(out) < n:
        batch = gen.batch(1000)
        graph.apply(batch)
        out += batch
    return out[:n]


def in_process(model, snapshot, updates, bs: int) -> float:
    """The same batches applied to a fresh engine directly, the heap frozen as
    `Service.run` freezes it."""
    engine = sg.Engine.from_pyg(model, snapshot)
    gc.collect()
    gc.freeze()
    t = time.perf_counter()
    for i in range(0, len(updates), bs):
        engine.apply(updates[i:i + bs])
    return len(updates) / (time.perf_counter() - t)


def setup(preset: str, model: str):
    """The snapshot, the held-out events and the (seeded, untrained) model."""
    full = sg.datasets.synthetic(preset, seed=0)
    full.weight[:] = 1.0
    snapshot, events = sg.datasets.split_stream(full, 0.2, seed=0)
    spec = ModelSpec(model, full.num_features, full.num_classes, 128, 2)
    torch.manual_seed(0)
    return snapshot, events, ModelFile(spec, spec.build().state_dict())


@dataclass
class Run:
    """What a service run asks: its topics' prefix, the batch size; for a paced run the
    events to wait for, those of the warm-up and the producer's command."""

    bootstrap: str
    prefix: str
    batch_size: int
    events: int = 0
    warm: int = 0
    producer: list[str] | None = None


def serve(run: Run, engine: sg.Engine, checkpoint) -> dict:
    """One service run: a drain (until idle) or, with a producer, a paced run whose
    latencies count after the warm-up. Its figures."""
    topics = Topics.prefixed(run.prefix)
    service = Service(engine, checkpoint,
                      KafkaTransport(KafkaConfig(run.bootstrap), topics.updates),
                      ServiceConfig(batch_size=run.batch_size, topics=topics))
    if run.producer is None:
        stats = service.run(idle_exit_s=1.5)
    else:
        sender = subprocess.Popen(run.producer, stdout=subprocess.DEVNULL)

        def steady(_) -> None:  # latencies count from the end of the warm-up on
            if service.stats.events < run.warm:
                service.stats.latency.reset()

        stats = service.run(stop=lambda: sender.poll() is not None
                            and service.stats.events >= run.events, on_batch=steady)
        sender.wait()
    service.transport.close()
    return {"end_to_end": stats.throughput(), "service_busy": stats.applied / stats.busy_s,
            "label_changes": stats.label_changes,
            "latency_p50_ms": stats.latency.percentile(50),
            "latency_p99_ms": stats.latency.percentile(99)}


def served(run: Run, args, workers: int, checkpoint=None, snapshot=None) -> dict:
    """`serve` in this process (``workers`` 0: ``checkpoint`` and ``snapshot`` given) or
    as an MPI job of a router and ``workers`` worker ranks (this script under mpiexec,
    `job`)."""
    if not workers:
        return serve(run, sg.Engine.from_pyg(checkpoint.model(), snapshot), checkpoint)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        subprocess.run([mpiexec, "-n", str(workers + 1), sys.executable, __file__,
                        "--preset", args.preset, "--model", args.model,
                        "--job", json.dumps({**asdict(run), "out": str(out)})],
                       env={**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}, check=True)
        return json.loads(out.read_text())


def job(args) -> None:
    """A rank of `served`'s MPI job: rank 0 serves the run ``args.job`` names (a `Run`,
    and where to write its figures) with the other ranks as its workers."""
    from streamgnn.workers.mpi import spmd

    torch.set_num_threads(1)  # as `streamgnn serve` runs each rank
    keep_freed_memory()
    spec = json.loads(args.job)
    out = Path(spec.pop("out"))
    snapshot, _, checkpoint = setup(args.preset, args.model)

    def router(workers) -> None:
        engine = sg.Engine(checkpoint.model(), sg.DynamicGraph.from_data(snapshot),
                           partitions=workers.size, workers=workers)
        out.write_text(json.dumps(serve(Run(**spec), engine, checkpoint)))

    spmd(checkpoint.model(), router)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="arxiv-like")
    ap.add_argument("--model", default="graphconv-sum")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--per-message", type=int, default=100,
                    help="updates per Kafka message")
    ap.add_argument("--encodings", nargs="+", choices=["json", "columns"],
                    default=["json", "columns"], help="how updates go on the wire")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1],
                    help="0: serve in this process; N: an MPI job of a router and N "
                         "workers (as `streamgnn serve --workers N`)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="in-process runs and backlog drains, alternating; best of each")
    ap.add_argument("--pace", type=float, default=0.5,
                    help="latency run: produce at this fraction of the end-to-end rate")
    ap.add_argument("--latency-seconds", type=float, default=6.0,
                    help="latency run: seconds of paced updates measured ...")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="... after this many seconds of them (producer start, first batches)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/streaming.json"))
    ap.add_argument("--job", help=argparse.SUPPRESS)  # a rank of an MPI job (`served`)
    args = ap.parse_args()
    if args.job:
        job(args)
        return
    torch.set_num_threads(2)
    keep_freed_memory()  # as `streamgnn serve` runs the engine

    snapshot, events, checkpoint = setup(args.preset, args.model)
    updates = workload(snapshot, events, args.updates)
    lines = b"".join(encode(u) + b"\n" for u in updates)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = EmbeddedBroker(Path(tmp), port=19592)
        broker.start()
        try:
            for bs in args.batch_sizes:
                rows += measure(KafkaConfig(broker.bootstrap), checkpoint, snapshot,
                                updates, lines, bs, args, Path(tmp))
        finally:
            broker.stop()

    table = Table(title=f"streaming end to end: {args.preset}, {args.model} (2 layers), "
                        f"{args.updates:,} LinkBench writes")
    for col in ("bs", "encoding", "workers", "in-process upd/s", "end-to-end upd/s",
                "e2e / in-process", "service busy upd/s", "paced rate", "latency p50 ms",
                "latency p99 ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch_size"]), r["encoding"], str(r["workers"]),
                      f"{r['in_process']:,.0f}", f"{r['end_to_end']:,.0f}",
                      f"{r['ratio']:.0%}", f"{r['service_busy']:,.0f}",
                      f"{r['paced_rate']:,.0f}", f"{r['latency_p50_ms']:.1f}",
                      f"{r['latency_p99_ms']:.1f}")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"preset": args.preset, "model": args.model,
                                    "rows": rows}, indent=1))
    console.print(f"-> {args.out}")


def measure(kafka: KafkaConfig, checkpoint, snapshot, updates, lines, bs, args, tmp: Path
            ) -> list[dict]:
    """The rows of batch size ``bs``, one per encoding and number of workers."""
    model = checkpoint.model()
    for encoding in args.encodings:  # a backlog per encoding, drained from the start each time
        topics = Topics.prefixed(f"b{bs}-{encoding}-")
        ensure_topics(kafka, topics.all())
        out = UpdateSender(kafka, topics.updates, args.per_message,
                           columns=encoding == "columns")
        for line in lines.splitlines():
            out.send(line)
        out.close()
    ways = [(encoding, workers) for encoding in args.encodings for workers in args.workers]
    rates, drains = [], {way: [] for way in ways}
    for _ in range(args.rounds):  # alternating, so drift on a shared machine hits all
        rates.append(in_process(model, snapshot, updates, bs))
        for encoding, workers in ways:
            run = Run(kafka.bootstrap_servers, f"b{bs}-{encoding}-", bs)
            drains[encoding, workers].append(served(run, args, workers, checkpoint, snapshot))
    return [latency_row(kafka, checkpoint, snapshot, lines, bs, args, tmp, encoding, workers,
                        max(rates), max(runs, key=lambda f: f["end_to_end"]))
            for (encoding, workers), runs in drains.items()]


def latency_row(kafka: KafkaConfig, checkpoint, snapshot, lines, bs, args, tmp: Path,
                encoding: str, workers: int, rate_in: float, best: dict) -> dict:
    """The row of one encoding and number of workers: its best drain's figures
    (``best``), and a latency run."""
    e2e = best["end_to_end"]
    paced = args.pace * e2e
    n = min(args.updates, int(paced * (args.warmup + args.latency_seconds)))
    file = tmp / f"paced{bs}.jsonl"
    file.write_bytes(b"".join(lines.splitlines(keepends=True)[:n]))
    prefix = f"p{bs}-{encoding}-w{workers}-"
    ensure_topics(kafka, Topics.prefixed(prefix).all())
    producer = [sys.executable, "-m", "streamgnn.cli", "produce", str(file),
                "--rate", str(paced), "--per-message", str(args.per_message),
                f"--{encoding}", "-b", kafka.bootstrap_servers, "--topic-prefix", prefix]
    paced_run = served(Run(kafka.bootstrap_servers, prefix, bs, n, int(paced * args.warmup),
                           producer), args, workers, checkpoint, snapshot)
    console.print(f"bs={bs} {encoding} workers={workers}: in-process {rate_in:,.0f}/s, "
                  f"end-to-end {e2e:,.0f}/s, latency p50 "
                  f"{paced_run['latency_p50_ms']:.1f} ms")
    return {"batch_size": bs, "encoding": encoding, "workers": workers,
            "in_process": rate_in, "end_to_end": e2e, "ratio": e2e / rate_in,
            "service_busy": best["service_busy"], "label_changes": best["label_changes"],
            "paced_rate": paced, "paced_events": n,
            "latency_p50_ms": paced_run["latency_p50_ms"],
            "latency_p99_ms": paced_run["latency_p99_ms"]}


if __name__ == "__main__":
    main()
