"""The Kafka side of a load generator (`streamgnn replay run`): `LoadProducer` sends
updates one per message, so each has its own source offset to match against label
changes, partitioned by source vertex like `UpdateSender` (each vertex's updates stay in
order), and query requests; `OutputFollower` reads output topics from their current end on
a thread of its own and hands every record to a callback.

Callers see offsets and callbacks only; this module and `kafka` are the only ones that
import kafka-python.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kafka import TopicPartition

from streamgnn.stream.kafka import producer
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.transport import Record


class LoadProducer:
    def __init__(self, kafka: KafkaConfig, updates_topic: str, queries_topic: str) -> None:
        self.updates_topic, self.queries_topic = updates_topic, queries_topic
        self._producer = producer(kafka)
        self._partitions = len(self._producer.partitions_for(updates_topic))

    def update(self, value: bytes, key: int, on_offset: Callable[[int, int], None],
               on_error: Callable[[BaseException], None]) -> None:
        """Send one update (JSON) to partition ``key`` mod the partition count; once the
        broker has it, ``on_offset(partition, offset)`` (on the producer's thread)."""
        sent = self._producer.send(self.updates_topic, value=value,
                                   partition=key % self._partitions)
        sent.add_callback(lambda meta: on_offset(meta.partition, meta.offset))
        sent.add_errback(on_error)

    def query(self, value: bytes, on_error: Callable[[BaseException], None]) -> None:
        self._producer.send(self.queries_topic, value=value).add_errback(on_error)

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout=timeout_s)
        self._producer.close(timeout=timeout_s)


class OutputFollower:
    """Every record of ``topics`` published after construction, to ``on_record`` (on the
    follower's thread). ``error``: what stopped the thread, if anything did."""

    def __init__(self, kafka: KafkaConfig, topics: list[str],
                 on_record: Callable[[Record], None], timeout_s: float = 10.0) -> None:
        self._consumer = kafka.consumer(enable_auto_commit=False, fetch_max_wait_ms=50,
                                        max_partition_fetch_bytes=16 << 20)
        deadline = time.monotonic() + timeout_s
        tps = []
        for topic in topics:
            while not (parts := self._consumer.partitions_for_topic(topic)):
                if time.monotonic() > deadline:
                    self._consumer.close()
                    raise LookupError(f"topic {topic!r} does not exist at "
                                      f"{kafka.bootstrap_servers}")
                time.sleep(0.1)
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        self._consumer.seek_to_end()
        for tp in tps:  # resolve the lazy seek now, before anything is sent
            self._consumer.position(tp)
        self.on_record = on_record
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="replay-follower",
                                        daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                for tp, messages in self._consumer.poll(timeout_ms=100).items():
                    for m in messages:
                        self.on_record(Record(tp.topic, m.partition, m.offset, m.value))
        except BaseException as e:  # reported by the caller
            self.error = e

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()
