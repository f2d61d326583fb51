"""`Pending`: the updates the service admitted and has not applied yet, in order, as
they came: single updates with their source (`Item`) and the rows of columnar messages,
still in columns (`AdmittedColumns`); and `Cut`, a batch taken from the front, as the
engine's columns.

Must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from streamgnn.router.journal import Key, runs
from streamgnn.stream.schemas import DecodedColumns
from streamgnn.stream.transport import Record
from streamgnn.updates import OP_NAMES, Update, UpdateBatch


class Origin(NamedTuple):
    """Where an update came from: a record, and its position in the record's array or
    columns (None when the record is one update)."""

    record: Record
    index: int | None = None

    @property
    def key(self) -> Key:
        r = self.record
        return (r.partition, r.offset, -1 if self.index is None else self.index)


Item = tuple[Update, Origin]


class AdmittedColumns(NamedTuple):
    """The decoded rows of one columns record, admitted together."""

    rows: DecodedColumns
    record: Record

    def items(self) -> list[Item]:
        """The rows as update objects (for the paths that take one update at a time)."""
        return [(self.rows.update(j), Origin(self.record, i))
                for j, i in enumerate(self.rows.index.tolist())]


Entry = Item | AdmittedColumns


def size(entry: Entry) -> int:
    """How many updates ``entry`` holds."""
    return len(entry.rows) if isinstance(entry, AdmittedColumns) else 1


class Pending:
    """Admitted updates in order, counted in updates (``len``)."""

    def __init__(self, entries: list[Entry] | None = None) -> None:
        self.entries: list[Entry] = entries or []
        self._n = sum(map(size, self.entries))

    def __len__(self) -> int:
        return self._n

    def extend(self, entries: list[Entry]) -> None:
        self.entries += entries
        self._n += sum(map(size, entries))

    def take(self, n: int) -> list[Entry]:
        """Remove and return the first ``n`` updates (a run cut where ``n`` falls)."""
        if n <= 0:
            return []
        out: list[Entry] = []
        left = n
        for i, entry in enumerate(self.entries):
            k = size(entry)
            if k > left:
                head, tail = entry.rows[:left], entry.rows[left:]
                out.append(AdmittedColumns(head, entry.record))
                self.entries = [AdmittedColumns(tail, entry.record), *self.entries[i + 1:]]
                left = 0
                break
            out.append(entry)
            left -= k
            if not left:
                self.entries = self.entries[i + 1:]
                break
        else:
            self.entries = []
        self._n -= n - left
        return out

    def items(self) -> list[Item]:
        """Every update as an object, runs broken into items (in place: from now on the
        entries are items)."""
        self.entries = [item for entry in self.entries for item in (
            entry.items() if isinstance(entry, AdmittedColumns) else [entry])]
        return self.entries


@dataclass(frozen=True)
class Cut:
    """A batch: ``entries`` taken from `Pending`, and their updates as the engine's
    columns (``updates``; ``starts[e]`` is entry e's first row there)."""

    entries: list[Entry]
    updates: UpdateBatch
    starts: np.ndarray

    @classmethod
    def of(cls, entries: list[Entry], num_features: int) -> Cut:
        parts: list[UpdateBatch] = []
        items: list[Update] = []
        for entry in entries:  # consecutive items go in one part
            if isinstance(entry, AdmittedColumns):
                if items:
                    parts.append(UpdateBatch.from_updates(items, num_features))
                    items = []
                parts.append(entry.rows.batch.with_width(num_features))
            else:
                items.append(entry[0])
        if items or not parts:
            parts.append(UpdateBatch.from_updates(items, num_features))
        starts = np.cumsum([0, *map(size, entries)])[:-1]
        return cls(entries, UpdateBatch.concat(parts), starts)

    def times(self) -> np.ndarray:
        """The event times its updates have (in no particular order)."""
        columns = [e for e in self.entries if isinstance(e, AdmittedColumns)]
        items = [e[0].event_time for e in self.entries if not isinstance(e, AdmittedColumns)]
        times = np.concatenate([np.array([t for t in items if t is not None], np.float64),
                                *(e.rows.times for e in columns)])
        return times[~np.isnan(times)]

    def runs(self) -> list[list[int]]:
        """Its updates by source, as the journal names them (`journal.runs`)."""
        out: list[list[int]] = []
        items: list[Key] = []
        for entry in self.entries:
            if isinstance(entry, AdmittedColumns):
                out += runs(items) + _run_runs(entry)
                items = []
            else:
                items.append(entry[1].key)
        return out + runs(items)

    def records(self) -> list[Record]:
        return [entry.record if isinstance(entry, AdmittedColumns) else entry[1].record
                for entry in self.entries]

    def item(self, row: int) -> Item:
        """Update ``row`` as an object, and where it came from."""
        e = int(np.searchsorted(self.starts, row, "right")) - 1
        entry = self.entries[e]
        if isinstance(entry, AdmittedColumns):
            j = row - int(self.starts[e])
            return entry.rows.update(j), Origin(entry.record, int(entry.rows.index[j]))
        return entry

    def counts(self) -> dict[str, int]:
        """Its updates by op."""
        return {op: n for op, n in zip(OP_NAMES, self.updates.counts().tolist(), strict=True)
                if n}


def _run_runs(run: AdmittedColumns) -> list[list[int]]:
    """`journal.runs` of a run's rows: one per stretch of consecutive positions."""
    index = run.rows.index
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    r = run.record
    return [[r.partition, r.offset, int(part[0]), len(part)]
            for part in np.split(index, breaks) if len(part)]
