"""Kafka helpers behind the command line and the demo: `UpdateSender` (`streamgnn
produce`), `follow` (`watch`), `request_reply` (`query`), topic creation
(`ensure_topics`) and the broker reachability check.

Owns these one-shot producer/consumer/admin uses only; the service's transport is
`kafka.KafkaTransport`. Must not import torch, mpi4py or the router.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import orjson
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from streamgnn.errors import NoBrokerError, StreamGNNError
from streamgnn.stream.kafka import assigned, producer, records
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.schemas import column_update, encode_columns
from streamgnn.stream.transport import Record
from streamgnn.updates import Update, UpdateBatch

BROKER_WAIT_S = 5.0  # how long a command waits for a broker that is not up (yet)


class SendFailed(StreamGNNError, RuntimeError):
    """The broker did not take some of the updates sent (refused them, or they expired
    unsent): how many, the first one's number and why."""


class UpdateSender:
    """Sends JSON updates to the updates topic several per message (a JSON array of up to
    ``per_message``, or with ``columns`` a `Columns` message: features in binary, the
    cheapest for the service to decode), stamping ``event_time`` where missing. An update
    goes to partition (its source vertex, or its vertex, mod the partition count), so each
    vertex's updates stay in order; a message goes when full or ``linger_s`` after its
    first update. Unparsable lines go alone, as they are, and with ``columns`` so does
    (as JSON, after what came before it) an update that columns cannot carry as it is:
    invalid, or with an ``event_id``; the service dead-letters what is bad.

    Every message's outcome is checked (a callback on its send future, so sending does
    not wait for acknowledgements): once one has failed, the next `send` raises
    `SendFailed` instead of sending more, and `flush` / `close` raise it after waiting for
    the rest, naming the updates the broker did not take (numbered from 1 in the order
    sent) and the reasons. Use it as a context manager to close it either way."""

    def __init__(self, kafka: KafkaConfig, topic: str, per_message: int = 100,
                 linger_s: float = 0.02, columns: bool = False) -> None:
        self.topic, self.per_message, self.linger_s = topic, per_message, linger_s
        self.columns = columns
        self.sent = 0  # updates handed to `send`
        self._producer = producer(kafka)
        self._partitions = len(self._producer.partitions_for(topic))
        self._open: dict[int, tuple[float, int, list]] = {}  # since, first, items
        self._lock = threading.Lock()  # failures come in on the producer's thread
        self._failed: Counter[str] = Counter()  # updates not taken, by reason
        self._first_failed: int | None = None

    def __enter__(self) -> UpdateSender:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def send(self, line: bytes) -> None:
        self._check()
        now = time.time()
        self.sent += 1
        try:
            update = orjson.loads(line)
            update.setdefault("event_time", now)
            key = int(update.get("src", update.get("id")))
        except (ValueError, AttributeError, TypeError):
            self._send(line, None, self.sent, 1)
            return
        partition = key % self._partitions
        item = column_update(update) if self.columns else orjson.dumps(update)
        if partition in self._open and (item is None
                                        or not _joins(item, self._open[partition][2])):
            self._ship(partition)  # what came before goes first
        if item is None:
            self._send(orjson.dumps(update), partition, self.sent, 1)
            return
        items = self._open.setdefault(partition, (now, self.sent, []))[2]
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
            due = min((opened + self.linger_s for opened, _, _ in self._open.values()),
                      default=until)
            time.sleep(max(0.0, min(until, due) - now))

    def _ship_lingering(self, now: float) -> None:
        for partition, (opened, _, _) in list(self._open.items()):
            if now - opened >= self.linger_s:
                self._ship(partition)

    def _ship(self, partition: int) -> None:
        _, first, items = self._open.pop(partition)
        if self.columns:
            value = encode_columns(UpdateBatch.from_updates(items, _width(items) or 0),
                                   np.array([u.event_time for u in items]))
        else:
            value = b"[" + b",".join(items) + b"]"
        self._send(value, partition, first, len(items))

    def _send(self, value: bytes, partition: int | None, first: int, count: int) -> None:
        """Send updates ``first`` .. ``first + count - 1`` as one message."""
        try:
            sent = self._producer.send(self.topic, value=value, partition=partition)
        except KafkaError as e:  # refused before it left (too large, no metadata, ...)
            self._fail(first, count, e)
            return
        sent.add_errback(self._fail, first, count)

    def _fail(self, first: int, count: int, error: BaseException) -> None:
        detail = error.args[0] if error.args and error.args[0] else getattr(
            error, "description", "")
        with self._lock:
            self._failed[f"{type(error).__name__}: {detail}" if detail
                         else type(error).__name__] += count
            self._first_failed = min(first, self._first_failed or first)

    def _check(self) -> None:
        with self._lock:
            if not self._failed:
                return
            reasons = "; ".join(f"{reason} ({n:,} updates)"
                                for reason, n in self._failed.most_common())
            raise SendFailed(f"the broker did not take {sum(self._failed.values()):,} of "
                             f"{self.sent:,} updates sent to {self.topic} (the first: update "
                             f"#{self._first_failed}): {reasons}")

    def flush(self) -> None:
        """Send what waits and wait for every acknowledgement; raises `SendFailed` if
        some updates were not taken."""
        for partition in list(self._open):
            self._ship(partition)
        self._producer.flush()
        self._check()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close()


def ensure_topics(kafka: KafkaConfig, names: list[str], partitions: int = 1,
                  timeout_s: float = BROKER_WAIT_S) -> None:
    """Create the topics that do not exist yet (waiting up to ``timeout_s`` for a broker
    to answer: `NoBrokerError` after)."""
    wait_for_broker(kafka, timeout_s)
    admin = kafka.admin(request_timeout_ms=10000)
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


def wait_for_broker(kafka: KafkaConfig, timeout_s: float = BROKER_WAIT_S) -> None:
    """Return once some broker of ``kafka`` accepts connections; `NoBrokerError` (a
    `UserError`) after ``timeout_s`` without one."""
    deadline = time.monotonic() + timeout_s
    while not reachable(kafka.bootstrap_servers):
        if time.monotonic() > deadline:
            raise NoBrokerError(f"no Kafka broker answers at {kafka.bootstrap_servers}",
                                "start the embedded one with `streamgnn broker start`, or "
                                "point --bootstrap-servers (STREAMGNN_BOOTSTRAP_SERVERS) at "
                                "your Kafka")
        time.sleep(0.1)


def request_reply(kafka: KafkaConfig, topic: str, value: bytes, reply_topic: str,
                  is_reply: Callable[[bytes], bool], timeout_s: float) -> bytes | None:
    """Send ``value`` to ``topic`` and wait up to ``timeout_s`` for the first record of
    ``reply_topic`` published after it that ``is_reply``; None if none came."""
    consumer, tps = assigned(kafka, reply_topic)
    try:
        consumer.seek_to_end()
        for tp in tps:  # resolve the lazy seek now, before the request goes out
            consumer.position(tp)
        sender = producer(kafka)
        sender.send(topic, value=value)
        sender.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in records(reply_topic, consumer.poll(timeout_ms=100)):
                if is_reply(record.value):
                    return record.value
        return None
    finally:
        consumer.close()


def follow(kafka: KafkaConfig, topic: str, from_beginning: bool = False,
           idle_s: float | None = None) -> Iterator[Record]:
    """Records of ``topic`` as they arrive (from now, or from the beginning); stops after
    ``idle_s`` seconds without one, if given."""
    wait_for_broker(kafka)
    consumer, _ = assigned(kafka, topic)
    if from_beginning:
        consumer.seek_to_beginning()
    else:
        consumer.seek_to_end()
    last = time.monotonic()
    try:
        while idle_s is None or time.monotonic() - last < idle_s:
            for record in records(topic, consumer.poll(timeout_ms=200)):
                last = time.monotonic()
                yield record
    finally:
        consumer.close()


def _joins(item: Update | bytes, items: list) -> bool:
    """Whether ``item`` may go in one message with ``items``: columns have one feature
    width."""
    mine, theirs = _width([item]), _width(items)
    return mine is None or theirs is None or mine == theirs


def _width(items: list[Update] | list[bytes]) -> int | None:
    """How many features the first of ``items`` that has features carries (None: none
    has, or they are JSON)."""
    return next((len(x) for item in items if (x := getattr(item, "x", None)) is not None),
                None)
