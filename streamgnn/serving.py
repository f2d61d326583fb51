"""The streaming service assembled from its `ServeSettings` (`serve`): the model and the
engine bootstrapped from the dataset's snapshot (or from partition files, each partition
from its own), the Kafka transports, the REST server, signals that stop it at a batch
boundary, progress lines, and reopening it from its checkpoint when the engine fails."""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from streamgnn.errors import InputError, UserError
from streamgnn.progress import Progress

if TYPE_CHECKING:
    from rich.console import Console

    from streamgnn.api.server import HttpServer
    from streamgnn.datasets import GraphData
    from streamgnn.models.zoo import ModelFile
    from streamgnn.router import Service
    from streamgnn.router.reads import Reads
    from streamgnn.settings import ServeSettings
    from streamgnn.stream.kafka_config import KafkaConfig
    from streamgnn.workers.engine import Engine
    from streamgnn.workers.local import Workers


def set_torch_threads(threads: int | None) -> None:
    """`serve --torch-threads`: None takes OMP_NUM_THREADS, else 1; 0 keeps torch's own."""
    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    if threads:
        import torch

        torch.set_num_threads(threads)


def serve(settings: ServeSettings, kafka: KafkaConfig, listen: tuple[str, int] | None,
          snapshot: Callable[[], GraphData], console: Console,
          workers: Workers | None = None) -> tuple[Service, bool]:
    """Serve the stream in this process (rank 0 of an MPI job when ``workers`` is given;
    their partitions then), with the REST API on ``listen`` (host, port) unless it is
    None, until idle or stopped by a signal. ``snapshot``: the graph to bootstrap from
    when no checkpoint holds one. Returns the service that finished and whether a signal
    stopped it."""
    from streamgnn.allocator import keep_freed_memory
    from streamgnn.graph import DynamicGraph
    from streamgnn.models.zoo import ModelFile
    from streamgnn.router import Checkpoints, Service, run_recovering
    from streamgnn.router.reads import Reads
    from streamgnn.stream.kafka import KafkaTransport
    from streamgnn.stream.kafka_tools import ensure_topics
    from streamgnn.workers import Engine
    from streamgnn.workers.executors import Calibration

    keep_freed_memory()
    topics = settings.topics
    folder = settings.partitions_from
    partitions = settings.partitions if workers is None else workers.size
    if folder is not None and workers is None:
        from streamgnn.workers.partition_files import partitions_in

        partitions = partitions_in(folder)
    ensure_topics(kafka, topics.all())
    reads = Reads()
    # MPI workers keep their own files of each generation in their own --state-dir
    checkpoints = Checkpoints(settings.state_dir, copies=workers)
    if checkpoints.generations():
        console.print("resuming from the newest checkpoint in "
                      f"{settings.state_dir} that verifies")

    def start(model: ModelFile) -> Engine:
        if folder is not None:  # each partition from its own file: no dataset here
            return _from_partitions(model, folder, settings.device, workers)
        # the snapshot's graph alone: the whole dataset and the held-out part go before
        # the bootstrap (GBs at products-like size)
        data = snapshot()
        return Engine(model.model_for(data, settings.dataset), DynamicGraph.from_data(data),
                      device=settings.device, progress=True, partitions=partitions,
                      placement=settings.placement, workers=workers)

    bar = Progress("updates applied", "upd")
    stopping = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stopping.is_set():  # a second Ctrl-C: leave now (checkpoint and journal hold)
            raise KeyboardInterrupt
        stopping.set()
        bar.write(f"{signal.Signals(signum).name}: stopping at the next batch boundary "
                  "(again to abort)")

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)

    @functools.cache
    def model_file() -> ModelFile:  # read once: to bootstrap from, or to check
        return ModelFile.load(settings.checkpoint)

    def open_service() -> Service:
        service = Service.open(
            model_file, start,
            KafkaTransport(kafka, topics.updates, reset=settings.offset_reset), settings,
            checkpoints, settings.device, workers,
            KafkaTransport(kafka, topics.queries, reset=settings.offset_reset), reads,
            settings.rebuild_state)
        _check_model(service.model, model_file, settings)
        if settings.calibration.exists():
            service.engine.executors.calibration = Calibration.load(settings.calibration)
        if not current and not stopping.is_set():  # once a process, before consuming
            _warm_up(service.model.model(), settings.device,
                    partitions if workers is None else 2, bar.write)
        bar.write(f"serving {topics.updates} -> {topics.labels}, {topics.dead_letters} and "
                  f"{topics.queries} -> {topics.results} at "
                  f"{kafka.bootstrap_servers} (batch {settings.batch_size}, from batch "
                  f"{service.batch_seq + 1}); Ctrl-C stops")
        bar.reset()  # the rate from here: the new service counts from 0
        current["service"] = service
        return service

    current: dict[str, Service] = {}

    def show(stats) -> None:  # the counts of the summary the command ends with
        bar.set(stats.applied, labels=stats.label_changes,
                dead=sum(stats.dead_letters.values()))

    # /healthz answers while bootstrapping
    server = _http_server(reads, listen, settings.http_token, console)
    try:
        service = run_recovering(
            open_service, lambda e: bar.write(f"{e}\nrecovering from the last checkpoint"),
            stop=stopping.is_set, idle_exit_s=settings.until_idle,
            on_batch=lambda _: show(current["service"].stats))
        show(service.stats)  # with what came after the last batch (dead letters)
    finally:
        bar.close()
        if server is not None:
            server.stop()
    return service, stopping.is_set()


def _from_partitions(model: ModelFile, folder: Path, device: str, workers: Workers | None
                     ) -> Engine:
    """The engine bootstrapped from the partition files in ``folder``
    (`Engine.from_partitions`); `InputError` for a model of another feature width, or a
    folder of another partition count than the workers'."""
    from streamgnn.workers import Engine
    from streamgnn.workers.partition_files import partitions_in, sizes

    parts = partitions_in(folder)
    if workers is not None and workers.size != parts:
        raise InputError(f"--partitions-from {folder} holds {parts} partitions, not one per "
                         f"worker ({workers.size})", f"serve it with --workers {parts}")
    width, _ = sizes(folder, parts)
    if model.spec.in_dim != width:
        raise InputError(f"the model takes {model.spec.in_dim} features per vertex, the "
                         f"partition files in {folder} have {width}",
                         "use the model trained on the dataset the folder was written from")
    return Engine.from_partitions(model.model(), folder, device, progress=True,
                                  workers=workers)


def _check_model(served: ModelFile, model_file: Callable[[], ModelFile],
                 settings: ServeSettings) -> None:
    """Refuse a --checkpoint (when its file exists) that is another model than the one the
    state directory's service holds: it would be ignored, and the state served as it is."""
    if settings.checkpoint.exists() and (given := model_file()) is not served and (
            not served.same_model(given)):
        differ = (f"{_about(served)} there, {_about(given)} here"
                  if served.spec != given.spec else "the same architecture, other weights")
        raise InputError(
            f"the state in {settings.state_dir} serves another model than "
            f"--checkpoint {settings.checkpoint} ({differ})",
            "serve it with the model it was started with, or start this one with a fresh "
            "--state-dir (STREAMGNN_STATE_DIR)")


def _about(model: ModelFile) -> str:
    spec = model.spec
    return (f"{spec.name}, {spec.num_layers} layers of {spec.hidden}, "
            f"{spec.in_dim} -> {spec.out_dim}" + (f", trained on {model.dataset}"
                                                  if model.dataset else ""))


def _warm_up(model, device: str, partitions: int, say: Callable[[str], None]) -> None:
    """Compile the engine's kernels before the first batch (`warm_up_if_possible`)."""
    from streamgnn.workers.warm_up import WARMING_UP, warm_up_if_possible

    say(WARMING_UP)
    if (seconds := warm_up_if_possible(model, device, partitions)) is not None:
        say(f"kernels ready in {seconds:.1f} s")


def _http_server(reads: Reads, listen: tuple[str, int] | None, token: str | None,
                 console: Console) -> HttpServer | None:
    """The REST API's server, started (None when ``listen`` is None)."""
    if listen is None:
        return None
    from streamgnn.api.server import HttpServer

    try:
        server = HttpServer(reads, *listen, token).start()
    except OSError as e:
        raise UserError(str(e), "choose another --http HOST:PORT (STREAMGNN_HTTP), stop "
                        "what listens there, or say --http off") from None
    console.print(f"REST API on {server.url} (OpenAPI at {server.url}/docs)")
    return server
