"""`Transport`: the one interface between the router and a message system. The router and
engine see records and topics, never a Kafka client.

Owns the interface only; must not import kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Record:
    """One consumed message: where it came from and its raw bytes."""

    topic: str
    partition: int
    offset: int
    value: bytes


class Transport(Protocol):
    """Consumes one input topic from given positions; publishes to output topics."""

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Up to ``max_records`` next records, in offset order per partition."""
        ...

    def positions(self) -> dict[int, int]:
        """Next offset to consume, per partition of the input topic."""
        ...

    def seek(self, positions: dict[int, int]) -> None:
        """Continue consuming from ``positions`` (from a checkpoint)."""
        ...

    def lag(self) -> int | None:
        """Records of the input topic past `positions`, as far as known (None: not
        known yet)."""
        ...

    def partitions(self, topic: str) -> int:
        """How many partitions an output topic has."""
        ...

    def publish(self, topic: str, key: bytes | None, value: bytes,
                partition: int | None = None,
                on_ack: Callable[[], None] | None = None) -> None:
        """Send ``value`` to ``partition`` of ``topic`` (by default, the one ``key``
        hashes to); ``on_ack`` is called, from any thread, once the broker has it."""
        ...

    def flush(self) -> None:
        """Block until everything published is acknowledged."""
        ...

    def close(self) -> None:
        ...
