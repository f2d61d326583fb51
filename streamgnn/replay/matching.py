"""Matching what a replay sent with what the service published about it.

`Visibility`: write-to-visible latency. Updates go one per Kafka message, so each has its
own (partition, offset) of ``graph-updates`` (known when the broker acknowledges it).
A `LabelChanges` message names the source offsets its batch consumed (``sources``: first
..last per partition); an update is visible when the first such message covering its
offset is seen. A batch that changes no label publishes nothing, so its updates are not
timed: they are counted as ``writes_without_label_change`` once a later batch's range
passes them. Batches are assumed to arrive in order (one ``label-changes`` partition, the
default); an update the arrivals gate held back past a later batch counts as visible with
the batch whose range covers it.

`Answers`: query latency, from a request's intended send time to its `QueryResult`
(matched by the request's event id); error results are counted by their error.

Pending entries are capped (`LIMIT`), so a service that stops answering cannot grow them
without bound. Owns the matching; must not import torch, kafka or the graph store.
"""

from __future__ import annotations

import threading
from collections import deque

from streamgnn.replay.recorder import Recorder

LIMIT = 1_000_000
_RECENT_RANGES = 4096


class Visibility:
    def __init__(self, recorder: Recorder, limit: int = LIMIT) -> None:
        self.recorder, self.limit = recorder, limit
        self._pending: dict[int, deque[tuple[int, float]]] = {}  # offsets ascending
        self._ranges: dict[int, deque[tuple[int, int, float]]] = {}  # (first, last, seen)
        self._horizon: dict[int, int] = {}  # highest offset any seen range reached
        self._size = 0
        self._lock = threading.Lock()

    def produced(self, partition: int, offset: int, intended: float) -> None:
        """The broker acknowledged an update (sent for ``intended``) at ``offset``."""
        with self._lock:
            if offset <= self._horizon.get(partition, -1):  # its batch was already seen
                seen = next((at for first, last, at in self._ranges[partition]
                             if first <= offset <= last), None)
                self._resolve(offset, intended, seen)
            elif self._size >= self.limit:
                self.recorder.count("writes_untracked")
            else:
                self._pending.setdefault(partition, deque()).append((offset, intended))
                self._size += 1

    def published(self, ranges: list[tuple[int, int, int]], seen: float) -> None:
        """A label-changes message naming source ranges (partition, first, last) was
        read at ``seen``."""
        with self._lock:
            for partition, first, last in ranges:
                self._ranges.setdefault(partition, deque(maxlen=_RECENT_RANGES)).append(
                    (first, last, seen))
                self._horizon[partition] = max(self._horizon.get(partition, -1), last)
                pending = self._pending.get(partition, ())
                while pending and pending[0][0] <= last:
                    offset, intended = pending.popleft()
                    self._size -= 1
                    self._resolve(offset, intended, seen if offset >= first else None)

    def _resolve(self, offset: int, intended: float, seen: float | None) -> None:
        if seen is None:
            self.recorder.count("writes_without_label_change")
        else:
            self.recorder.latency("write-to-visible", seen - intended, at=seen,
                                 completes=False)

    def outstanding(self) -> int:
        return self._size


class Answers:
    def __init__(self, recorder: Recorder, limit: int = LIMIT) -> None:
        self.recorder, self.limit = recorder, limit
        self._waiting: dict[str, float] = {}
        self._lock = threading.Lock()

    def asked(self, request_id: str, intended: float) -> bool:
        """Track a request; False (and an error counted) past the limit."""
        with self._lock:
            if len(self._waiting) >= self.limit:
                self.recorder.error("query:untracked")
                return False
            self._waiting[request_id] = intended
            return True

    def answered(self, request_id: str, error: str | None, seen: float) -> None:
        with self._lock:
            intended = self._waiting.pop(request_id, None)
        if intended is None:
            return  # another client's query
        if error is None:
            self.recorder.latency("query", seen - intended, at=seen)
        else:
            self.recorder.error(f"query:{error}", at=seen)

    def outstanding(self) -> int:
        return len(self._waiting)

    def give_up(self) -> None:
        """Count the requests still unanswered as errors (the run is over)."""
        with self._lock:
            for _ in self._waiting:
                self.recorder.error("query:no_answer")
            self._waiting.clear()
