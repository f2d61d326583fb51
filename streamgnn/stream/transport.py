"""`Transport`: the one interface between the router and a message system. The router and
engine see records and topics, never a Kafka client.

Owns the interface only; must not import kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from streamgnn.errors import UserError

OffsetReset = Literal["refuse", "earliest", "latest"]
"""Where a saved position outside what its partition holds leaves the transport: refusing
to start (`OffsetsOutOfRange`), at the partition's oldest record, or at its end."""


class OffsetsOutOfRange(UserError):
    """Positions in an input topic outside what its partitions hold (the topic was
    recreated, or truncated by retention): consuming from them would skip records, or
    read nothing at all. ``outside``: partition -> (position, earliest, end), where the
    partition holds offsets earliest .. end - 1."""

    def __init__(self, topic: str, outside: dict[int, tuple[int, int, int]],
                 what: str) -> None:
        self.topic, self.outside = topic, outside
        super().__init__(
            f"the {what} of topic {topic} are outside what the broker holds: "
            + "; ".join(_place(p, *o) for p, o in sorted(outside.items())),
            "The topic was recreated, or truncated by retention, since they were read: "
            "resuming there would skip records. Serve with --offset-reset earliest (from "
            "the oldest record the topic holds) or --offset-reset latest (from the next "
            "one produced), or with a fresh --state-dir.")


def _place(partition: int, at: int, earliest: int, end: int) -> str:
    side = "past its end" if at > end else "before its start"
    held = (f"offsets {earliest} to {end - 1}" if end > earliest
            else f"no records; the next is offset {end}")
    return f"partition {partition} at offset {at}, {side} (it holds {held})"


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

    def seek(self, positions: dict[int, int]) -> set[int]:
        """Continue consuming from ``positions`` (from a checkpoint). Returns the
        partitions it had to move elsewhere because the topic no longer holds their
        position (where the user allowed it: ``--offset-reset``)."""
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
