"""The Kafka implementation of `Transport` (kafka-python), topic creation, and the small
producer/consumer helpers behind `streamgnn produce`, `watch` and `query`.

Uses only standard Kafka APIs, so it runs against Apache Kafka and the embedded Tansu
broker alike: partitions are assigned explicitly and positions come from the service's own
checkpoints (no consumer-group join, no ``end_offsets``, no ``create_partitions``).
Owns every kafka-python import of the package.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import orjson
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


class UpdateSender:
    """Sends JSON updates to the updates topic several per message (a JSON array of up to
    ``per_message``), stamping ``event_time`` where missing. An update goes to partition
    (its source vertex, or its vertex, mod the partition count), so each vertex's updates
    stay in order; a message goes when full or ``linger_s`` after its first update.
    Unparsable lines go alone, as they are (the service dead-letters them)."""

    def __init__(self, bootstrap: str, topic: str, per_message: int = 100,
                 linger_s: float = 0.02) -> None:
        self.topic, self.per_message, self.linger_s = topic, per_message, linger_s
        self._producer = producer(bootstrap)
        self._partitions = len(self._producer.partitions_for(topic))
        self._open: dict[int, tuple[float, list[bytes]]] = {}

    def send(self, line: bytes) -> None:
        now = time.time()
        try:
            update = orjson.loads(line)
            update.setdefault("event_time", now)
            key = int(update.get("src", update.get("id")))
            item = orjson.dumps(update)
        except (ValueError, AttributeError, TypeError):
            self._producer.send(self.topic, value=line)
            return
        partition = key % self._partitions
        items = self._open.setdefault(partition, (now, []))[1]
        items.append(item)
        if len(items) >= self.per_message:
            self._ship(partition)
        self._ship_lingering(now)

    def idle(self, seconds: float) -> None:
        """Sleep ``seconds`` (a paced producer between updates), shipping messages as
        their linger time comes."""
        until = time.time() + seconds
        while (now := time.time()) < until:
            self._ship_lingering(now)
            due = min((opened + self.linger_s for opened, _ in self._open.values()),
                      default=until)
            time.sleep(max(0.0, min(until, due) - now))

    def _ship_lingering(self, now: float) -> None:
        for partition, (opened, _) in list(self._open.items()):
            if now - opened >= self.linger_s:
                self._ship(partition)

    def _ship(self, partition: int) -> None:
        _, items = self._open.pop(partition)
        self._producer.send(self.topic, value=b"[" + b",".join(items) + b"]",
                            partition=partition)

    def flush(self) -> None:
        for partition in list(self._open):
            self._ship(partition)
        self._producer.flush()

    def close(self) -> None:
        self.flush()
        self._producer.close()


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
    """`Transport` over Kafka: all partitions of the input topic, idempotent producer.

    From the first `poll` on, a reader thread owns the consumer and keeps up to
    ``prefetch`` records fetched ahead, so the broker round trip and kafka-python's record
    parsing overlap the service's work instead of stalling it (kafka-python fetches again
    only once its buffer is drained). `positions` are those of the records handed out."""

    def __init__(self, bootstrap: str, topic: str, prefetch: int = 400) -> None:
        self.topic = topic
        self._consumer, self._tps = _assigned(bootstrap, topic)
        self._consumer.seek_to_beginning()
        self._producer = producer(bootstrap)
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
                records = _records(self.topic, self._consumer.poll(timeout_ms=100,
                                                                   max_records=self._chunk))
                while records and not self._stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self._chunks.put(records, timeout=0.1)
                        break
        except BaseException as e:  # handed to the service by the next poll
            self._error = e

    def positions(self) -> dict[int, int]:
        if self._reader is not None:
            return dict(self._next)
        return {tp.partition: self._consumer.position(tp) for tp in self._tps}

    def seek(self, positions: dict[int, int]) -> None:
        if self._reader is not None:
            raise RuntimeError("seek() must come before the first poll()")
        for tp in self._tps:
            if tp.partition in positions:
                self._consumer.seek(tp, positions[tp.partition])

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


def request_reply(bootstrap: str, topic: str, value: bytes, reply_topic: str,
                  is_reply: Callable[[bytes], bool], timeout_s: float) -> bytes | None:
    """Send ``value`` to ``topic`` and wait up to ``timeout_s`` for the first record of
    ``reply_topic`` published after it that ``is_reply``; None if none came."""
    consumer, tps = _assigned(bootstrap, reply_topic)
    try:
        consumer.seek_to_end()
        for tp in tps:  # resolve the lazy seek now, before the request goes out
            consumer.position(tp)
        sender = producer(bootstrap)
        sender.send(topic, value=value)
        sender.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in _records(reply_topic, consumer.poll(timeout_ms=100)):
                if is_reply(record.value):
                    return record.value
        return None
    finally:
        consumer.close()


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
            for record in _records(topic, consumer.poll(timeout_ms=200)):
                last = time.monotonic()
                yield record
    finally:
        consumer.close()


def _records(topic: str, got: dict) -> list[Record]:
    """What a ``KafkaConsumer.poll`` returned, as records in partition order."""
    return [Record(topic, m.partition, m.offset, m.value)
            for tp in sorted(got, key=lambda tp: tp.partition) for m in got[tp]]
