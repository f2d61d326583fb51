"""The ``streamgnn`` command: datasets, training, bootstrap, the embedded broker, the
streaming service and its producer/watch tools, and the demo.

Owns argument parsing and terminal output only; the work lives in the subpackages.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from streamgnn.stream.kafka_config import KafkaConfig

app = typer.Typer(
    help="streamgnn: exact, incremental GNN inference over a streaming graph.\n\n"
    "Typical flow: `streamgnn broker start` (or point --bootstrap-servers at Kafka), "
    "`streamgnn train` a model on a dataset's snapshot, `streamgnn serve` it, send updates "
    "with `streamgnn produce updates.jsonl`, follow `streamgnn watch labels` and label "
    "new vertices with `streamgnn query request.json`. "
    "`streamgnn demo` runs the whole flow on a synthetic graph.",
    no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_show_locals=False)
datasets_app = typer.Typer(help="Generate and inspect graphs.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")
broker_app = typer.Typer(help="The embedded Kafka-compatible broker (Tansu, in memory).",
                         no_args_is_help=True)
app.add_typer(broker_app, name="broker")
console = Console()

DatasetOpt = Annotated[str, typer.Option(
    "--dataset", "-d", envvar="STREAMGNN_DATASET",
    help="Synthetic preset (tiny, small, arxiv-like, products-like), a .npz written by "
         "`streamgnn datasets generate`, or an OGB node dataset directory.")]
SeedOpt = Annotated[int, typer.Option("--seed", envvar="STREAMGNN_SEED",
                                      help="Seed for generation and splits.")]
HoldoutOpt = Annotated[float, typer.Option(
    "--holdout", help="Fraction of vertices held out of the snapshot as the update "
                      "stream (RIPPLE++ protocol: 0.2). 0 uses the whole graph.")]
DeviceOpt = Annotated[str, typer.Option("--device", envvar="STREAMGNN_DEVICE",
                                        help="torch device for dense work: cpu or cuda.")]
BootstrapOpt = Annotated[str, typer.Option(
    "--bootstrap-servers", "-b", envvar="STREAMGNN_BOOTSTRAP_SERVERS",
    help="Kafka brokers (host:port,...); the default is the embedded broker.")]
KafkaConfigOpt = Annotated[Path | None, typer.Option(
    "--kafka-config", envvar="STREAMGNN_KAFKA_CONFIG",
    help="Kafka client settings for a production cluster: key=value lines "
         "(security.protocol=SASL_SSL, sasl.mechanism=PLAIN, ssl.cafile=..., client.id=...); "
         "STREAMGNN_KAFKA_<SETTING> variables override them.")]
TopicPrefixOpt = Annotated[str, typer.Option(
    "--topic-prefix", envvar="STREAMGNN_TOPIC_PREFIX",
    help="Prefix of every topic name (graph-updates, label-changes, dead-letters, ...).")]
BrokerDirOpt = Annotated[Path, typer.Option(
    "--state-dir", envvar="STREAMGNN_BROKER_DIR", help="Pid file and log of the broker.")]
BrokerPortOpt = Annotated[int, typer.Option("--port", envvar="STREAMGNN_BROKER_PORT",
                                            help="Port of the embedded broker.")]
DEFAULT_BOOTSTRAP = "127.0.0.1:19092"
DEFAULT_BROKER_DIR = Path.home() / ".streamgnn" / "broker"
DEFAULT_CALIBRATION = Path.home() / ".streamgnn" / "calibration.json"
CalibrationOpt = Annotated[Path, typer.Option(
    "--calibration", envvar="STREAMGNN_CALIBRATION",
    help="Query executor thresholds written by `streamgnn calibrate` (serve: used when "
         "the file exists; without it query batches run on --device).")]


def _topics(prefix: str):
    from streamgnn.stream import Topics

    return Topics.prefixed(prefix)


def _kafka(bootstrap_servers: str, file: Path | None) -> KafkaConfig:
    """The brokers and the client settings from ``file`` and ``STREAMGNN_KAFKA_*``."""
    from streamgnn.errors import KafkaConfigError
    from streamgnn.stream.kafka_config import KafkaConfig

    try:
        return KafkaConfig.load(bootstrap_servers, file)
    except KafkaConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--kafka-config / STREAMGNN_KAFKA_*"
                                 ) from None


def _snapshot(dataset: str, seed: int, holdout: float):
    """(the whole graph, the snapshot to start from, the held-out updates)."""
    from streamgnn.datasets import open_dataset, split_stream

    t = time.perf_counter()
    full = open_dataset(dataset, seed)
    console.print(f"[bold]{full}[/] loaded in {time.perf_counter() - t:.1f} s")
    if holdout <= 0:
        return full, full, []
    data, events = split_stream(full, holdout, seed)
    console.print(f"snapshot: {data.num_vertices:,} vertices, {data.num_edges:,} edges; "
                  f"{len(events):,} held-out updates")
    return full, data, events


@datasets_app.command("generate")
def datasets_generate(
    preset: Annotated[str, typer.Argument(help="tiny, small, arxiv-like or products-like")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Where to write the .npz.")] = None,
    seed: SeedOpt = 0,
) -> None:
    """Generate a synthetic preset and save it as .npz."""
    from streamgnn.datasets import save, synthetic

    t = time.perf_counter()
    data = synthetic(preset, seed)
    elapsed = time.perf_counter() - t
    path = save(data, out or Path(f"{preset}-seed{seed}.npz"))
    console.print(f"{data} generated in {elapsed:.1f} s -> {path}")


@datasets_app.command("holdout")
def datasets_holdout(
    dataset: Annotated[str, typer.Argument(help="Preset, .npz or OGB directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")] = Path(
        "updates.jsonl"),
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
) -> None:
    """Write the held-out part of a dataset as a JSONL file of updates (one per line), the
    stream `streamgnn produce` sends to a service bootstrapped on the snapshot."""
    from tqdm.auto import tqdm

    from streamgnn.stream import encode

    _, _, events = _snapshot(dataset, seed, holdout)
    with open(out, "wb") as f:
        for u in tqdm(events, desc="writing", unit="update", leave=False,
                      disable=None):
            f.write(encode(u) + b"\n")
    console.print(f"{len(events):,} updates -> {out}")


@datasets_app.command("info")
def datasets_info(dataset: DatasetOpt = "tiny", seed: SeedOpt = 0) -> None:
    """Print size, degree skew and label balance of a dataset."""
    import numpy as np

    from streamgnn.datasets import open_dataset

    data = open_dataset(dataset, seed)
    indeg = np.bincount(data.positions(data.dst), minlength=data.num_vertices)
    table = Table(title=str(data))
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in [("mean in-degree", f"{indeg.mean():.2f}"),
                 ("max in-degree", f"{indeg.max():,}"),
                 ("p99 in-degree", f"{np.percentile(indeg, 99):.0f}"),
                 ("vertices with no in-edge", f"{(indeg == 0).mean():.1%}")]:
        table.add_row(k, v)
    console.print(table)


@app.command()
def train(
    dataset: DatasetOpt = "arxiv-like",
    model: Annotated[str, typer.Option("--model", "-m", help="gcn, sage-mean, sage-sum, "
                                       "sage-max, sage-min, graphconv-sum, graphconv-mean, "
                                       "graphconv-max, graphconv-min, gin, gat")] = "sage-mean",
    hidden: Annotated[int, typer.Option(help="Hidden width.")] = 128,
    layers: Annotated[int, typer.Option(help="Number of GNN layers.")] = 2,
    epochs: Annotated[int, typer.Option(help="Full-batch training epochs.")] = 100,
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint path.")] = Path(
        "artifacts/model.pt"),
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
) -> None:
    """Train a model on the dataset's snapshot, next to an MLP baseline; save a checkpoint."""
    _train(dataset, model, hidden, layers, epochs, out, holdout, seed)


def _train(dataset, model, hidden, layers, epochs, out, holdout, seed):
    from streamgnn.models.train import train as fit
    from streamgnn.models.zoo import ModelSpec

    full, data, events = _snapshot(dataset, seed, holdout)
    spec = ModelSpec(model, data.num_features, data.num_classes, hidden, layers)
    result = fit(data, spec, epochs=epochs, seed=seed)
    table = Table(title=f"{model} on {data.name} ({epochs} epochs, {result.seconds:.1f} s)")
    for col in ("model", "train", "val", "test"):
        table.add_column(col, justify="right")
    for name, acc in ((model, result.gnn), ("MLP (same features)", result.mlp)):
        table.add_row(name, f"{acc.train:.3f}", f"{acc.val:.3f}", f"{acc.test:.3f}")
    console.print(table)
    console.print(f"checkpoint -> {result.checkpoint.save(out)}")
    return full, data, events, result


@app.command()
def bootstrap(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="From `train`.")] = Path(
        "artifacts/model.pt"),
    dataset: DatasetOpt = "arxiv-like",
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """Compute every layer's embedding of every vertex (layer-wise full inference) and
    compare its time with PyG's own forward pass."""
    from streamgnn.models.zoo import Checkpoint

    _, data, _ = _snapshot(dataset, seed, holdout)
    _bootstrap(data, Checkpoint.load(checkpoint).model(), device)


def _bootstrap(data, model, device: str) -> None:
    from streamgnn.models.bootstrap import compare_bootstrap

    r = compare_bootstrap(data, model, device)
    table = Table(title=f"bootstrap of {data.name} ({device})")
    table.add_column("step")
    table.add_column("value", justify="right")
    rows = [("graph store load", f"{r.graph_s:.2f} s"),
            ("layer-wise inference (all layers)", f"{r.layerwise_s:.2f} s"),
            ("PyG forward pass (edge_index)", f"{r.pyg_s:.2f} s"),
            ("ratio ours / PyG", f"{r.layerwise_s / r.pyg_s:.2f}x"),
            ("max |ours - PyG|", f"{r.max_error:.2e}")]
    if r.accuracy is not None:
        rows.append(("accuracy of bootstrapped labels (all vertices)", f"{r.accuracy:.3f}"))
    for row in rows:
        table.add_row(*row)
    console.print(table)


@app.command()
def demo(
    dataset: DatasetOpt = "arxiv-like",
    model: Annotated[str, typer.Option("--model", "-m")] = "sage-mean",
    epochs: Annotated[int, typer.Option()] = 40,
    batch_size: Annotated[int, typer.Option(help="Updates per batch.")] = 1000,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    state_dir: BrokerDirOpt = DEFAULT_BROKER_DIR,
    port: BrokerPortOpt = 19092,
    kafka_config: KafkaConfigOpt = None,
) -> None:
    """The whole product on one machine: start the embedded broker (unless one runs),
    synthesize a graph, train on its 80 % snapshot, bootstrap all layer embeddings, serve,
    stream the held-out 20 % in through Kafka, show label changes live, and end with a
    summary checked against PyG's forward pass. Stops what it started."""
    from streamgnn.allocator import keep_freed_memory
    from streamgnn.demo import run_demo
    from streamgnn.stream.broker import EmbeddedBroker

    keep_freed_memory()
    broker = EmbeddedBroker(state_dir, port=port)
    kafka = _kafka(broker.bootstrap, kafka_config)
    out = Path("artifacts") / f"{model}-{dataset}.pt"
    full, data, events, result = _train(dataset, model, 128, 2, epochs, out, 0.2, seed)
    _bootstrap(data, result.checkpoint.model(), device)
    summary = run_demo(broker, kafka, full, data, events, result.checkpoint, batch_size,
                       device, console)
    _print_stats(summary.stats, extra=summary.rows)


# ---------------------------------------------------------------- broker
@broker_app.command("start")
def broker_start(state_dir: BrokerDirOpt = DEFAULT_BROKER_DIR, port: BrokerPortOpt = 19092
                 ) -> None:
    """Start the embedded broker in the background (no-op if it runs); wait until ready."""
    from streamgnn.stream.broker import EmbeddedBroker

    status = EmbeddedBroker(state_dir, port=port).start()
    console.print(f"broker running: pid {status.pid}, bootstrap {status.bootstrap}, "
                  f"log {status.log}")


@broker_app.command("stop")
def broker_stop(state_dir: BrokerDirOpt = DEFAULT_BROKER_DIR) -> None:
    """Stop the embedded broker (its topics are in memory and go with it)."""
    from streamgnn.stream.broker import EmbeddedBroker

    stopped = EmbeddedBroker(state_dir).stop()
    console.print("broker stopped" if stopped else "broker was not running")


@broker_app.command("status")
def broker_status(state_dir: BrokerDirOpt = DEFAULT_BROKER_DIR) -> None:
    """Say whether the embedded broker runs, and where; exit code 1 if it does not."""
    from streamgnn.stream.broker import EmbeddedBroker

    status = EmbeddedBroker(state_dir).status()
    if not status.running:
        console.print(f"broker not running (log {status.log})")
        raise typer.Exit(1)
    console.print(f"broker running: pid {status.pid}, bootstrap {status.bootstrap}, "
                  f"log {status.log}")


# ---------------------------------------------------------------- streaming
@app.command()
def serve(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="Model from `train` "
                                             "(used when no service state exists).")] = Path(
        "artifacts/model.pt"),
    dataset: DatasetOpt = "arxiv-like",
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", envvar="STREAMGNN_STATE_DIR",
        help="Service checkpoints; a restart resumes from the last one.")] = Path("runs/serve"),
    batch_size: Annotated[int, typer.Option("--batch-size", "--bs", envvar="STREAMGNN_BATCH_SIZE",
                                            help="Updates per batch.")] = 1000,
    max_wait: Annotated[float, typer.Option(help="Seconds before a partial batch is "
                                            "applied.")] = 0.05,
    arrival_wait: Annotated[float, typer.Option(help="Seconds an update naming a vertex that "
                                                "has not arrived waits for it.")] = 2.0,
    checkpoint_every: Annotated[int, typer.Option(help="Checkpoint every N batches ...")] = 50,
    checkpoint_seconds: Annotated[float, typer.Option(help="... or every this many "
                                                      "seconds.")] = 30.0,
    partitions: Annotated[int, typer.Option(
        envvar="STREAMGNN_PARTITIONS", help="Split the engine's state into P partitions "
        "(in this process; same answers for every P).")] = 1,
    placement: Annotated[str, typer.Option(
        envvar="STREAMGNN_PLACEMENT", help="metis (initial owners by METIS, new vertices by "
        "RIPPLE++ Alg. 1) or hash (id mod P).")] = "metis",
    until_idle: Annotated[float | None, typer.Option(
        help="Exit after this many seconds without input (default: run until Ctrl-C).")
    ] = None,
    max_abs_feature: Annotated[float, typer.Option(
        envvar="STREAMGNN_MAX_ABS_FEATURE", help="Largest |feature value| accepted; larger "
        "ones are dead-lettered as out_of_range (past ~1e9 for |weight x feature| float "
        "cancellation would break exactness).")] = 1e6,
    max_abs_weight: Annotated[float, typer.Option(
        envvar="STREAMGNN_MAX_ABS_WEIGHT", help="Largest |edge weight| accepted.")] = 1e3,
    quarantine_after: Annotated[int, typer.Option(
        envvar="STREAMGNN_QUARANTINE_AFTER", help="Deaths of the service with one update "
        "alone in flight before that update is dead-lettered as quarantined.")] = 2,
    workers: Annotated[int, typer.Option(
        envvar="STREAMGNN_WORKERS", help="Run the partitions on N MPI worker ranks: starts "
        "`mpiexec -n N+1` (rank 0 serves the stream, ranks 1..N hold one partition each) "
        "and restarts the job from its last checkpoint if any rank dies. 0: one process.")
    ] = 0,
    max_restarts: Annotated[int, typer.Option(
        envvar="STREAMGNN_MAX_RESTARTS", help="With --workers: restarts of a failed job "
        "(backoff 1, 2, 4 ... s) before giving up.")] = 3,
    bootstrap_servers: BootstrapOpt = DEFAULT_BOOTSTRAP,
    kafka_config: KafkaConfigOpt = None,
    topic_prefix: TopicPrefixOpt = "",
    device: DeviceOpt = "cpu",
    calibration: CalibrationOpt = DEFAULT_CALIBRATION,
    http: Annotated[str, typer.Option(
        envvar="STREAMGNN_HTTP", help="Serve the REST API (embeddings, labels, neighbours, "
        "queries, status, /metrics, /healthz, /readyz; OpenAPI at /docs) on HOST:PORT, "
        "or off.")] = "127.0.0.1:8080",
    http_token: Annotated[str | None, typer.Option(
        envvar="STREAMGNN_HTTP_TOKEN", help="Bearer token every /v1 and /metrics request "
        "must send (Authorization: Bearer TOKEN); required beyond loopback.")] = None,
    torch_threads: Annotated[int | None, typer.Option(
        envvar="STREAMGNN_TORCH_THREADS", min=0, help="Threads torch runs a batch's dense "
        "work on, in each process. Default: OMP_NUM_THREADS if set, else 1: a batch's "
        "hundreds of small operations each wait for every thread, and on cores shared "
        "with the REST server, the Kafka client or other processes more threads run "
        "slower (see README, Threads). 0: torch's default, one per core.")] = None,
) -> None:
    """Serve a model on the update stream: consume graph-updates, keep every embedding
    exact, publish label-changes and dead-letters, checkpoint state and offsets; answer
    query-requests on query-results between two batches (`streamgnn query` sends one),
    and REST reads and queries on --http, each from the state between two batches.

    Ctrl-C or SIGTERM (docker stop, Kubernetes) stops at the next batch boundary and
    writes a checkpoint; a second one aborts at once (the last checkpoint and the journal
    still resume exactly). Started again with the same --state-dir, it resumes: batches
    since the checkpoint are replayed as they were (same label-change messages, same
    event ids), and input the last process died on is isolated and, at the second death,
    dead-lettered as quarantined.

    With --workers N it supervises an MPI job; `mpiexec -n N+1 streamgnn serve ...` runs
    the job itself (N taken from the job's size), without restarts."""
    from streamgnn.api.bind import parse_bind

    kafka = _kafka(bootstrap_servers, kafka_config)
    try:
        listen = parse_bind(http, http_token)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--http") from None
    if workers and os.environ.get(_MPI_JOB) != "1":
        raise typer.Exit(_supervise(workers, max_restarts, _rank_files(state_dir)))
    _set_torch_threads(torch_threads)
    comm = _mpi_world()
    mpi_workers = None
    if comm is not None:
        ranks = _rank_files(state_dir)
        ranks.mkdir(parents=True, exist_ok=True)
        (ranks / f"{os.getpid()}.rank").write_text(str(comm.Get_rank()))
        if comm.Get_rank() > 0:  # a worker: one partition, never kafka
            _serve_worker(comm, checkpoint, state_dir, device)
            return
        from streamgnn.workers.mpi import MpiWorkers

        mpi_workers = MpiWorkers(comm)
        partitions = mpi_workers.size
    try:
        _serve(checkpoint, dataset, holdout, seed, state_dir, batch_size, max_wait,
               arrival_wait, checkpoint_every, checkpoint_seconds, partitions, placement,
               until_idle, max_abs_feature, max_abs_weight, quarantine_after,
               kafka, topic_prefix, device, mpi_workers, calibration, listen, http_token)
    except BaseException as e:
        if mpi_workers is not None:  # never leave the workers waiting
            import traceback

            traceback.print_exc()
            # MPI_Abort may kill the output relay before it forwards the traceback: the
            # supervisor reads the reason from here
            (_rank_files(state_dir) / f"{os.getpid()}.error").write_text(
                f"{type(e).__name__}: {e}")
            comm.Abort(_NO_RETRY if isinstance(e, ValueError) else 1)
        raise
    if mpi_workers is not None:
        mpi_workers.stop()


def _set_torch_threads(threads: int | None) -> None:
    """`serve --torch-threads`: None takes OMP_NUM_THREADS, else 1; 0 keeps torch's own."""
    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    if threads:
        import torch

        torch.set_num_threads(threads)


_MPI_JOB = "STREAMGNN_MPI_JOB"
_NO_RETRY = 3  # the job's exit code for a configuration error: restarting cannot help


def _rank_files(state_dir: Path) -> Path:
    """Where the ranks of a job serving ``state_dir`` note their pids (``<pid>.rank``)."""
    return state_dir / "ranks"


def _supervise(workers: int, max_restarts: int, ranks: Path) -> int:
    """Run this command as an MPI job of ``workers`` + 1 ranks; restart it (from its last
    checkpoint) when it fails, with backoff; forward SIGINT/SIGTERM to it. ``ranks``: the
    job's `_rank_files`, to name a rank that dies."""
    import shutil
    import subprocess
    import sys

    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec")
    if mpiexec is None:
        console.print("[red]--workers needs mpiexec: pip install mpich[/red]")
        return 2
    command = [mpiexec, "-n", str(workers + 1), sys.executable, "-m", "streamgnn.cli",
               *sys.argv[1:]]
    env = {**os.environ, _MPI_JOB: "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    stopping: list[int] = []
    job: list[subprocess.Popen] = []

    def forward(signum, _frame) -> None:
        stopping.append(signum)
        if job:
            job[-1].send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    delay = 1.0
    for attempt in range(max_restarts + 1):
        shutil.rmtree(ranks, ignore_errors=True)
        job.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT))
        died = _relay(job[-1], ranks)
        code = job[-1].wait()
        if code == 0 or stopping:
            return code
        if code == _NO_RETRY:
            reasons = "; ".join(f.read_text() for f in ranks.glob("*.error")) or "above"
            console.print(f"[red]the MPI job stopped on a configuration error ({reasons}); "
                          "not restarting[/red]", highlight=False, soft_wrap=True)
            return code
        console.print(f"[yellow]the MPI job exited with code {code}; "
                      f"{died or 'no rank'} stopped first[/yellow]")
        if attempt == max_restarts:
            break
        console.print(f"[yellow]restart {attempt + 1} of {max_restarts} from the last "
                      f"checkpoint in {delay:g} s[/yellow]")
        time.sleep(delay)
        delay *= 2
    console.print(f"[red]the MPI job failed {max_restarts + 1} times; giving up[/red]")
    return code


def _relay(job, ranks: Path) -> str | None:
    """Pass the job's output through as it comes, watching its ranks (their pid files in
    ``ranks``); returns the first rank seen to exit, as "rank R (pid P)", if any did."""
    import contextlib
    import select
    import sys

    out = job.stdout.fileno()
    watched: dict[int, tuple[str, int]] = {}  # pidfd -> (rank, pid)
    first = None
    while True:
        for f in ranks.glob("*.rank"):
            pid = int(f.stem)
            if pid not in {p for _, p in watched.values()}:
                with contextlib.suppress(OSError):  # gone already
                    watched[os.pidfd_open(pid)] = (f.read_text(), pid)
        ready, _, _ = select.select([out, *watched], [], [], 0.5)
        for fd in ready:
            if fd in watched:
                rank, pid = watched.pop(fd)
                os.close(fd)
                first = first or f"rank {rank} (pid {pid})"
        if out in ready:
            chunk = os.read(out, 1 << 16)
            if not chunk:
                for fd in watched:
                    os.close(fd)
                return first
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()


def _mpi_world():
    """MPI's world communicator when this process is one rank of several, else None."""
    if os.environ.get(_MPI_JOB) != "1" and "PMI_SIZE" not in os.environ:
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _serve_worker(comm, checkpoint: Path, state_dir: Path, device: str) -> None:
    """A worker rank: the model from the service's last checkpoint (or the model file on
    a fresh start), then one partition until rank 0 says stop. Signals are rank 0's to
    act on (it stops the workers at a batch boundary)."""
    from streamgnn.allocator import keep_freed_memory
    from streamgnn.models.zoo import Checkpoint
    from streamgnn.router.checkpoint import Checkpoints
    from streamgnn.router.service import saved_model
    from streamgnn.workers.mpi import run_worker

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    keep_freed_memory()  # the shard's batches run here: as rank 0 does in one process
    saved = Checkpoints(state_dir).load(names=("model",))
    model = (Checkpoint.load(checkpoint) if saved is None else saved_model(saved)).model()
    _warm_up(model, device, 2, lambda text: None)  # (another host has its own cache)
    run_worker(model, comm, device)


def _warm_up(model, device: str, partitions: int, say: Callable[[str], None]) -> None:
    """Compile the engine's kernels before the first batch (`warm_up_if_possible`)."""
    from streamgnn.workers.warm_up import WARMING_UP, warm_up_if_possible

    say(WARMING_UP)
    if (seconds := warm_up_if_possible(model, device, partitions)) is not None:
        say(f"kernels ready in {seconds:.1f} s")


def _serve(checkpoint, dataset, holdout, seed, state_dir, batch_size, max_wait,
           arrival_wait, checkpoint_every, checkpoint_seconds, partitions, placement,
           until_idle, max_abs_feature, max_abs_weight, quarantine_after, kafka,
           topic_prefix, device, mpi_workers, calibration, listen, http_token) -> None:
    """`serve` in this process (rank 0 of an MPI job when ``mpi_workers`` is given), with
    the REST API on ``listen`` (host, port) unless it is None."""
    from streamgnn.allocator import keep_freed_memory
    from streamgnn.graph import DynamicGraph
    from streamgnn.models.zoo import Checkpoint
    from streamgnn.router import Checkpoints, Service, ServiceConfig, run_recovering
    from streamgnn.router.reads import Reads
    from streamgnn.stream.kafka import KafkaTransport
    from streamgnn.stream.kafka_tools import ensure_topics
    from streamgnn.workers import Engine
    from streamgnn.workers.executors import Calibration

    keep_freed_memory()
    topics = _topics(topic_prefix)
    config = ServiceConfig(batch_size=batch_size, max_wait_s=max_wait,
                           arrival_wait_s=arrival_wait, checkpoint_batches=checkpoint_every,
                           checkpoint_s=checkpoint_seconds, max_abs_feature=max_abs_feature,
                           max_abs_weight=max_abs_weight, quarantine_after=quarantine_after,
                           topics=topics)
    ensure_topics(kafka, topics.all())
    reads = Reads()
    checkpoints = Checkpoints(state_dir)
    if checkpoints.kept():
        console.print(f"resuming from {checkpoints.folder(checkpoints.kept()[-1])}")

    def start(model: Checkpoint) -> Engine:
        # the snapshot's graph alone: the whole dataset and the held-out part go before
        # the bootstrap (GBs at products-like size)
        graph = DynamicGraph.from_data(_snapshot(dataset, seed, holdout)[1])
        return Engine(model.model(), graph, device=device, progress=True,
                      partitions=partitions, placement=placement, workers=mpi_workers)

    from tqdm.auto import tqdm

    bar = tqdm(desc="updates applied", unit="upd", smoothing=0.1, leave=False)
    stopping = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stopping.is_set():  # a second Ctrl-C: leave now (checkpoint and journal hold)
            raise KeyboardInterrupt
        stopping.set()
        bar.write(f"{signal.Signals(signum).name}: stopping at the next batch boundary "
                  "(again to abort)")

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)

    def open_service() -> Service:
        service = Service.open(lambda: Checkpoint.load(checkpoint), start,
                               KafkaTransport(kafka, topics.updates), config,
                               checkpoints, device, mpi_workers,
                               KafkaTransport(kafka, topics.queries), reads)
        if calibration.exists():
            service.engine.executors.calibration = Calibration.load(calibration)
        if not current and not stopping.is_set():  # once a process, before consuming
            _warm_up(service.model.model(), device, partitions if mpi_workers is None else 2,
                     bar.write)
        bar.write(f"serving {topics.updates} -> {topics.labels}, {topics.dead_letters} and "
                  f"{topics.queries} -> {topics.results} at "
                  f"{kafka.bootstrap_servers} (batch {batch_size}, from batch "
                  f"{service.batch_seq + 1}); Ctrl-C stops")
        current["service"] = service
        return service

    current: dict[str, Service] = {}

    def progress(report) -> None:
        stats = current["service"].stats
        bar.update(report.size)
        bar.set_postfix(labels=stats.label_changes, dead=sum(stats.dead_letters.values()),
                        refresh=False)

    server = _http_server(reads, listen, http_token)  # /healthz answers while bootstrapping
    try:
        service = run_recovering(
            open_service, lambda e: bar.write(f"{e}\nrecovering from the last checkpoint"),
            stop=stopping.is_set, idle_exit_s=until_idle, on_batch=progress)
    finally:
        bar.close()
        if server is not None:
            server.stop()
    if stopping.is_set():
        console.print(f"stopped after batch {service.batch_seq}: checkpoint written")
    _print_stats(service.stats)


def _http_server(reads, listen: tuple[str, int] | None, token: str | None):
    """The REST API's server, started (None when ``listen`` is None)."""
    if listen is None:
        return None
    from streamgnn.api.server import HttpServer

    server = HttpServer(reads, *listen, token).start()
    console.print(f"REST API on {server.url} (OpenAPI at {server.url}/docs)")
    return server


def _print_stats(stats, extra: list[tuple[str, str]] = ()) -> None:
    wall = time.perf_counter() - stats.started
    table = Table(title="streaming service")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [("events consumed / applied", f"{stats.events:,} / {stats.applied:,}"),
            ("batches (started before the one before finished)",
             f"{stats.batches:,} ({stats.started_early:,})"),
            ("events/s (while busy)", f"{stats.applied / max(stats.busy_s, 1e-9):,.0f}"),
            ("events/s (first input -> last output)", f"{stats.throughput():,.0f}"),
            ("events/s (wall clock)", f"{stats.applied / max(wall, 1e-9):,.0f}"),
            ("label changes published", f"{stats.label_changes:,}"),
            ("dead letters", ", ".join(f"{k}: {v}" for k, v in
                                       sorted(stats.dead_letters.items())) or "0"),
            ("queries answered / refused", f"{stats.queries['answered']:,} / "
             f"{sum(stats.queries.values()) - stats.queries['answered']:,}")]
    if stats.latency.count:
        rows.append(("latency produce -> publish p50 / p99",
                     f"{stats.latency.percentile(50):.1f} / "
                     f"{stats.latency.percentile(99):.1f} ms"))
    for row in [*rows, *extra]:
        table.add_row(*row)
    console.print(table)


@app.command()
def produce(
    file: Annotated[Path, typer.Argument(help="JSONL, one update per line "
                                         "('-' reads stdin).")],
    rate: Annotated[float | None, typer.Option(help="Updates per second (default: as fast "
                                               "as the broker takes them).")] = None,
    per_message: Annotated[int, typer.Option(
        min=1, help="Updates per Kafka message (a JSON array; 1 sends each alone). "
        "Messages go when full or 20 ms after their first update.")] = 100,
    columns: Annotated[bool, typer.Option(
        "--columns/--json", help="Send each message as columns with the features in "
        "binary (the cheapest for the service to decode) instead of a JSON array.")] = False,
    bootstrap_servers: BootstrapOpt = DEFAULT_BOOTSTRAP,
    kafka_config: KafkaConfigOpt = None,
    topic_prefix: TopicPrefixOpt = "",
) -> None:
    """Send a file of updates to graph-updates, stamping event time where missing; each
    vertex's updates stay in order (one topic partition per source vertex). Lines are
    sent as they are otherwise: the service validates and dead-letters bad ones. Every
    message's acknowledgement is checked: once the broker refuses one (or it expires
    unsent), sending stops and the command exits 1 naming how many updates were not
    taken, the first one (its number among the non-blank lines) and why."""
    import contextlib
    import sys

    from tqdm.auto import tqdm

    from streamgnn.stream.kafka_tools import SendFailed, UpdateSender, ensure_topics

    kafka = _kafka(bootstrap_servers, kafka_config)
    topics = _topics(topic_prefix)
    ensure_topics(kafka, topics.all())
    start = time.perf_counter()
    try:
        with (UpdateSender(kafka, topics.updates, per_message, columns=columns) as out,
              contextlib.nullcontext(sys.stdin.buffer) if str(file) == "-"
              else open(file, "rb") as lines):
            for line in tqdm(lines, desc="producing", unit="upd", leave=False,
                             disable=None):
                if not line.strip():
                    continue
                out.send(line.strip())
                if rate:
                    ahead = out.sent / rate - (time.perf_counter() - start)
                    if ahead > 0:
                        out.idle(ahead)
    except SendFailed as e:
        console.print(f"[red]{e}[/]", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"{out.sent:,} updates -> {topics.updates} in "
                  f"{time.perf_counter() - start:.1f} s")


@app.command()
def calibrate(
    dataset: DatasetOpt = "small",
    model: Annotated[str, typer.Option(help="Model architecture (as for train).")] = "sage-mean",
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", "-c", help="A trained model file instead of --model.")] = None,
    out: CalibrationOpt = DEFAULT_CALIBRATION,
    seed: SeedOpt = 0,
) -> None:
    """Measure where query batches run quicker on cuda than on cpu (exact queries of 1 to
    4,096 new vertices on the dataset) and store the threshold `serve` dispatches by.
    Without a GPU there is one choice: the file says so."""
    from streamgnn.models.zoo import Checkpoint, ModelSpec
    from streamgnn.workers import Engine
    from streamgnn.workers.executors import calibrate as measure

    _, data, _ = _snapshot(dataset, seed, 0.0)
    spec = ModelSpec(model, data.num_features, data.num_classes)
    net = Checkpoint.load(checkpoint).model() if checkpoint else spec.build().eval()
    engine = Engine.from_pyg(net, data, progress=True)
    cal = measure(engine)
    cal.save(out)
    table = Table(title=f"query batches: cpu vs cuda -> {out}")
    for name in ("work (in-edges)", "cpu ms", "cuda ms"):
        table.add_column(name, justify="right")
    for work, cpu_ms, cuda_ms in cal.measured:
        table.add_row(f"{work:,}", f"{cpu_ms:.2f}", "-" if cuda_ms is None else f"{cuda_ms:.2f}")
    console.print(table)
    console.print("no cuda device: every query batch runs on cpu" if len(
        engine.executors.devices) == 1 else f"cuda from {cal.cuda_from} in-edges on"
        if cal.cuda_from is not None else "cuda never won: every query batch runs on cpu")


@app.command()
def query(
    request: Annotated[Path, typer.Argument(help=(
        "JSON query request ('-' reads stdin): {\"vertices\": [{\"id\": 900001, \"x\": "
        "[...]}], \"edges\": [{\"src\": 900001, \"dst\": 17}, {\"src\": 42, \"dst\": "
        "900001, \"weight\": 0.5}]}; optional budget, policy, embeddings."))],
    budget: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="SRPE budget gamma: the share of the query's direct "
        "targets recomputed (0: reuse every stored row). Default: the request's, else "
        "exact.")] = None,
    policy: Annotated[str | None, typer.Option(
        help="SRPE policy: top-ratio (OMEGA's), degree or random.")] = None,
    embeddings: Annotated[bool, typer.Option(
        help="Ask for the output embeddings too (printed as their first values).")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 30.0,
    bootstrap_servers: BootstrapOpt = DEFAULT_BOOTSTRAP,
    kafka_config: KafkaConfigOpt = None,
    topic_prefix: TopicPrefixOpt = "",
) -> None:
    """Send one query to query-requests and print its answer from query-results: each
    new vertex's predicted label from the current embeddings, exact (as if the vertices
    and edges were inserted; nothing is) or by SRPE with --budget. Exit code 1 when the
    service answered with an error (printed with its reason), 2 without an answer."""
    import contextlib
    import sys

    import orjson

    from streamgnn.stream import QueryResult, encode
    from streamgnn.stream.kafka_tools import ensure_topics, request_reply
    from streamgnn.stream.schemas import DecodeError, decode_query

    kafka = _kafka(bootstrap_servers, kafka_config)
    with (contextlib.nullcontext(sys.stdin.buffer) if str(request) == "-"
          else open(request, "rb")) as f:
        raw = f.read()
    try:
        body = orjson.loads(raw)
        overrides = {"budget": budget, "policy": policy, "embeddings": embeddings or None}
        body.update({k: v for k, v in overrides.items() if v is not None})
        req = decode_query(orjson.dumps(body))
    except (orjson.JSONDecodeError, AttributeError, DecodeError) as e:
        raise typer.BadParameter(f"not a query request: {e}") from None
    topics = _topics(topic_prefix)
    ensure_topics(kafka, topics.all())
    wanted = req.event_id.encode()
    reply = request_reply(kafka, topics.queries, encode(req), topics.results,
                          lambda value: wanted in value, timeout)
    if reply is None:
        console.print(f"[red]no answer within {timeout:g} s[/]: is `streamgnn serve` "
                      f"running against {bootstrap_servers}?")
        raise typer.Exit(2)
    res = QueryResult.model_validate_json(reply)
    if res.error is not None:
        console.print(f"[red]{res.error}[/]: {res.reason}", highlight=False)
        raise typer.Exit(1)
    mode = "exact" if res.budget is None else f"SRPE gamma={res.budget:g} ({res.policy})"
    table = Table(title=f"{mode}, state after batch {res.batch}, {res.recomputed} existing "
                        f"vertices recomputed, {res.latency_ms:.1f} ms")
    table.add_column("vertex", justify="right")
    table.add_column("label", justify="right")
    if res.embeddings is not None:
        table.add_column("embedding")
    for i, (v, label) in enumerate(zip(res.ids, res.labels, strict=True)):
        row = [str(v), str(label)]
        if res.embeddings is not None:
            row.append(" ".join(f"{a:.3f}" for a in res.embeddings[i][:6]) + " ...")
        table.add_row(*row)
    console.print(table)


@app.command()
def watch(
    what: Annotated[str, typer.Argument(help="labels, dead-letters or results")] = "labels",
    from_beginning: Annotated[bool, typer.Option(help="Replay the topic first.")] = False,
    idle: Annotated[float | None, typer.Option(help="Exit after this many quiet "
                                               "seconds.")] = None,
    bootstrap_servers: BootstrapOpt = DEFAULT_BOOTSTRAP,
    kafka_config: KafkaConfigOpt = None,
    topic_prefix: TopicPrefixOpt = "",
) -> None:
    """Print label changes (or dead letters, or query results) as they are published."""
    import json

    from streamgnn.stream.kafka_tools import follow

    kafka = _kafka(bootstrap_servers, kafka_config)
    topics = _topics(topic_prefix)
    names = {"labels": topics.labels, "dead-letters": topics.dead_letters,
             "results": topics.results}
    if what not in names:
        raise typer.BadParameter(f"{what!r}: choose labels, dead-letters or results")
    try:
        for record in follow(kafka, names[what], from_beginning, idle):
            m = json.loads(record.value)
            if what == "labels":
                for c in m["changes"]:
                    console.print(f"batch {m['batch']:>6}  vertex {c['vertex']:>9}  "
                                  f"{c.get('old', '-')!s:>3} -> {c['new']}", highlight=False)
            elif what == "dead-letters":
                at = "" if m.get("index") is None else f"[{m['index']}]"
                console.print(f"[red]{m['error']}[/] offset {m['partition']}:{m['offset']}{at}"
                              f"  {m['reason']}", highlight=False)
            else:
                console.print(m, highlight=False)
    except KeyboardInterrupt:
        pass


# ---------------------------------------------------------------- replay
replay_app = typer.Typer(
    help="LinkBench-style traces: generate one, replay it open-loop against a running "
    "service (writes and queries to Kafka, reads to REST), and report latencies measured "
    "from each op's intended send time.", no_args_is_help=True)
app.add_typer(replay_app, name="replay")


@replay_app.command("generate")
def replay_generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Trace file to write (JSONL).")],
    dataset: DatasetOpt = "arxiv-like",
    ops: Annotated[int, typer.Option(min=1, help="Number of ops.")] = 100_000,
    read_fraction: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of reads: getnode, getlinklist, countlink in "
        "LinkBench's proportions, sent to the REST API.")] = 0.0,
    query_fraction: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of query arrivals (a new vertex with 1-4 edges to "
        "existing ones) sent to query-requests. The rest are writes in LinkBench's mix; "
        "the held-out part of the dataset streams in as the adds.")] = 0.0,
    arrivals: Annotated[str, typer.Option(
        help="Intended send times: constant (i / rate) or poisson.")] = "constant",
    rate: Annotated[float, typer.Option(
        min=0.0, help="Ops/s the times are laid out for (`replay run "
        "--rate` rescales them).")] = 1000.0,
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
) -> None:
    """Write a LinkBench-style trace for a dataset: one op per line with its intended send
    time, valid against the snapshot `streamgnn serve` starts from with the same
    --dataset, --holdout and --seed."""
    from streamgnn.replay.generate import generate_trace

    try:
        counts = generate_trace(out, dataset, ops, read_fraction, query_fraction,
                                arrivals, rate, holdout, seed, progress=True)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    console.print(f"{sum(counts.values()):,} ops -> {out}: " + ", ".join(
        f"{k} {v:,}" for k, v in sorted(counts.items())), highlight=False)


@replay_app.command("run")
def replay_run(
    trace: Annotated[Path, typer.Argument(help=(
        "A trace from `replay generate`, or a CSV/TSV edge-event file (.csv/.tsv): "
        "columns time, op, src, dst[, weight]; ops add, delete, update; times in seconds."))],
    rate: Annotated[float | None, typer.Option(
        min=0.0, help="Ops/s to offer (default: the trace's own).")] = None,
    pacing: Annotated[str, typer.Option(
        help="trace: the trace's own gaps (Poisson or recorded) scaled to --rate; "
        "constant: exactly 1 / rate apart.")] = "trace",
    duration: Annotated[float | None, typer.Option(
        min=0.0, help="Stop sending after this many seconds.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Report directory (default runs/replay-TIME).")] = None,
    http: Annotated[str, typer.Option(
        "--http", envvar="STREAMGNN_HTTP_URL", help="Base URL of the service's REST API "
        "(reads go there).")] = "http://127.0.0.1:8080",
    http_token: Annotated[str | None, typer.Option(
        "--http-token", envvar="STREAMGNN_HTTP_TOKEN", help="Bearer token for the REST "
        "API.")] = None,
    read_workers: Annotated[int, typer.Option(min=1, help="Threads sending reads.")] = 8,
    drain: Annotated[float, typer.Option(
        min=0.0, help="Seconds to wait at the end for answers still in flight.")] = 30.0,
    lag_limit: Annotated[float, typer.Option(
        min=0.0, help="The rate did not hold if the sender fell this many "
        "seconds behind, or this many seconds of ops were in flight when it stopped.")] = 1.0,
    bootstrap_servers: BootstrapOpt = DEFAULT_BOOTSTRAP,
    kafka_config: KafkaConfigOpt = None,
    topic_prefix: TopicPrefixOpt = "",
) -> None:
    """Replay a trace open-loop at --rate ops/s against a running `streamgnn serve`:
    writes to graph-updates, queries to query-requests, reads to the REST API. Every
    latency runs from the op's intended send time (no coordinated omission), including
    write-to-visible (until the label change of the update's batch is seen) and queries
    (until their result). Writes a report directory: report.json and PNG plots."""
    import threading

    from tqdm.auto import tqdm

    from streamgnn.replay.report import write_report
    from streamgnn.replay.runner import RunSettings, run_replay, schedule_for
    from streamgnn.replay.trace import TraceError, open_trace
    from streamgnn.stream.kafka_tools import ensure_topics

    topics = _topics(topic_prefix)
    kafka = _kafka(bootstrap_servers, kafka_config)
    settings = RunSettings(str(trace), rate, pacing, duration, kafka, topics,
                           http, http_token, read_workers, drain, lag_limit_s=lag_limit)
    try:
        opened = open_trace(trace)
        schedule = schedule_for(opened, settings)
        ensure_topics(kafka, topics.all())
    except (TraceError, ValueError, ConnectionError) as e:
        console.print(f"[red]{e}[/]", highlight=False)
        raise typer.Exit(2) from None
    total = opened.header.get("ops")
    if duration is not None and total:
        total = min(total, int(duration * schedule.rate) + 1)
    folder = out or Path("runs") / time.strftime("replay-%Y%m%d-%H%M%S")
    console.print(f"replaying {trace} at {schedule.rate:,.0f} ops/s ({schedule.pacing}) -> "
                  f"{topics.updates}, {topics.queries}, {http}")
    stop = threading.Event()
    with tqdm(total=total, desc="replay", unit="op", disable=None, smoothing=0.1) as bar:
        def tick(stats, in_flight) -> None:
            bar.update(stats.sent - bar.n)
            bar.set_postfix(late=f"{stats.max_late_s:.2f}s", **in_flight, refresh=False)

        try:
            report = run_replay(opened, settings, tick, stop)
        except TraceError as e:
            console.print(f"[red]{e}[/]", highlight=False)
            raise typer.Exit(2) from None
    write_report(folder, report)
    _print_replay(report, folder)


@replay_app.command("report")
def replay_report(
    folder: Annotated[Path, typer.Argument(help="A report directory of `replay run`.")],
) -> None:
    """Re-render a replay's plots from its report.json and print its summary."""
    from streamgnn.replay.report import load_report, render_plots

    try:
        report = load_report(folder)
    except (FileNotFoundError, ValueError) as e:
        console.print(f"[red]{e}[/]", highlight=False)
        raise typer.Exit(2) from None
    render_plots(folder if folder.is_dir() else folder.parent, report)
    _print_replay(report, folder)


def _print_replay(report: dict, folder: Path) -> None:
    from streamgnn.replay.report import PLOTS, summary_rows

    table = Table(title="replay")
    table.add_column("measure")
    table.add_column("value")
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    lat = Table(title="latency from intended send time (ms)")
    for col in ("op", "count", "p50", "p90", "p99", "p99.9", "max"):
        lat.add_column(col, justify="left" if col == "op" else "right")
    for measure, p in report["latency_ms"].items():
        lat.add_row(measure, f"{p['count']:,}",
                    *(f"{p[k]:,.1f}" for k in ("p50", "p90", "p99", "p99.9", "max")))
    console.print(lat)
    if not report["rate"]["held"]:
        console.print("[bold red]the offered rate did not hold:[/] "
                      + "; ".join(report["rate"]["not_held_because"]), highlight=False)
    console.print(f"report: {folder}/report.json, plots: {', '.join(PLOTS)}")


if __name__ == "__main__":
    app()
