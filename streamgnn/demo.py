"""The one-command demo behind `streamgnn demo` / `make demo`: the embedded broker (started
and stopped here unless one already runs), a producer process sending the held-out updates
through Kafka, the streaming service, a live view of the label-changes topic, and a
summary checked against PyG's forward pass on the final graph.

Owns orchestration and terminal output of the demo only; the parts live in stream/,
router/ and workers/.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from streamgnn.datasets import GraphData
from streamgnn.models.gnn import pyg_forward
from streamgnn.models.zoo import ModelFile
from streamgnn.router import Service, ServiceConfig, Stats
from streamgnn.stream import LabelChange, LabelChanges, Topics, encode
from streamgnn.stream.broker import EmbeddedBroker
from streamgnn.stream.kafka import KafkaTransport
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import ensure_topics, follow, reachable
from streamgnn.updates import Update
from streamgnn.workers import Engine
from streamgnn.workers.warm_up import WARMING_UP, warm_up_if_possible

READ_BACK_S = 30.0  # how long the summary waits for the last label changes to be read


@dataclass
class Summary:
    stats: Stats
    rows: list[tuple[str, str]]


class _LabelFeed(threading.Thread):
    """Follows the label-changes topic: a count and the latest few, for the live view."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic = kafka, topic
        self.seen = 0
        self.latest: deque[tuple[int, LabelChange]] = deque(maxlen=8)  # (batch, change)
        self._read = threading.Condition()

    def run(self) -> None:
        for record in follow(self.kafka, self.topic, from_beginning=True, idle_s=None):
            message = LabelChanges.model_validate_json(record.value)
            with self._read:
                self.seen += len(message.changes)
                self.latest += [(message.batch, c) for c in message.changes[:2]]
                self._read.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` label changes were read back; whether they were."""
        with self._read:
            return self._read.wait_for(lambda: self.seen >= count, timeout_s)


def run_demo(broker: EmbeddedBroker, kafka: KafkaConfig, full: GraphData,
             snapshot: GraphData, events: Sequence[Update], model_file: ModelFile,
             batch_size: int, device: str, console: Console) -> Summary:
    """The demo against ``broker`` (started here unless it runs), reached with ``kafka``'s
    client settings."""
    started_broker = not reachable(broker.bootstrap, 0.5)
    if started_broker:
        broker.start()
        console.print(f"embedded broker started at {broker.bootstrap}")
    try:
        return _serve_and_stream(kafka, full, snapshot, events, model_file,
                                 batch_size, device, console)
    finally:
        if started_broker:
            broker.stop()
            console.print("embedded broker stopped")


def _serve_and_stream(kafka: KafkaConfig, full: GraphData, snapshot: GraphData,
                      events: Sequence[Update], model_file: ModelFile, batch_size: int,
                      device: str, console: Console) -> Summary:
    prefix = f"demo-{uuid.uuid4().hex[:6]}-"
    topics = Topics.prefixed(prefix)
    ensure_topics(kafka, topics.all())
    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "held-out.jsonl"
        stream.write_bytes(b"".join(encode(u) + b"\n" for u in events))
        with console.status(WARMING_UP):
            seconds = warm_up_if_possible(model_file.model(), device)
        if seconds is not None:
            console.print(f"kernels ready in {seconds:.1f} s")
        engine = Engine.from_pyg(model_file.model(), snapshot, device=device)
        service = Service(engine, model_file, KafkaTransport(kafka, topics.updates),
                          ServiceConfig(batch_size=batch_size, topics=topics))
        feed = _LabelFeed(kafka, topics.labels)
        feed.start()
        errors = Path(tmp) / "produce.err"  # (a pipe unread until the end could fill up)
        with open(errors, "wb") as err:
            producer = subprocess.Popen(
                [sys.executable, "-m", "streamgnn.cli", "produce", str(stream), "-b",
                 kafka.bootstrap_servers, "--topic-prefix", prefix,
                 *(["--kafka-config", str(kafka.file)] if kafka.file else [])],
                stdout=subprocess.DEVNULL, stderr=err)
        console.print(f"producing {len(events):,} held-out updates to {topics.updates}; "
                      f"serving in batches of {batch_size:,}")
        with Live(_view(service, feed, len(events)), console=console,
                  refresh_per_second=4) as live:
            stats = service.run(
                stop=lambda: producer.poll() is not None and (
                    producer.returncode != 0 or service.stats.events >= len(events)),
                on_batch=lambda _: live.update(_view(service, feed, len(events))))
            read_back = feed.wait_for(stats.label_changes, READ_BACK_S)
            live.update(_view(service, feed, len(events)))
        console.line()
        if producer.wait() != 0:
            raise RuntimeError(f"the producer failed: {errors.read_text()}")
    missing = stats.label_changes - feed.seen
    rows = [("label changes published / read back",
             f"{stats.label_changes:,} / {feed.seen:,}"
             + ("" if read_back else f" ({missing:,} not read back in {READ_BACK_S:g} s)")),
            # the producer sends as fast as it can: an update mostly waits behind earlier
            # ones, so the latency is queueing, and processing speed is 'while busy'
            ("latency p50 / p99 is mostly", "queueing (the producer is unpaced)")]
    return Summary(stats, rows + _check(service.engine, model_file, full, device))


def _view(service: Service, feed: _LabelFeed, total: int) -> Group:
    """The live panel, within 80 columns: progress, then the latest label changes."""
    s = service.stats
    table = Table(title="latest label changes", title_justify="left")
    for col in ("batch", "vertex", "old", "new"):
        table.add_column(col, justify="right")
    for batch, c in list(feed.latest):
        table.add_row(str(batch), str(c.vertex), "new" if c.old is None else str(c.old),
                      str(c.new))
    return Group(Text(f"applied {s.applied:,} / {total:,} updates in "
                      f"{service.batch_seq:,} batches"),
                 Text(f"label changes: {s.label_changes:,} published, {feed.seen:,} read "
                      "back"), table)


def _check(engine: Engine, model_file: ModelFile, full: GraphData,
           device: str) -> list[tuple[str, str]]:
    current = engine.to_data()
    t = time.perf_counter()
    ref = pyg_forward(model_file.model().to(device), current, device)
    t_full = time.perf_counter() - t
    err = float(np.abs(engine.lookup(current.ids) - ref.cpu().numpy()).max())
    rows = [("max |engine - PyG forward|, final graph", f"{err:.1e}"),
            ("one PyG forward pass on the final graph", f"{t_full:.2f} s")]
    if full.y is not None:
        acc = float((engine.label(full.ids) == full.y).mean())
        rows.append(("accuracy on the whole final graph", f"{acc:.3f}"))
    return rows
