"""The Kafka implementation of `Transport` (kafka-python), topic creation, and the small
producer/consumer helpers behind `streamgnn produce` and `streamgnn watch`.

Uses only standard Kafka APIs, so it runs against Apache Kafka and the embedded Tansu
broker alike: partitions are assigned explicitly and positions come from the service's own
checkpoints (no consumer-group join, no ``end_offsets``, no ``create_partitions``).
Owns every kafka-python import of the package.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from streamgnn.stream.transport import Record

_CONSUMER = dict(enable_auto_commit=False, max_partition_fetch_bytes=16 << 20,
                 fetch_max_bytes=64 << 20, fetch_max_wait_ms=50, request_timeout_ms=30000)


def producer(bootstrap: str) -> KafkaProducer:
    """Durable, ordered, idempotent producer (acks=all)."""
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                         linger_ms=5, batch_size=1 << 20, max_request_size=16 << 20)


def stamp(line: bytes) -> tuple[bytes | None, bytes]:
    """(key, value) for one JSON update as a producer sends it: keyed by its source vertex
    (vertex ops: the vertex), with ``event_time`` set if missing. Unparsable lines go as
    they are (the service dead-letters them)."""
    try:
        message = json.loads(line)
        message.setdefault("event_time", time.time())
        key = message.get("src", message.get("id"))
        return (None if key is None else str(key).encode()), json.dumps(message).encode()
    except (ValueError, AttributeError):
        return None, line


def ensure_topics(bootstrap: str, names: list[str], partitions: int = 1,
                  timeout_s: float = 15.0) -> None:
    """Create the topics that do not exist yet."""
    admin = _admin(bootstrap, timeout_s)
    try:
        missing = [n for n in names if n not in set(admin.list_topics())]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(n, partitions, 1) for n in missing])
    finally:
        admin.close()


def reachable(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """Whether some broker of ``bootstrap`` accepts connections."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            socket.create_connection((host or "localhost", int(port)), timeout_s).close()
            return True
        except OSError:
            continue
    return False


def _admin(bootstrap: str, timeout_s: float) -> KafkaAdminClient:
    deadline = time.monotonic() + timeout_s
    while not reachable(bootstrap):
        if time.monotonic() > deadline:
            raise ConnectionError(f"no Kafka broker answers at {bootstrap}: start the embedded "
                                  "one (`streamgnn broker start`) or set --bootstrap-servers")
        time.sleep(0.1)
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)


def _assigned(bootstrap: str, topic: str) -> tuple[KafkaConsumer, list[TopicPartition]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **_CONSUMER)
    parts = consumer.partitions_for_topic(topic)
    deadline = time.monotonic() + 10
    while not parts:
        if time.monotonic() > deadline:
            consumer.close()
            raise LookupError(f"topic {topic!r} does not exist at {bootstrap}")
        time.sleep(0.1)
        parts = consumer.partitions_for_topic(topic)
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    return consumer, tps


class KafkaTransport:
    """`Transport` over Kafka: all partitions of the input topic, idempotent producer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._consumer, self._tps = _assigned(bootstrap, topic)
        self._consumer.seek_to_beginning()
        self._producer = producer(bootstrap)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        got = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [Record(self.topic, m.partition, m.offset, m.value)
                for tp in sorted(got, key=lambda tp: tp.partition) for m in got[tp]]

    def positions(self) -> dict[int, int]:
        return {tp.partition: self._consumer.position(tp) for tp in self._tps}

    def seek(self, positions: dict[int, int]) -> None:
        for tp in self._tps:
            if tp.partition in positions:
                self._consumer.seek(tp, positions[tp.partition])

    def publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._producer.send(topic, key=key, value=value)

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._producer.close()
        self._consumer.close()


def follow(bootstrap: str, topic: str, from_beginning: bool = False,
           idle_s: float | None = None) -> Iterator[Record]:
    """Records of ``topic`` as they arrive (from now, or from the beginning); stops after
    ``idle_s`` seconds without one, if given."""
    consumer, _ = _assigned(bootstrap, topic)
    if from_beginning:
        consumer.seek_to_beginning()
    else:
        consumer.seek_to_end()
    last = time.monotonic()
    try:
        while idle_s is None or time.monotonic() - last < idle_s:
            got = consumer.poll(timeout_ms=200)
            for tp in sorted(got, key=lambda tp: tp.partition):
                for m in got[tp]:
                    last = time.monotonic()
                    yield Record(topic, m.partition, m.offset, m.value)
    finally:
        consumer.close()
