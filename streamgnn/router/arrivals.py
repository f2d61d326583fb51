"""`Arrivals`: the gate that keeps an update naming a vertex that has not arrived yet until
it does. Updates can arrive out of order (across topic partitions, or from several
producers); an update that names an unknown vertex waits, in order, behind that vertex's
`AddVertex`, and is released right after it. What still waits after ``wait_s`` seconds is
given up (the service dead-letters it).

The gate also remembers, per vertex, whether the updates it admitted leave it alive, for
as long as one of them is still queued: the service reports each update it takes off its
queue (`taken`), so what is remembered stays as large as the queue, however long a
backlog lasts.

Owns waiting updates only; must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from streamgnn.updates import (
    ADD_VERTEX,
    DELETE_VERTEX,
    EDGE_UPDATES,
    UPDATE_EDGE,
    AddVertex,
    DeleteVertex,
    Update,
    UpdateBatch,
)

S = TypeVar("S")  # whatever the caller tracks with an update (its source record)


@dataclass
class Waiting(Generic[S]):
    update: Update
    source: S
    vertex: int       # the missing vertex it waits for
    deadline: float   # time.time() after which it is given up


def referenced(u: Update) -> tuple[int, ...]:
    """Vertices that must exist before ``u`` can apply."""
    if isinstance(u, EDGE_UPDATES):
        return (u.src, u.dst)
    return () if isinstance(u, AddVertex) else (u.id,)


class Arrivals(Generic[S]):
    """Admits updates in arrival order. ``exists(ids)`` says which vertices the graph holds
    now; the gate tracks what admitted updates add and delete until the service has taken
    them off its queue (`taken`, `all_applied`)."""

    def __init__(self, exists: Callable[[np.ndarray], np.ndarray], wait_s: float) -> None:
        self.exists = exists
        self.wait_s = wait_s
        self.waiting: dict[int, list[Waiting[S]]] = {}
        self._admitted: dict[int, bool] = {}  # vertex -> alive after what was admitted
        self._latest: dict[int, int] = {}     # vertex -> number of the update that said so
        self._order: deque[tuple[int, int]] = deque()  # (number, vertex), admission order
        self._count = 0  # updates admitted (numbered 1, 2, ...)
        self._taken = 0  # ... of which the service took this many off its queue

    def __len__(self) -> int:
        return sum(len(w) for w in self.waiting.values())

    def admit(self, items: Iterable[tuple[Update, S]], now: float | None = None
              ) -> list[tuple[Update, S]]:
        """The updates that may go into the batch now, in order; the rest wait."""
        items = list(items)
        now = time.time() if now is None else now
        ids = {v for u, _ in items for v in referenced(u)} - self._admitted.keys()
        if ids:
            arr = np.fromiter(ids, np.int64, len(ids))
            known = dict(zip(arr.tolist(), self.exists(arr).tolist()))
        else:
            known = {}
        out: list[tuple[Update, S]] = []
        for u, source in items:
            self._admit(u, source, now + self.wait_s, known, out)
        return out

    def _admit(self, u: Update, source: S, deadline: float, known: dict[int, bool],
               out: list[tuple[Update, S]]) -> None:
        for v in referenced(u):
            alive = self._admitted.get(v, known.get(v))
            if alive is None:
                alive = bool(self.exists(np.array([v], np.int64))[0])
            if not alive:
                self.waiting.setdefault(v, []).append(Waiting(u, source, v, deadline))
                return
        out.append((u, source))
        self.track(u)
        if isinstance(u, AddVertex):
            for w in self.waiting.pop(u.id, []):
                self._admit(w.update, w.source, w.deadline, known, out)

    def admit_columns(self, batch: UpdateBatch) -> bool:
        """Admit all of ``batch`` at once if `admit` would, in its order, with none of its
        updates waiting and none releasing a waiting one; else change nothing and return
        False (the caller then admits its updates one by one)."""
        op, a = batch.op, batch.src
        events = np.flatnonzero((op == ADD_VERTEX) | (op == DELETE_VERTEX))
        added = a[op == ADD_VERTEX]
        if self.waiting and not self.waiting.keys().isdisjoint(added.tolist()):
            return False
        edge = op <= UPDATE_EDGE
        ref_rows = np.concatenate([np.flatnonzero(op != ADD_VERTEX), np.flatnonzero(edge)])
        ref_ids = np.concatenate([a[op != ADD_VERTEX], batch.dst[edge]])
        ids = np.unique(np.concatenate([ref_ids, a[events]]))
        alive = self._alive(ids)[np.searchsorted(ids, ref_ids)]
        if len(events):  # a reference after adds/deletes of its vertex sees the last one
            n = len(op) + 1  # keys: the vertex's rank, then the row
            keys = np.searchsorted(ids, a[events]) * n + events
            order = np.argsort(keys)
            event_keys, event_rows = keys[order], events[order]
            ref_keys = np.searchsorted(ids, ref_ids) * n + ref_rows
            last = np.searchsorted(event_keys, ref_keys) - 1  # the last one before the row
            mine = (last >= 0) & (event_keys[np.maximum(last, 0)] // n == ref_keys // n)
            alive[mine] = op[event_rows[last[mine]]] == ADD_VERTEX
        if not alive.all():
            return False
        for row, code, vertex in zip(events.tolist(), op[events].tolist(),
                                     a[events].tolist(), strict=True):
            self._note(vertex, code == ADD_VERTEX, self._count + row + 1)
        self._count += len(op)
        return True

    def _alive(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` exists after what was admitted."""
        alive = np.asarray(self.exists(ids), bool).copy()
        if self._admitted:  # a message's ids looked up, not every tracked id sorted
            admitted = self._admitted.get
            for i, v in enumerate(ids.tolist()):
                if (known := admitted(v)) is not None:
                    alive[i] = known
        return alive

    def track(self, u: Update) -> None:
        """Count an admitted update (or, after a restart, an update admitted before and
        still queued) and note what it adds or deletes."""
        self._count += 1
        if isinstance(u, AddVertex):
            self._note(u.id, True, self._count)
        elif isinstance(u, DeleteVertex):
            self._note(u.id, False, self._count)

    def _note(self, vertex: int, alive: bool, number: int) -> None:
        self._admitted[vertex] = alive
        self._latest[vertex] = number
        self._order.append((number, vertex))

    def taken(self, n: int) -> None:
        """The service took the next ``n`` admitted updates off its queue (to apply them
        or give them up): from then on the graph says what they did."""
        self._taken += n
        while self._order and self._order[0][0] <= self._taken:
            number, vertex = self._order.popleft()
            if self._latest[vertex] == number:
                del self._admitted[vertex], self._latest[vertex]

    def all_applied(self) -> None:
        """Everything admitted was applied: the graph itself now says what exists."""
        self._admitted.clear()
        self._latest.clear()
        self._order.clear()
        self._taken = self._count

    def expired(self, now: float | None = None) -> list[Waiting[S]]:
        """Remove and return what waited past its deadline."""
        now = time.time() if now is None else now
        gone: list[Waiting[S]] = []
        for v in list(self.waiting):
            keep = [w for w in self.waiting[v] if w.deadline > now]
            gone += [w for w in self.waiting[v] if w.deadline <= now]
            if keep:
                self.waiting[v] = keep
            else:
                del self.waiting[v]
        return gone
