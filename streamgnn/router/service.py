"""`Service`: the streaming loop. Consumes the updates topic through a `Transport`,
decodes and validates (a message holds one update or an array of them), holds updates
that wait for a vertex (`Arrivals`), cuts batches of ``batch_size`` updates (or fewer after
the maximum wait), places each batch (`Placement`), applies it to the engine, publishes
every changed label (one message per batch and label-topic partition) and every unusable
update (dead letter, with reason and source offset), and checkpoints state, pending
updates and consumed offsets every N batches or seconds.

Bad input never stops the loop. Delivery: each update is applied exactly once across
restarts (state, pending updates and offsets are checkpointed together, and batch
boundaries replay the same from a backlog); outputs are at least once, and a replayed
batch republishes the same changes under the same batch number.

Must not import kafka (the transport is injected) or mpi4py.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from streamgnn.models.zoo import Checkpoint, ModelSpec
from streamgnn.router.arrivals import Arrivals
from streamgnn.router.checkpoint import Checkpoints
from streamgnn.router.placement import Placement, Strategy
from streamgnn.stream.schemas import (
    DeadLetter,
    DecodeError,
    SourceRange,
    Topics,
    decode_updates,
    encode,
    is_array,
    label_changes_json,
)
from streamgnn.stream.transport import Record, Transport
from streamgnn.updates import Update
from streamgnn.workers import ApplyResult, Engine


class ServiceConfig(BaseModel):
    batch_size: int = Field(1000, ge=1, description="updates per batch")
    max_wait_s: float = Field(0.05, ge=0, description="flush a partial batch this long "
                              "after its first update")
    arrival_wait_s: float = Field(2.0, ge=0, description="how long an update naming a "
                                  "vertex that has not arrived waits for it")
    checkpoint_batches: int = Field(50, ge=1, description="checkpoint every N batches")
    checkpoint_s: float = Field(30.0, gt=0, description="or every this many seconds")
    partitions: int = Field(1, ge=1)
    placement: Strategy = "locality"
    refresh_every: int = Field(500_000, ge=1, description="updates between high-in-degree "
                               "set refreshes")
    topics: Topics = Topics()


@dataclass
class Stats:
    """What the service did since it started (this process)."""

    events: int = 0
    applied: int = 0
    batches: int = 0
    label_changes: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    latency_ms: list[np.ndarray] = field(default_factory=list)  # produce -> acknowledged
    batch_ms: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    first_input: float | None = None  # perf_counter when the first record came
    last_output: float = 0.0          # ... when the last outputs were acknowledged
    busy_s: float = 0.0

    def latencies(self) -> np.ndarray:
        return np.concatenate(self.latency_ms) if self.latency_ms else np.zeros(0)

    def throughput(self) -> float:
        """Updates applied per second from the first input to the last acknowledged
        output."""
        if self.first_input is None or self.last_output <= self.first_input:
            return 0.0
        return self.applied / (self.last_output - self.first_input)


class Origin(NamedTuple):
    """Where an update came from: a record, and its position in the record's array
    (None when the record is one update)."""

    record: Record
    index: int | None = None


@dataclass
class BatchReport:
    seq: int
    size: int
    result: ApplyResult
    seconds: float


class Service:
    def __init__(self, engine: Engine, checkpoint: Checkpoint, transport: Transport,
                 config: ServiceConfig, checkpoints: Checkpoints | None = None,
                 placement: Placement | None = None) -> None:
        self.engine = engine
        self.model = checkpoint
        self.transport = transport
        self.config = config
        self.checkpoints = checkpoints
        if placement is None:
            ids = engine.vertex_ids()
            src, dst, _ = engine.edges()
            placement = Placement.from_edges(ids, src, dst, config.partitions,
                                             strategy=config.placement,
                                             refresh_every=config.refresh_every)
        self.placement = placement
        self.arrivals: Arrivals[Origin] = Arrivals(engine.graph.contains, config.arrival_wait_s)
        self.pending: list[tuple[Update, Origin]] = []  # admitted, not applied yet
        self.batch_seq = 0
        self.stats = Stats()
        self._acked: list[tuple[float, float, np.ndarray]] = []  # filled by ack callbacks
        self._last_checkpoint = (0, time.monotonic())

    # ---------------------------------------------------------------- start / resume
    @classmethod
    def open(cls, checkpoint: Callable[[], Checkpoint], bootstrap: Callable[[Checkpoint], Engine],
             transport: Transport, config: ServiceConfig,
             checkpoints: Checkpoints | None = None, device: str = "cpu") -> Service:
        """Resume from the last checkpoint in ``checkpoints`` if there is one (seeking the
        transport to its offsets); else bootstrap a new engine from the beginning."""
        saved = checkpoints.load() if checkpoints else None
        if saved is None:
            model = checkpoint()
            return cls(bootstrap(model), model, transport, config, checkpoints)
        model = Checkpoint(ModelSpec(**saved["spec"]), saved["weights"])
        engine = Engine.restore(model.model(), saved["engine"], device)
        service = cls(engine, model, transport, config, checkpoints, saved["placement"])
        service.arrivals.waiting = saved["waiting"]
        service.pending = saved["pending"]
        for update, _ in service.pending:
            service.arrivals.track(update)
        service.batch_seq = saved["batch_seq"]
        transport.seek(saved["positions"])
        return service

    def checkpoint(self) -> None:
        if self.checkpoints is None:
            return
        self._settle()  # outputs before offsets: a restart may repeat them, never lose them
        self.checkpoints.save({
            "spec": asdict(self.model.spec), "weights": self.model.state_dict,
            "engine": self.engine.snapshot(), "placement": self.placement,
            "waiting": self.arrivals.waiting, "pending": self.pending,
            "batch_seq": self.batch_seq,
            "positions": self.transport.positions()})
        self._last_checkpoint = (self.batch_seq, time.monotonic())

    # ---------------------------------------------------------------- the loop
    def run(self, stop: Callable[[], bool] = lambda: False, idle_exit_s: float | None = None,
            on_batch: Callable[[BatchReport], None] | None = None) -> Stats:
        """Serve until ``stop()`` is true, or until nothing arrived for ``idle_exit_s``
        seconds and nothing is pending; then flush, checkpoint and return the stats."""
        cfg = self.config
        gc.collect()
        gc.freeze()  # what exists now (graph, engine, model) lives on: keep GC passes off it
        per_record = 1.0  # updates per record lately: poll about one batch's worth
        opened = last_input = time.monotonic()
        while not stop():
            want = cfg.batch_size - len(self.pending)
            records = self.transport.poll(max(1, int(want / per_record)),
                                          cfg.max_wait_s if self.pending else 0.1)
            now = time.monotonic()
            self._record_acks()
            if records:
                if self.stats.first_input is None:
                    self.stats.first_input = time.perf_counter()
                last_input = now
                if not self.pending:
                    opened = now
                admitted = self._admit(records)
                per_record = max(1.0, len(admitted) / len(records))
                self.pending += admitted
            for w in self.arrivals.expired():
                self._dead_letter(w.source, "vertex_never_arrived",
                                  f"vertex {w.vertex} did not arrive within "
                                  f"{cfg.arrival_wait_s:g} s", w.update)
            waited = bool(self.pending) and now - opened >= cfg.max_wait_s
            if waited or len(self.pending) >= cfg.batch_size:
                while len(self.pending) >= cfg.batch_size or (waited and self.pending):
                    report = self._apply(cfg.batch_size)
                    if on_batch is not None:
                        on_batch(report)
                opened = now
                self._maybe_checkpoint()
            elif (idle_exit_s is not None and not self.pending and not len(self.arrivals)
                  and now - last_input >= idle_exit_s):
                break
        while self.pending:
            self._apply(cfg.batch_size)
        self._settle()
        self.checkpoint()
        return self.stats

    def _admit(self, records: list[Record]) -> list[tuple[Update, Origin]]:
        decoded = []
        for r in records:
            try:
                items = decode_updates(r.value)
            except DecodeError as e:
                self._dead_letter(Origin(r), e.error, str(e))
                self.stats.events += 1
                continue
            indexed = is_array(r.value)
            for i, item in enumerate(items):
                origin = Origin(r, i if indexed else None)
                if isinstance(item, DecodeError):
                    self._dead_letter(origin, item.error, str(item), payload=item.item)
                else:
                    decoded.append((item, origin))
            self.stats.events += len(items)
        return self.arrivals.admit(decoded)

    def _apply(self, size: int) -> BatchReport:
        """Apply the first ``size`` pending updates as the next batch and publish what
        changed (not waiting for the broker's acknowledgement: `_record_acks`)."""
        t = time.perf_counter()
        buffer, self.pending = self.pending[:size], self.pending[size:]
        batch = [u for u, _ in buffer]
        self.placement.route(batch)
        result = self.engine.apply(batch, skip_invalid=True)
        if not self.pending:
            self.arrivals.all_applied()
        for err in result.rejected:
            update, origin = buffer[err.index]
            self._dead_letter(origin, type(err).__name__, err.reason, update)
        self.batch_seq += 1
        times = np.array([u.event_time for u in batch if u.event_time is not None],
                         np.float64)
        self._publish_changes(result.changed_labels, _ranges([o.record for _, o in buffer]),
                              times)
        seconds = time.perf_counter() - t
        s = self.stats
        s.batches += 1
        s.applied += len(batch) - len(result.rejected)
        s.label_changes += len(result.changed_labels)
        s.batch_ms.append(seconds * 1000)
        s.busy_s += seconds
        return BatchReport(self.batch_seq, len(batch), result, seconds)

    def _record_acks(self) -> None:
        """Latencies of the batches whose outputs the broker acknowledged since."""
        acked, self._acked = self._acked, []
        for at, perf, times in acked:
            self.stats.latency_ms.append((at - times) * 1000)
            self.stats.last_output = max(self.stats.last_output, perf)

    def _settle(self) -> None:
        """Wait until everything published is acknowledged."""
        self.transport.flush()
        self._record_acks()

    def _publish_changes(self, changed: dict[int, tuple[int | None, int]],
                         sources: list[SourceRange], times: np.ndarray) -> None:
        """One message per label-topic partition (vertex mod partitions), split further
        past ``_CHANGES_PER_MESSAGE``; when all are acknowledged, the batch's events
        (``times``: their event times) are done."""
        topic = self.config.topics.labels
        partitions = self.transport.partitions(topic)
        by_partition: dict[int, list[tuple[int, int | None, int]]] = {}
        for vertex, (old, new) in changed.items():
            by_partition.setdefault(vertex % partitions, []).append((vertex, old, new))
        messages = [(p, changes[i:i + _CHANGES_PER_MESSAGE])
                    for p, changes in sorted(by_partition.items())
                    for i in range(0, len(changes), _CHANGES_PER_MESSAGE)]
        waiting = [len(messages)]

        def acked() -> None:  # on the producer's thread: list appends are atomic
            waiting[0] -= 1
            if waiting[0] == 0:
                self._acked.append((time.time(), time.perf_counter(), times))

        if not messages:
            acked()
        now = time.time()
        for part, (p, changes) in enumerate(messages):
            self.transport.publish(topic, None, label_changes_json(
                f"lc-{self.batch_seq}-{part}", now, self.batch_seq, part, sources, changes),
                partition=p, on_ack=acked)

    def _maybe_checkpoint(self) -> None:
        seq, at = self._last_checkpoint
        if (self.batch_seq - seq >= self.config.checkpoint_batches
                or time.monotonic() - at >= self.config.checkpoint_s):
            self.checkpoint()

    def _dead_letter(self, origin: Origin, error: str, reason: str,
                     update: Update | None = None, payload: str | None = None) -> None:
        self.stats.dead_letters[error] += 1
        r = origin.record
        if origin.index is None:
            payload = r.value.decode("utf-8", "replace")[:100_000]
            where = ""
        else:
            payload = payload or (encode(update).decode() if update else "")
            where = f"-{origin.index}"
        letter = DeadLetter(event_id=f"dl-{r.topic}-{r.partition}-{r.offset}{where}",
                            reason=reason, error=error, topic=r.topic, partition=r.partition,
                            offset=r.offset, index=origin.index, payload=payload,
                            source_event_id=update.event_id if update else None)
        self.transport.publish(self.config.topics.dead_letters, None, encode(letter))


_CHANGES_PER_MESSAGE = 10_000


def _ranges(records: list[Record]) -> list[SourceRange]:
    by: dict[int, list[int]] = {}
    for r in records:
        by.setdefault(r.partition, []).append(r.offset)
    return [SourceRange(partition=p, first=min(o), last=max(o)) for p, o in sorted(by.items())]

