"""`MemoryBroker` and `MemoryTransport`: topics in a Python dict, behind the same
`Transport` interface as Kafka, for tests and embedding that are not about Kafka (several
service instances in one process can share one broker, as processes share a cluster).

Must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from streamgnn.stream.transport import OffsetReset, OffsetsOutOfRange, Record


class MemoryBroker:
    """Append-only topics of ``partitions`` partitions each (created on first use)."""

    def __init__(self, partitions: int = 1) -> None:
        self.default_partitions = partitions
        self.topics: dict[str, list[list[bytes | None]]] = {}
        self.lock = threading.Lock()

    def produce(self, topic: str, value: bytes | None, partition: int = 0) -> int:
        """Append ``value`` (None: a tombstone); returns its offset."""
        with self.lock:
            log = self._topic(topic)[partition]
            log.append(value)
            return len(log) - 1

    def records(self, topic: str) -> list[Record]:
        """Everything in ``topic``, partition by partition."""
        with self.lock:
            return [Record(topic, p, o, v) for p, log in enumerate(self._topic(topic))
                    for o, v in enumerate(log)]

    def _topic(self, topic: str) -> list[list[bytes | None]]:
        return self.topics.setdefault(topic, [[] for _ in range(self.default_partitions)])


class MemoryTransport:
    """`Transport` over a `MemoryBroker`: consumes every partition of ``topic``. A saved
    position past a partition's end (a broker made anew) is refused or moved as ``reset``
    says, as `KafkaTransport` does."""

    def __init__(self, broker: MemoryBroker, topic: str,
                 reset: OffsetReset = "refuse") -> None:
        self.broker, self.topic, self.reset = broker, topic, reset
        self._next = {p: 0 for p in range(len(broker._topic(topic)))}

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        out: list[Record] = []
        with self.broker.lock:
            for p, log in enumerate(self.broker._topic(self.topic)):
                take = log[self._next[p]:self._next[p] + max_records - len(out)]
                out += [Record(self.topic, p, self._next[p] + k, v) for k, v in enumerate(take)]
                self._next[p] += len(take)
        if not out and timeout_s > 0:
            threading.Event().wait(min(timeout_s, 0.01))
        return out

    def positions(self) -> dict[int, int]:
        return dict(self._next)

    def seek(self, positions: dict[int, int]) -> set[int]:
        with self.broker.lock:
            ends = {p: len(log) for p, log in enumerate(self.broker._topic(self.topic))}
        outside = {p: (at, 0, ends[p]) for p, at in positions.items() if at > ends[p]}
        if outside and self.reset == "refuse":
            raise OffsetsOutOfRange(self.topic, outside, "saved offsets")
        self._next.update(positions)
        self._next.update({p: 0 if self.reset == "earliest" else end
                           for p, (_, _, end) in outside.items()})
        return set(outside)

    def lag(self) -> int:
        with self.broker.lock:
            return sum(len(log) - self._next[p]
                       for p, log in enumerate(self.broker._topic(self.topic)))

    def partitions(self, topic: str) -> int:
        return len(self.broker._topic(topic))

    def publish(self, topic: str, key: bytes | None, value: bytes,
                partition: int | None = None,
                on_ack: Callable[[], None] | None = None) -> None:
        self.broker.produce(topic, value, partition or 0)
        if on_ack is not None:
            on_ack()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
