"""`KafkaTransport`: the Kafka implementation of `Transport` (kafka-python), and the
client plumbing it shares with the command-line helpers (`kafka_tools`): the durable
producer, a consumer assigned every partition of a topic, polled records as `Record`s.

Uses only standard Kafka APIs, so it runs against Apache Kafka and the embedded Tansu
broker alike: partitions are assigned explicitly and positions come from the service's own
checkpoints (no consumer-group join, no ``end_offsets``, no ``create_partitions``). A
position outside what its partition holds (the topic was recreated, or truncated by
retention) is never skipped silently: `KafkaTransport` raises `OffsetsOutOfRange`, or
starts where its `OffsetReset` says. Clients are made from a `KafkaConfig` (brokers + the
user's client settings). Must not import `kafka_tools`, torch or mpi4py.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import OffsetOutOfRangeError

from streamgnn.errors import UserError
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.transport import OffsetReset, OffsetsOutOfRange, Record

_CONSUMER = dict(enable_auto_commit=False, max_partition_fetch_bytes=16 << 20,
                 fetch_max_bytes=64 << 20, fetch_max_wait_ms=50, request_timeout_ms=30000)

def producer(kafka: KafkaConfig) -> KafkaProducer:
    """Durable, ordered, idempotent producer (acks=all)."""
    return kafka.producer(acks="all", enable_idempotence=True, linger_ms=5,
                          batch_size=1 << 20, max_request_size=16 << 20)


def assigned(kafka: KafkaConfig, topic: str,
             **settings: object) -> tuple[KafkaConsumer, list[TopicPartition]]:
    """A consumer (``settings`` on top of ours) assigned every partition of ``topic``
    (waits up to 10 s for it to exist: a `UserError` after)."""
    consumer = kafka.consumer(**_CONSUMER | settings)
    parts = consumer.partitions_for_topic(topic)
    deadline = time.monotonic() + 10
    while not parts:
        if time.monotonic() > deadline:
            consumer.close()
            raise UserError(f"topic {topic} does not exist at {kafka.bootstrap_servers}",
                            "`streamgnn serve` creates its topics: start it first, or check "
                            "--topic-prefix")
        time.sleep(0.1)
        parts = consumer.partitions_for_topic(topic)
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    return consumer, tps


def offset_ranges(kafka: KafkaConfig,
                  tps: list[TopicPartition]) -> dict[int, tuple[int, int]]:
    """Each partition's earliest offset and its end (the offset its next record gets). The
    end is the high watermark of a fetch from the earliest offset: right on every broker,
    where the embedded one answers ``end_offsets`` wrongly."""
    consumer = kafka.consumer(**_CONSUMER | dict(auto_offset_reset="earliest",
                                                 max_partition_fetch_bytes=1 << 10))
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        earliest = {tp: consumer.position(tp) for tp in tps}
        deadline = time.monotonic() + 10
        while unknown := [tp for tp in tps if consumer.highwater(tp) is None]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fetch response from {kafka.bootstrap_servers} for "
                                   f"partitions {[tp.partition for tp in unknown]} of "
                                   f"{tps[0].topic} within 10 s")
            consumer.pause(*(tp for tp in tps if tp not in unknown))  # drops their records
            consumer.poll(timeout_ms=100, max_records=1)
        return {tp.partition: (earliest[tp], consumer.highwater(tp)) for tp in tps}
    finally:
        consumer.close()


def records(topic: str, got: dict) -> list[Record]:
    """What a ``KafkaConsumer.poll`` returned, as records in partition order."""
    return [Record(topic, m.partition, m.offset, m.value)
            for tp in sorted(got, key=lambda tp: tp.partition) for m in got[tp]]


class KafkaTransport:
    """`Transport` over Kafka: all partitions of the input topic, idempotent producer.

    From the first `poll` on, a reader thread owns the consumer and keeps up to
    ``prefetch`` records fetched ahead, so the broker round trip and kafka-python's record
    parsing overlap the service's work instead of stalling it (kafka-python fetches again
    only once its buffer is drained). `positions` are those of the records handed out.

    A position outside what its partition holds is checked against the partition's
    `offset_ranges`: when `seek` is given one, it raises `OffsetsOutOfRange` or, as
    ``reset`` says, starts that partition at its earliest offset or its end (warning);
    when a fetch shows one later (Apache Kafka answers it with an error, the embedded
    broker with a high watermark below it), `poll` raises `OffsetsOutOfRange`."""

    def __init__(self, kafka: KafkaConfig, topic: str, prefetch: int = 400,
                 reset: OffsetReset = "refuse") -> None:
        self.topic, self.reset = topic, reset
        self._kafka = kafka
        self._consumer, self._tps = assigned(kafka, topic, auto_offset_reset="none")
        self._consumer.seek_to_beginning()
        self._producer = producer(kafka)
        self._partitions: dict[str, int] = {}
        self._chunk = max(1, prefetch // 8)
        self._chunks: queue.Queue[list[Record]] = queue.Queue(maxsize=8)
        self._buffer: deque[Record] = deque()
        self._next: dict[int, int] = {}
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        if self._reader is None:
            self._next = self.positions()
            self._reader = threading.Thread(target=self._read, name="streamgnn-reader",
                                            daemon=True)
            self._reader.start()
        try:
            if not self._buffer:
                self._buffer.extend(self._chunks.get(timeout=timeout_s))
            while len(self._buffer) < max_records:
                self._buffer.extend(self._chunks.get_nowait())
        except queue.Empty:
            if self._error is not None:
                raise self._error from None
        out = [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
        for r in out:
            self._next[r.partition] = r.offset + 1
        return out

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                got = records(self.topic, self._fetch())
                while got and not self._stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self._chunks.put(got, timeout=0.1)
                        break
        except BaseException as e:  # handed to the service by the next poll
            self._error = e

    def _fetch(self) -> dict:
        """One poll of the consumer; raises `OffsetsOutOfRange` if it shows a position
        outside its partition."""
        try:
            got = self._consumer.poll(timeout_ms=100, max_records=self._chunk)
        except OffsetOutOfRangeError as e:  # Apache Kafka: {partition: offset fetched}
            got, suspects = {}, e.args[0]
        else:  # the embedded broker answers a fetch past the end with no error
            suspects = {tp: at for tp in self._tps
                        if (end := self._consumer.highwater(tp)) is not None
                        and (at := self._consumer.position(tp)) > end}
        if suspects and (outside := self._outside(suspects)):
            raise OffsetsOutOfRange(self.topic, outside, "offsets being consumed")
        return got

    def _outside(self, positions: dict[TopicPartition, int]) -> dict[int, tuple[int, int, int]]:
        """The ``positions`` outside their partition: partition -> (position, earliest,
        end)."""
        ranges = offset_ranges(self._kafka, list(positions))
        return {tp.partition: (at, *ranges[tp.partition]) for tp, at in positions.items()
                if not ranges[tp.partition][0] <= at <= ranges[tp.partition][1]}

    def positions(self) -> dict[int, int]:
        if self._reader is not None:
            return dict(self._next)
        return {tp.partition: self._consumer.position(tp) for tp in self._tps}

    def seek(self, positions: dict[int, int]) -> set[int]:
        if self._reader is not None:
            raise RuntimeError("seek() must come before the first poll()")
        wanted = {tp: positions[tp.partition] for tp in self._tps if tp.partition in positions}
        outside = self._outside(wanted) if wanted else {}
        if outside:
            error = OffsetsOutOfRange(self.topic, outside, "saved offsets")
            if self.reset == "refuse":
                raise error
            warnings.warn(f"{error.message}; resuming from the {self.reset} offset "
                          f"(--offset-reset {self.reset})", stacklevel=2)
        for tp, at in wanted.items():
            if tp.partition in outside:
                _, earliest, end = outside[tp.partition]
                at = earliest if self.reset == "earliest" else end
            self._consumer.seek(tp, at)
        return set(outside)

    def lag(self) -> int | None:
        """From the high watermarks of the consumer's last fetch responses."""
        ends = {tp.partition: self._consumer.highwater(tp) for tp in self._tps}
        if self._reader is None or None in ends.values():
            return None
        return sum(end - self._next.get(p, end) for p, end in ends.items())

    def partitions(self, topic: str) -> int:
        if topic not in self._partitions:
            self._partitions[topic] = len(self._producer.partitions_for(topic))
        return self._partitions[topic]

    def publish(self, topic: str, key: bytes | None, value: bytes,
                partition: int | None = None,
                on_ack: Callable[[], None] | None = None) -> None:
        sent = self._producer.send(topic, key=key, value=value, partition=partition)
        if on_ack is not None:
            sent.add_callback(lambda _: on_ack())

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join()
        self._producer.close()
        self._consumer.close()
