"""The ``streamgnn`` command: datasets, training, bootstrap, the embedded broker, the
streaming service and its producer/watch tools, and the demo.

Owns argument parsing and terminal output only, with `options` (the option types and
output helpers its commands share) and `replay.commands` (the `replay` commands); the work
lives in the other modules (`serve`'s settings in `settings`, the service it assembles in
`serving`, its MPI supervisor in `workers.supervisor`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from streamgnn.errors import UserError
from streamgnn.options import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_BROKER_DIR,
    DEFAULT_CALIBRATION,
    BootstrapOpt,
    BrokerDirOpt,
    BrokerPortOpt,
    CalibrationOpt,
    DatasetOpt,
    DeviceOpt,
    HoldoutOpt,
    KafkaConfigOpt,
    PlacementOpt,
    SeedOpt,
    TopicPrefixOpt,
    console,
    kafka_settings,
    print_table,
    setting,
    topic_names,
)
from streamgnn.progress import DEFAULT_PERIOD_S, PERIOD_ENV, Progress, track
from streamgnn.replay.commands import replay_app
from streamgnn.settings import SERVE, ServeSettings
from streamgnn.stream.transport import OffsetReset


class _Command(typer.Typer):
    """The ``streamgnn`` command (its entry point): a `UserError` out of any subcommand is
    printed as ``error:`` and ``hint:`` lines on stderr, after its traceback only with
    --debug, and the command exits 2."""

    debug = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except UserError as e:
            if self.debug:
                import traceback

                traceback.print_exc()
            print(f"error: {e.message}", file=sys.stderr)
            if e.hint:
                print(f"hint: {e.hint}", file=sys.stderr)
            sys.exit(2)


app = _Command(
    help="streamgnn: exact, incremental GNN inference over a streaming graph.\n\n"
    "Typical flow: `streamgnn broker start` (or point --bootstrap-servers at Kafka), "
    "`streamgnn train` a model on a dataset's snapshot, `streamgnn serve` it, send updates "
    "with `streamgnn produce updates.jsonl`, follow `streamgnn watch labels` and label "
    "new vertices with `streamgnn query request.json`. "
    "`streamgnn demo` runs the whole flow on a synthetic graph.",
    no_args_is_help=True, rich_markup_mode="markdown", pretty_exceptions_show_locals=False)
datasets_app = typer.Typer(help="Generate and inspect graphs.", no_args_is_help=True,
                           rich_markup_mode="markdown")
app.add_typer(datasets_app, name="datasets")
broker_app = typer.Typer(help="The embedded Kafka-compatible broker (Tansu, in memory).",
                         no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(broker_app, name="broker")


@app.callback()
def _global_options(debug: Annotated[bool, typer.Option(
        "--debug", envvar="STREAMGNN_DEBUG",
        help="Also print the traceback of a mistake such as a missing file or no broker "
             "(the error and what to do about it are printed either way).")] = False,
                    progress_seconds: Annotated[float, typer.Option(
        "--progress-seconds", envvar=PERIOD_ENV, min=0.01,
        help="Seconds between the progress lines of long work (serve, produce, replay "
             "run, train, ...) when the output is not a terminal, such as a log file or a "
             "pipe; a terminal shows progress bars instead.")] = DEFAULT_PERIOD_S,
                    ) -> None:
    app.debug = debug
    os.environ[PERIOD_ENV] = str(progress_seconds)  # for this process and its children


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
    from streamgnn.stream import encode

    _, _, events = _snapshot(dataset, seed, holdout)
    with open(out, "wb") as f:
        for u in track(events, "writing", "update"):
            f.write(encode(u) + b"\n")
    console.print(f"{len(events):,} updates -> {out}")


@datasets_app.command("info")
def datasets_info(dataset: DatasetOpt = "tiny", seed: SeedOpt = 0) -> None:
    """Print size, degree skew and label balance of a dataset."""
    import numpy as np

    from streamgnn.datasets import open_dataset

    data = open_dataset(dataset, seed)
    indeg = np.bincount(data.positions(data.dst), minlength=data.num_vertices)
    rows = [("mean in-degree", f"{indeg.mean():.2f}"),
            ("max in-degree", f"{indeg.max():,}"),
            ("p99 in-degree", f"{np.percentile(indeg, 99):.0f}"),
            ("vertices with no in-edge", f"{(indeg == 0).mean():.1%}")]
    if data.y is not None:
        share = np.bincount(data.y) / len(data.y)
        rows += [("classes", f"{len(share)}"), ("largest class", f"{share.max():.1%}"),
                 ("smallest class", f"{share.min():.1%}")]
    table = Table(title=str(data))
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    print_table(table)


@datasets_app.command("partition")
def datasets_partition(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write map.npz and "
                                      "part-0.npz, part-1.npz ... into (created if need "
                                      "be).")],
    parts: Annotated[int, typer.Option("--parts", help="Number of partitions P (1 to 64).")
                     ] = 4,
    placement: PlacementOpt = SERVE.placement,
    dataset: DatasetOpt = SERVE.dataset,
    holdout: HoldoutOpt = 0.0,
    seed: SeedOpt = 0,
) -> None:
    """Split a dataset into P partition files, one per partition, by the initial owners
    `serve --partitions P --placement ...` gives it: each part file holds its vertices
    (ids, features, labels) and the edges into them; map.npz holds every vertex's
    partition."""
    from streamgnn.workers.partition_files import (
        check_request,
        make_folder,
        owners,
        write_partitions,
    )

    check_request(parts, placement)  # (before the dataset loads)
    make_folder(out)
    _, data, _ = _snapshot(dataset, seed, holdout)
    t = time.perf_counter()
    owner = owners(data, parts, placement)
    console.print(f"placed by {placement} in {time.perf_counter() - t:.1f} s")
    summary = write_partitions(data, owner, parts, placement, out)
    table = Table(title=f"{data.name}: {parts} partitions by {placement} -> {out}")
    for col in ("partition", "vertices", "edges", "ghosts"):
        table.add_column(col, justify="right")
    for p in range(parts):
        table.add_row(str(p), *(f"{int(a[p]):,}" for a in (
            summary.vertices, summary.edges, summary.ghosts)))
    print_table(table)
    console.print(f"edge cut {summary.cut:.1%} of {data.num_edges:,} edges; balance "
                  f"{summary.balance:.3f} (largest partition / mean)")


@app.command()
def train(
    dataset: DatasetOpt = "arxiv-like",
    model: Annotated[str, typer.Option("--model", "-m", help="gcn, sage-mean, sage-sum, "
                                       "sage-max, sage-min, graphconv-sum, graphconv-mean, "
                                       "graphconv-max, graphconv-min, gin, gat")] = "sage-mean",
    hidden: Annotated[int, typer.Option(help="Hidden width.")] = 128,
    layers: Annotated[int, typer.Option(help="Number of GNN layers.")] = 2,
    epochs: Annotated[int, typer.Option(help="Full-batch training epochs.")] = 100,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the model file.")] = Path(
        "artifacts/model.pt"),
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
) -> None:
    """Train a model on the dataset's snapshot, next to an MLP baseline; save a checkpoint."""
    _train(dataset, model, hidden, layers, epochs, out, holdout, seed)


def _train(dataset, model, hidden, layers, epochs, out, holdout, seed):
    from streamgnn.models.train import train as fit
    from streamgnn.models.zoo import ModelSpec, check_model_name

    check_model_name(model)  # before the dataset loads
    full, data, events = _snapshot(dataset, seed, holdout)
    spec = ModelSpec(model, data.num_features, data.num_classes, hidden, layers)
    result = fit(data, spec, epochs=epochs, seed=seed)
    table = Table(title=f"{model} on {data.name} ({epochs} epochs, {result.seconds:.1f} s)")
    for col in ("model", "train", "val", "test"):
        table.add_column(col, justify="right")
    for name, acc in ((model, result.gnn), ("MLP (same features)", result.mlp)):
        table.add_row(name, f"{acc.train:.3f}", f"{acc.val:.3f}", f"{acc.test:.3f}")
    print_table(table)
    console.print(f"model file -> {result.model_file.save(out)}")
    return full, data, events, result


@app.command()
def bootstrap(
    checkpoint: Annotated[Path, typer.Option(
        "--checkpoint", "-c", help="The model file, from `train`.")] = Path(
        "artifacts/model.pt"),
    dataset: DatasetOpt = "arxiv-like",
    holdout: HoldoutOpt = 0.2,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """Compute every layer's embedding of every vertex (layer-wise full inference) and
    compare its time with PyG's own forward pass."""
    from streamgnn.models.zoo import ModelFile

    trained = ModelFile.load(checkpoint)
    _, data, _ = _snapshot(dataset, seed, holdout)
    _bootstrap(data, trained.model_for(data, dataset), device)


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
    print_table(table)


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
    kafka = kafka_settings(broker.bootstrap, kafka_config)
    out = Path("artifacts") / f"{model}-{dataset}.pt"
    full, data, events, result = _train(dataset, model, 128, 2, epochs, out, 0.2, seed)
    _bootstrap(data, result.model_file.model(), device)
    summary = run_demo(broker, kafka, full, data, events, result.model_file, batch_size,
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
    checkpoint: Annotated[Path, setting("checkpoint", "--checkpoint", "-c")
                          ] = SERVE.checkpoint,
    dataset: DatasetOpt = SERVE.dataset,
    holdout: HoldoutOpt = SERVE.holdout,
    seed: SeedOpt = SERVE.seed,
    state_dir: Annotated[Path, setting("state_dir", "--state-dir",
                                        envvar="STREAMGNN_STATE_DIR")] = SERVE.state_dir,
    rebuild_state: Annotated[bool, setting("rebuild_state", "--rebuild-state",
                                            envvar="STREAMGNN_REBUILD_STATE")
                             ] = SERVE.rebuild_state,
    batch_size: Annotated[int, setting("batch_size", "--batch-size", "--bs",
                                        envvar="STREAMGNN_BATCH_SIZE")] = SERVE.batch_size,
    max_wait_s: Annotated[float, setting("max_wait_s", "--max-wait")] = SERVE.max_wait_s,
    arrival_wait_s: Annotated[float, setting("arrival_wait_s", "--arrival-wait")
                              ] = SERVE.arrival_wait_s,
    checkpoint_batches: Annotated[int, setting("checkpoint_batches", "--checkpoint-every")
                                  ] = SERVE.checkpoint_batches,
    checkpoint_s: Annotated[float, setting("checkpoint_s", "--checkpoint-seconds")
                            ] = SERVE.checkpoint_s,
    partitions: Annotated[int, setting("partitions", "--partitions",
                                        envvar="STREAMGNN_PARTITIONS")] = SERVE.partitions,
    placement: PlacementOpt = SERVE.placement,
    partitions_from: Annotated[Path | None, setting("partitions_from", "--partitions-from")
                               ] = SERVE.partitions_from,
    until_idle: Annotated[float | None, setting("until_idle", "--until-idle")
                          ] = SERVE.until_idle,
    max_abs_feature: Annotated[float, setting("max_abs_feature", "--max-abs-feature",
                                               envvar="STREAMGNN_MAX_ABS_FEATURE")
                               ] = SERVE.max_abs_feature,
    max_abs_weight: Annotated[float, setting("max_abs_weight", "--max-abs-weight",
                                              envvar="STREAMGNN_MAX_ABS_WEIGHT")
                              ] = SERVE.max_abs_weight,
    quarantine_after: Annotated[int, setting("quarantine_after", "--quarantine-after",
                                              envvar="STREAMGNN_QUARANTINE_AFTER")
                                ] = SERVE.quarantine_after,
    workers: Annotated[int, setting("workers", "--workers", envvar="STREAMGNN_WORKERS")
                       ] = SERVE.workers,
    max_restarts: Annotated[int, setting("max_restarts", "--max-restarts",
                                          envvar="STREAMGNN_MAX_RESTARTS")
                            ] = SERVE.max_restarts,
    bootstrap_servers: BootstrapOpt = SERVE.bootstrap_servers,
    kafka_config: KafkaConfigOpt = SERVE.kafka_config,
    topic_prefix: TopicPrefixOpt = SERVE.topic_prefix,
    offset_reset: Annotated[OffsetReset, setting(
        "offset_reset", "--offset-reset", envvar="STREAMGNN_OFFSET_RESET")
    ] = SERVE.offset_reset,
    device: DeviceOpt = SERVE.device,
    calibration: CalibrationOpt = SERVE.calibration,
    http: Annotated[str, setting("http", "--http", envvar="STREAMGNN_HTTP")] = SERVE.http,
    http_token: Annotated[str | None, setting("http_token", "--http-token",
                                               envvar="STREAMGNN_HTTP_TOKEN")
                          ] = SERVE.http_token,
    torch_threads: Annotated[int | None, setting("torch_threads", "--torch-threads",
                                                  envvar="STREAMGNN_TORCH_THREADS", min=0)
                             ] = SERVE.torch_threads,
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
    settings = _serve_settings(locals())  # (every parameter is named as its setting)

    from streamgnn.api.bind import parse_bind
    from streamgnn.workers.supervisor import (
        MPI_JOB,
        in_mpi_job,
        rank_files,
        serve_rank,
        supervise,
    )

    kafka = kafka_settings(bootstrap_servers, kafka_config)
    try:
        listen = parse_bind(http, http_token)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--http") from None
    if not in_mpi_job():  # (before torch loads: no broker, a quick answer)
        from streamgnn.stream.kafka_tools import wait_for_broker

        wait_for_broker(kafka)
    if workers and os.environ.get(MPI_JOB) != "1":
        raise typer.Exit(supervise(workers, max_restarts, rank_files(state_dir), console))
    from streamgnn.serving import serve as serve_stream
    from streamgnn.serving import set_torch_threads

    set_torch_threads(torch_threads)

    def run(mpi_workers) -> None:
        service, stopped = serve_stream(
            settings, kafka, listen, lambda: _snapshot(dataset, seed, holdout)[1], console,
            mpi_workers)
        if stopped:
            console.print(f"stopped after batch {service.batch_seq}: checkpoint written")
        _print_stats(service.stats)

    serve_rank(settings, run)


def _serve_settings(given: dict[str, Any]) -> ServeSettings:
    """`serve`'s parameters as its settings; a `UserError` naming those out of range."""
    import pydantic

    try:
        return ServeSettings(**given)
    except pydantic.ValidationError as e:
        command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
        flags = {p.name: p.opts[0] for p in command.params}
        raise UserError("; ".join(
            f"{flags.get(str(err['loc'][0]), err['loc'][0]) if err['loc'] else 'serve'}: "
            f"{err['msg'].lower()} (got {err['input']!r})" for err in e.errors()),
            "see `streamgnn serve --help`") from None


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
    print_table(table)


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
    from streamgnn.stream.kafka_tools import SendFailed, UpdateSender, ensure_topics

    kafka = kafka_settings(bootstrap_servers, kafka_config)
    topics = topic_names(topic_prefix)
    source = _open_input(file, "updates file", "`streamgnn datasets holdout DATASET -o "
                         f"{file}` writes one (one JSON update per line)")
    ensure_topics(kafka, topics.all())
    start = time.perf_counter()
    try:
        with (UpdateSender(kafka, topics.updates, per_message, columns=columns) as out,
              source as lines, Progress("producing", "upd", _count_updates(file)) as bar):
            for line in lines:
                if not line.strip():
                    continue
                out.send(line.strip())
                bar.update()
                if rate:
                    ahead = out.sent / rate - (time.perf_counter() - start)
                    if ahead > 0:
                        out.idle(ahead)
    except SendFailed as e:
        console.print(f"[red]{e}[/]", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"{out.sent:,} updates -> {topics.updates} in "
                  f"{time.perf_counter() - start:.1f} s")


def _count_updates(path: Path) -> int | None:
    """The non-blank lines of the file ``path`` (None for stdin or a pipe)."""
    if str(path) == "-" or not path.is_file():
        return None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _open_input(path: Path, what: str, make: str):
    """``path`` opened to read bytes from ('-': stdin); a `UserError` naming it as
    ``what``, with ``make`` (how to write one) as the hint, where it cannot be."""
    import contextlib

    if str(path) == "-":
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read the {what} {path}: {e.strerror}", make) from None


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
    from streamgnn.models.zoo import ModelFile, ModelSpec
    from streamgnn.workers import Engine
    from streamgnn.workers.executors import calibrate as measure

    _, data, _ = _snapshot(dataset, seed, 0.0)
    net = (ModelFile.load(checkpoint).model_for(data, dataset) if checkpoint else
           ModelSpec(model, data.num_features, data.num_classes).build().eval())
    engine = Engine.from_pyg(net, data, progress=True)
    cal = measure(engine)
    cal.save(out)
    table = Table(title=f"query batches: cpu vs cuda -> {out}")
    for name in ("work (in-edges)", "cpu ms", "cuda ms"):
        table.add_column(name, justify="right")
    for work, cpu_ms, cuda_ms in cal.measured:
        table.add_row(f"{work:,}", f"{cpu_ms:.2f}", "-" if cuda_ms is None else f"{cuda_ms:.2f}")
    print_table(table)
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
    import orjson

    from streamgnn.stream import QueryResult, encode
    from streamgnn.stream.kafka_tools import ensure_topics, request_reply
    from streamgnn.stream.schemas import DecodeError, decode_query

    kafka = kafka_settings(bootstrap_servers, kafka_config)
    make = ('write one as {"vertices": [{"id": 900001, "x": [...]}], "edges": [{"src": '
            '900001, "dst": 17}]} (`streamgnn query --help` has the fields)')
    with _open_input(request, "query request file", make) as f:
        raw = f.read()
    try:
        body = orjson.loads(raw)
        overrides = {"budget": budget, "policy": policy, "embeddings": embeddings or None}
        body.update({k: v for k, v in overrides.items() if v is not None})
        req = decode_query(orjson.dumps(body))
    except (orjson.JSONDecodeError, AttributeError, DecodeError) as e:
        why = "not a JSON object" if isinstance(e, AttributeError) else e
        raise UserError(f"{request} is not a query request: {why}", make) from None
    topics = topic_names(topic_prefix)
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
    print_table(table)


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

    kafka = kafka_settings(bootstrap_servers, kafka_config)
    topics = topic_names(topic_prefix)
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


app.add_typer(replay_app, name="replay")


if __name__ == "__main__":
    app()
