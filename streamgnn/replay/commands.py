"""The ``streamgnn replay`` commands: generate a LinkBench-style trace, replay it open-loop
against a running service, and report its latencies."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streamgnn.errors import UserError
from streamgnn.options import (
    DEFAULT_BOOTSTRAP,
    BootstrapOpt,
    DatasetOpt,
    HoldoutOpt,
    KafkaConfigOpt,
    SeedOpt,
    TopicPrefixOpt,
    console,
    kafka_settings,
    print_table,
    topic_names,
)
from streamgnn.progress import Progress

replay_app = typer.Typer(
    help="LinkBench-style traces: generate one, replay it open-loop against a running "
    "service (writes and queries to Kafka, reads to REST), and report latencies measured "
    "from each op's intended send time.", no_args_is_help=True, rich_markup_mode="markdown")


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
    except UserError:  # (an unknown dataset ...: printed as such)
        raise
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

    from streamgnn.replay.report import write_report
    from streamgnn.replay.runner import RunSettings, run_replay, schedule_for
    from streamgnn.replay.trace import TraceError, open_trace
    from streamgnn.stream.kafka_tools import ensure_topics

    topics = topic_names(topic_prefix)
    kafka = kafka_settings(bootstrap_servers, kafka_config)
    settings = RunSettings(str(trace), rate, pacing, duration, kafka, topics,
                           http, http_token, read_workers, drain, lag_limit_s=lag_limit)
    make = ("`streamgnn replay generate --out FILE` writes a trace; an edge-event file "
            "is .csv/.tsv with columns time, op, src, dst[, weight]")
    try:
        opened = open_trace(trace)
    except TraceError as e:
        raise UserError(str(e), make) from None
    try:
        schedule = schedule_for(opened, settings)
    except ValueError as e:
        raise UserError(str(e), "see `streamgnn replay run --help` (--rate, --pacing)"
                        ) from None
    ensure_topics(kafka, topics.all())
    total = opened.header.get("ops")
    if duration is not None and total:
        total = min(total, int(duration * schedule.rate) + 1)
    folder = out or Path("runs") / time.strftime("replay-%Y%m%d-%H%M%S")
    console.print(f"replaying {trace} at {schedule.rate:,.0f} ops/s ({schedule.pacing}) -> "
                  f"{topics.updates}, {topics.queries}, {http}")
    stop = threading.Event()
    with Progress("replay", "op", total) as bar:
        def tick(stats, in_flight) -> None:
            bar.set(stats.sent, late=f"{stats.max_late_s:.2f}s", **in_flight)

        try:
            report = run_replay(opened, settings, tick, stop)
        except TraceError as e:
            raise UserError(str(e), make) from None
        bar.set(report["counts"]["sent"], **bar.postfix)  # the summary's count
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
    print_table(table)
    lat = Table(title="latency from intended send time (ms)")
    for col in ("op", "count", "p50", "p90", "p99", "p99.9", "max"):
        lat.add_column(col, justify="left" if col == "op" else "right")
    for measure, p in report["latency_ms"].items():
        lat.add_row(measure, f"{p['count']:,}",
                    *(f"{p[k]:,.1f}" for k in ("p50", "p90", "p99", "p99.9", "max")))
    print_table(lat)
    if not report["rate"]["held"]:
        console.print("[bold red]the offered rate did not hold:[/] "
                      + "; ".join(report["rate"]["not_held_because"]), highlight=False)
    console.print(f"report: {folder}/report.json, plots: {', '.join(PLOTS)}")
