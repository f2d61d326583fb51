"""`Service`: the streaming loop. Consumes the updates topic through a `Transport`,
decodes and validates, holds updates that wait for a vertex (`Arrivals`), batches by size
and by maximum wait, places each batch (`Placement`), applies it to the engine, publishes
every changed label and every unusable message (dead letter, with reason and source
offset), and checkpoints state and consumed offsets every N batches or seconds.

Bad input never stops the loop. Delivery: each update is applied exactly once across
restarts (state and offsets are checkpointed together, and batch boundaries replay the
same from a backlog); outputs are at least once, and a replayed batch republishes the same
changes under the same batch number.

Must not import kafka (the transport is injected) or mpi4py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
from pydantic import BaseModel, Field

from streamgnn.models.zoo import Checkpoint, ModelSpec
from streamgnn.router.arrivals import Arrivals
from streamgnn.router.checkpoint import Checkpoints
from streamgnn.router.placement import Placement, Strategy
from streamgnn.stream.schemas import (
    DeadLetter,
    DecodeError,
    LabelChange,
    SourceRange,
    Topics,
    decode_update,
    encode,
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
    latency_ms: list[np.ndarray] = field(default_factory=list)  # produce -> publish
    batch_ms: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    busy_s: float = 0.0

    def latencies(self) -> np.ndarray:
        return np.concatenate(self.latency_ms) if self.latency_ms else np.zeros(0)


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
        self.arrivals: Arrivals[Record] = Arrivals(engine.graph.contains, config.arrival_wait_s)
        self.batch_seq = 0
        self.stats = Stats()
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
        service.batch_seq = saved["batch_seq"]
        transport.seek(saved["positions"])
        return service

    def checkpoint(self) -> None:
        if self.checkpoints is None:
            return
        self.checkpoints.save({
            "spec": asdict(self.model.spec), "weights": self.model.state_dict,
            "engine": self.engine.snapshot(), "placement": self.placement,
            "waiting": self.arrivals.waiting, "batch_seq": self.batch_seq,
            "positions": self.transport.positions()})
        self._last_checkpoint = (self.batch_seq, time.monotonic())

    # ---------------------------------------------------------------- the loop
    def run(self, stop: Callable[[], bool] = lambda: False, idle_exit_s: float | None = None,
            on_batch: Callable[[BatchReport], None] | None = None) -> Stats:
        """Serve until ``stop()`` is true, or until nothing arrived for ``idle_exit_s``
        seconds and nothing is pending; then flush, checkpoint and return the stats."""
        cfg = self.config
        buffer: list[tuple[Update, Record]] = []
        opened = last_input = time.monotonic()
        while not stop():
            timeout = cfg.max_wait_s if buffer else 0.1
            records = self.transport.poll(max(cfg.batch_size - len(buffer), 1), timeout)
            now = time.monotonic()
            if records:
                last_input = now
                if not buffer:
                    opened = now
                buffer += self._admit(records)
            for w in self.arrivals.expired():
                self._dead_letter(w.source, "vertex_never_arrived",
                                  f"vertex {w.vertex} did not arrive within "
                                  f"{cfg.arrival_wait_s:g} s", w.update)
            if buffer and (len(buffer) >= cfg.batch_size or now - opened >= cfg.max_wait_s):
                report = self._apply(buffer)
                buffer = []
                if on_batch is not None:
                    on_batch(report)
                self._maybe_checkpoint()
            elif (idle_exit_s is not None and not buffer and not len(self.arrivals)
                  and now - last_input >= idle_exit_s):
                break
        if buffer:
            self._apply(buffer)
        self.transport.flush()
        self.checkpoint()
        return self.stats

    def _admit(self, records: list[Record]) -> list[tuple[Update, Record]]:
        decoded = []
        for r in records:
            try:
                decoded.append((decode_update(r.value), r))
            except DecodeError as e:
                self._dead_letter(r, e.error, str(e))
        self.stats.events += len(records)
        return self.arrivals.admit(decoded)

    def _apply(self, buffer: list[tuple[Update, Record]]) -> BatchReport:
        t = time.perf_counter()
        batch = [u for u, _ in buffer]
        self.placement.route(batch)
        result = self.engine.apply(batch, skip_invalid=True)
        self.arrivals.batch_done()
        for err in result.rejected:
            update, record = buffer[err.index]
            self._dead_letter(record, type(err).__name__, err.reason, update)
        self.batch_seq += 1
        sources = _ranges([r for _, r in buffer])
        publish, topic = self.transport.publish, self.config.topics.labels
        published = time.time()
        for vertex, (old, new) in result.changed_labels.items():
            publish(topic, str(vertex).encode(), encode(LabelChange(
                event_id=f"lc-{self.batch_seq}-{vertex}", event_time=published, vertex=vertex,
                old=old, new=new, batch=self.batch_seq, sources=sources)))
        self.transport.flush()
        published = time.time()  # acknowledged by the broker
        seconds = time.perf_counter() - t
        s = self.stats
        s.batches += 1
        s.applied += len(batch) - len(result.rejected)
        s.label_changes += len(result.changed_labels)
        s.batch_ms.append(seconds * 1000)
        s.busy_s += seconds
        times = np.array([u.event_time for u in batch if u.event_time is not None])
        s.latency_ms.append((published - times) * 1000)
        return BatchReport(self.batch_seq, len(batch), result, seconds)

    def _maybe_checkpoint(self) -> None:
        seq, at = self._last_checkpoint
        if (self.batch_seq - seq >= self.config.checkpoint_batches
                or time.monotonic() - at >= self.config.checkpoint_s):
            self.checkpoint()

    def _dead_letter(self, record: Record, error: str, reason: str,
                     update: Update | None = None) -> None:
        self.stats.dead_letters[error] += 1
        letter = DeadLetter(event_id=f"dl-{record.topic}-{record.partition}-{record.offset}",
                            reason=reason, error=error, topic=record.topic,
                            partition=record.partition, offset=record.offset,
                            payload=record.value.decode("utf-8", "replace")[:100_000],
                            source_event_id=update.event_id if update else None)
        self.transport.publish(self.config.topics.dead_letters, None, encode(letter))


def _ranges(records: list[Record]) -> list[SourceRange]:
    by: dict[int, list[int]] = {}
    for r in records:
        by.setdefault(r.partition, []).append(r.offset)
    return [SourceRange(partition=p, first=min(o), last=max(o)) for p, o in sorted(by.items())]

