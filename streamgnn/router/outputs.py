"""`Outputs`: what the service publishes about its input. A batch's label changes (one
message per label-topic partition, named by the state's epoch and the batch), a dead
letter for every unusable update or record (reason, source offset, the bad input cut to
size), and, once the broker acknowledges a batch's messages, its latency in the stats.
Must not import kafka (the transport is injected)."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from streamgnn.router.metrics import Stats
from streamgnn.router.pending import Origin
from streamgnn.settings import ServiceConfig
from streamgnn.stream.schemas import DeadLetter, SourceRange, encode, label_changes_json
from streamgnn.stream.transport import Record, Transport
from streamgnn.updates import Update
from streamgnn.workers import ChangedLabels

_CHANGES_PER_MESSAGE = 10_000
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(32), 127]}


class Outputs:
    def __init__(self, transport: Transport, config: ServiceConfig, stats: Stats) -> None:
        """Publishes through ``transport`` on ``config``'s topics; counts in ``stats``."""
        self.transport = transport
        self.config = config
        self.stats = stats
        self._acked: list[tuple[float, float, np.ndarray]] = []  # filled by ack callbacks

    def label_changes(self, changed: ChangedLabels, records: list[Record],
                      times: np.ndarray, at: float, epoch: str, batch: int) -> None:
        """Batch ``batch``'s changes: one message per label-topic partition (vertex mod
        partitions), split further past ``_CHANGES_PER_MESSAGE``, with event time ``at``
        and the source ``records``' offsets; when all are acknowledged, the batch's
        events (``times``: their event times) are done."""
        topic = self.config.topics.labels
        partitions = self.transport.partitions(topic)
        sources = _ranges(records)
        by_partition: dict[int, list[tuple[int, int | None, int]]] = {}
        for change in changed.triples():
            by_partition.setdefault(change[0] % partitions, []).append(change)
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
        for part, (p, changes) in enumerate(messages):
            self.transport.publish(topic, None, label_changes_json(
                f"lc-{epoch}-{batch}-{part}", at, batch, part, sources, changes),
                partition=p, on_ack=acked)

    def dead_letter(self, origin: Origin, error: str, reason: str,
                    update: Update | None = None, payload: str | None = None,
                    source_event_id: str | None = None) -> None:
        """Publish why the update (or record) at ``origin`` is not used. The payload is the
        record, or the array item's own JSON, cut to ``payload_bytes`` (its size and
        SHA-256 name the whole); control characters in the reason are escaped. The source
        event id is the update's, else ``source_event_id``."""
        self.stats.dead_letters[error] += 1
        r = origin.record
        if origin.index is None:
            raw = r.value or b""
        else:
            raw = (payload or (encode(update).decode() if update else "")).encode()
        cut = raw[:self.config.payload_bytes].decode("utf-8", "ignore")
        where = "" if origin.index is None else f"-{origin.index}"
        letter = DeadLetter(event_id=f"dl-{r.topic}-{r.partition}-{r.offset}{where}",
                            reason=escaped(reason), error=error, topic=r.topic,
                            partition=r.partition, offset=r.offset, index=origin.index,
                            payload=cut, payload_bytes=len(raw),
                            payload_sha256=hashlib.sha256(raw).hexdigest(),
                            truncated=len(raw) > self.config.payload_bytes,
                            source_event_id=update.event_id if update else source_event_id)
        self.transport.publish(self.config.topics.dead_letters, None, encode(letter))

    def record_acks(self) -> None:
        """Latencies of the batches whose outputs the broker acknowledged since."""
        acked, self._acked = self._acked, []
        for at, perf, times in acked:
            self.stats.latency.record((at - times) * 1000)
            self.stats.last_output = max(self.stats.last_output, perf)

    def settle(self) -> None:
        """Wait until everything published is acknowledged."""
        self.transport.flush()
        self.record_acks()


def escaped(text: str, limit: int = 2000) -> str:
    """``text`` with control characters written as \\xNN, at most ``limit`` long."""
    return text.translate(_CONTROL)[:limit]


def _ranges(records: list[Record]) -> list[SourceRange]:
    by: dict[int, list[int]] = {}
    for r in records:
        by.setdefault(r.partition, []).append(r.offset)
    return [SourceRange(partition=p, first=min(o), last=max(o)) for p, o in sorted(by.items())]
