"""`Directory`: the coordinator's map of the vertices, without edges or features: which ids
exist and which partition owns each. It decides, in batch order, every question of a batch
that depends on vertices alone (an id known or not, a duplicate vertex, a feature vector's
width and values, a weight's value, a self-loop) and sends each remaining update to the
partition that can decide the rest: an edge update to its destination's owner (which keeps
the edges into its vertices: a duplicate or missing edge is found there), a vertex's
features to its owner, a vertex deletion to every partition (it cascades to edges anywhere).

Vertex decisions never depend on edge decisions (a deletion removes a vertex whatever its
edges), so one round of messages gives every rejection: the directory's, then each owner's
in the order of its share of the batch (`DynamicGraph.apply` with ``ghosts=True``).

Owns the vertex map and its batch kernel; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from streamgnn.errors import InvalidUpdateError
from streamgnn.graph.batch import (
    BAD_DIMENSION,
    BAD_W,
    BAD_X,
    DUPLICATE_VERTEX,
    OK,
    SELF_LOOP,
    UNKNOWN_A,
    UNKNOWN_B,
    _row_within,
    find_sorted,
    take_slot,
)
from streamgnn.graph.idmap import IdMap, Slotted, del1, get1, put1
from streamgnn.graph.store import error_for
from streamgnn.updates import (
    ADD_EDGE,
    ADD_VERTEX,
    BAD_WIDTH,
    DELETE_EDGE,
    DELETE_VERTEX,
    UPDATE_EDGE,
    UpdateBatch,
    ValueLimits,
)

EVERY = -1  # the target of a vertex deletion: every partition
FREE = -2  # the owner of a slot no vertex has (-1: a vertex the batch adds, to be placed)
STRATEGIES = ("metis", "hash", "stream")  # placements (a checkpoint stores the index)
HIGH_FACTOR = 2.0  # the high in-degree set: more in-edges than this times the mean
HIGH_EVERY = 500_000  # updates between the set's refreshes (RIPPLE++'s; 0: never)


@njit(cache=True)
def decide_kernel(enc, ids, owner, free, counts, limits, skip, status, us, vs):
    """Decide updates in order. ``enc`` = the `UpdateBatch` columns; ``ids`` the IdMap
    table; ``owner`` per directory slot (-1: to be placed); ``counts`` = [free top,
    slots used]. Writes ``status`` per update (OK: passed on) and the directory slots
    ``us``/``vs`` of its endpoints. Slots a batch deletes keep their owners until
    `Directory.commit` and are not reused within it.
    Returns the number of updates decided: all of them, or (without ``skip``) up to and
    including the first rejected one."""
    op, a, b, w, xrow, xnew = enc
    for i in range(len(op)):
        code = op[i]
        status[i] = OK
        if code <= UPDATE_EDGE:
            u, v = get1(ids, a[i]), get1(ids, b[i])
            us[i], vs[i] = u, v
            if u < 0:
                status[i] = UNKNOWN_A
            elif v < 0:
                status[i] = UNKNOWN_B
            elif code != DELETE_EDGE and not abs(w[i]) <= limits[1]:
                status[i] = BAD_W
            elif code == ADD_EDGE and u == v:
                status[i] = SELF_LOOP
        elif code == DELETE_VERTEX:
            u = get1(ids, a[i])
            us[i] = u
            if u < 0:
                status[i] = UNKNOWN_A
            else:
                del1(ids, a[i])
        else:
            r = xrow[i]
            u = get1(ids, a[i])
            us[i] = u
            if r == BAD_WIDTH:
                status[i] = BAD_DIMENSION
            elif not _row_within(xnew, r, limits[0]):
                status[i] = BAD_X
            elif code == ADD_VERTEX:
                if u >= 0:
                    status[i] = DUPLICATE_VERTEX
                else:
                    u = take_slot(free, counts, 1)
                    put1(ids, a[i], u)
                    owner[u] = -1
                    us[i] = u
            elif u < 0:
                status[i] = UNKNOWN_A
        if status[i] != OK and not skip:
            return i + 1
    return len(op)


@dataclass
class Decided:
    """A batch as the directory decided it: the updates it passed on (``passed``, batch
    positions ascending), per passed update the partition it goes to (`EVERY`: all) and,
    for edge updates, the partition owning the source (-1 otherwise); the directory's
    rejections (atomically: the first alone, and nothing passed after it); and what
    `Directory.commit` or `Directory.undo` needs."""

    passed: np.ndarray
    target: np.ndarray
    source_owner: np.ndarray
    rejected: list[InvalidUpdateError]
    _enc: UpdateBatch
    _decided: int
    _status: np.ndarray
    _us: np.ndarray
    _counts: np.ndarray

    @property
    def removed(self) -> np.ndarray:
        """Ids of the vertices the batch deleted that were in the graph before it (a slot
        the batch frees is reused only after it: a vertex it added has a slot of its own)."""
        n = self._decided
        ok, op, slots = self._status[:n] == OK, self._enc.op[:n], self._us[:n]
        deleted = ok & (op == DELETE_VERTEX)
        before = ~find_sorted(np.sort(slots[ok & (op == ADD_VERTEX)]), slots[deleted])[1]
        return self._enc.src[:n][deleted][before]


class _Alive:
    """A directory's live flags as its owners give them (`FREE`: none), indexed as an
    array is: no byte a slot of their own."""

    def __init__(self, directory: Directory) -> None:
        self._directory = directory

    def __len__(self) -> int:
        return len(self._directory.owner)

    def __getitem__(self, at: int | slice | np.ndarray) -> np.ndarray:
        return self._directory.owner[at] != FREE


class Directory(Slotted):
    """Which vertex ids exist and the partition owning each (``owner`` by directory
    slot, `FREE` where none), with the partitions' loads; new vertices are placed by
    ``place``. A vertex takes its id (8 bytes), its owner (1) and 5.7-6.7 bytes of id map
    cells."""

    def __init__(self, ids: np.ndarray, owner: np.ndarray, num_partitions: int,
                 num_features: int, limits: ValueLimits | None = None,
                 strategy: str = "metis", high_every: int | None = None) -> None:
        """``high_every``: updates between refreshes of the high in-degree set (default
        `HIGH_EVERY`)."""
        n = len(ids)
        capacity = max(n, 16)
        self.num_partitions, self.num_features = num_partitions, num_features
        self.strategy = strategy  # how ``place`` places new vertices
        self.limits = limits or ValueLimits()
        self._ids = IdMap(capacity)
        self._ids.insert(np.asarray(ids, np.int64), np.arange(n, dtype=np.int32))
        self.owner = np.full(capacity, FREE, np.int8)  # partitions number 64 at most
        self.owner[:n] = owner
        self.alive = _Alive(self)
        self._free = np.zeros(16, np.int32)  # a stack of slots to reuse (grows with it)
        self._counts = np.array([0, n], np.int64)  # free top, slots used
        self.load = np.bincount(owner, minlength=num_partitions).astype(np.int64)
        self.high: np.ndarray | None = None  # high in-degree slots, ascending (None: unnamed)
        self.high_every = HIGH_EVERY if high_every is None else high_every
        # batches and updates committed, the updates when the set was last asked for,
        # and the set asked for (ids; None until the partitions answer) with the batch it
        # places from (None: none asked)
        self._batches = self._updates = self._asked_at = 0
        self._asked: np.ndarray | None = None
        self._asked_from: int | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        n = int(self._counts[1])
        return {"ids": self._ids.ext[:n], "owner": self.owner[:n], "alive": self.alive[:n],
                "free": self._free[:int(self._counts[0])],
                "meta": np.array([self.num_partitions, self.num_features,
                                  STRATEGIES.index(self.strategy)]),
                "limits": np.array([self.limits.features, self.limits.weights]),
                "refresh": np.array([self.high_every, self._batches, self._updates,
                                     self._asked_at, -1 if self._asked_from is None
                                     else self._asked_from]),
                **({} if self.high is None else {"high": self.ext[self.high]}),
                **({} if self._asked is None else {"asked": self._asked})}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Directory:
        alive = arrays["alive"]
        parts, features, strategy = (int(v) for v in arrays["meta"])
        d = cls(arrays["ids"][alive], arrays["owner"][alive], parts, features,
                ValueLimits(*(float(v) for v in arrays["limits"])), STRATEGIES[strategy])
        n = len(alive)  # the same slots as before: free ones stay free
        d._reserve(n)
        d._ids = IdMap(max(n, 16))
        d._reserve(0)
        slots = np.flatnonzero(alive).astype(np.int32)
        d._ids.grow_slots(len(d.owner))
        d._ids.insert(arrays["ids"][alive], slots)
        d.owner[:n] = np.where(alive, arrays["owner"], FREE)
        free = arrays["free"]
        d._free = np.concatenate([free, np.zeros(16, np.int32)]).astype(np.int32)
        d._counts[:] = (len(free), n)
        if "high" in arrays:  # (a directory written before it named one names it anew)
            d.mark_high(arrays["high"])
        if "refresh" in arrays:
            d.high_every, d._batches, d._updates, d._asked_at, asked_from = (
                int(v) for v in arrays["refresh"])
            d._asked_from = None if asked_from < 0 else asked_from
            d._asked = arrays.get("asked")
        return d

    @property
    def nbytes(self) -> int:
        return (self._ids.nbytes + self.owner.nbytes + self._free.nbytes
                + (0 if self.high is None else self.high.nbytes))

    @property
    def num_slots(self) -> int:
        return int(self._counts[1])

    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The partition owning each of ``ids`` (-1: not in the graph)."""
        slots = self._ids.get(ids)
        return np.where(slots >= 0, self.owner[np.maximum(slots, 0)], -1)

    def decide(self, batch: UpdateBatch, skip_invalid: bool = False) -> Decided:
        """Decide ``batch``'s vertex questions in order and say where each update it
        passes goes; then `commit` it, or `undo` it (a partition rejected an update of a
        batch that applies whole or not at all). Atomically (without ``skip_invalid``)
        the directory stops at its first rejection: the partitions decide the updates
        before it, and the batch's first rejection is theirs or that one."""
        enc = batch.with_width(self.num_features)
        n = len(enc)
        self._reserve(int(np.count_nonzero(enc.op == ADD_VERTEX)))
        status = np.zeros(n, np.int8)
        us = np.full(n, -1, np.int64)
        vs = np.full(n, -1, np.int64)
        counts = self._counts.copy()
        limits = np.array([self.limits.features, self.limits.weights], np.float64)
        done = decide_kernel((enc.op, enc.src, enc.dst, enc.w, enc.xrow, enc.x),
                             self._ids.table, self.owner, self._free,
                             self._counts, limits, skip_invalid, status, us, vs)
        bad = np.flatnonzero(status[:done] != OK)
        passed = np.flatnonzero(status[:done] == OK)
        op = enc.op[passed]
        added = us[passed][op == ADD_VERTEX]
        self.place(added, self._toward_high(added, op, us[passed], vs[passed]))
        edge = op <= UPDATE_EDGE
        # a slot keeps its owner while it lives: the owner at each update's time
        target = np.where(op == DELETE_VERTEX, EVERY,
                          self.owner[np.where(edge, vs[passed], us[passed])])
        source_owner = np.where(edge, self.owner[us[passed]], -1)
        return Decided(passed, target.astype(np.int64), source_owner.astype(np.int64),
                       [error_for(int(status[i]), int(i), enc, self.num_features,
                                  self.limits) for i in bad], enc, done, status, us, counts)

    def commit(self, decided: Decided) -> None:
        """The batch stands: the slots it deleted become free, to be reused."""
        d = decided
        gone = d._us[:d._decided][(d._enc.op[:d._decided] == DELETE_VERTEX)
                                  & (d._status[:d._decided] == OK)]
        np.subtract.at(self.load, self.owner[gone], 1)
        self.owner[gone] = FREE
        if len(gone) and self.high is not None:
            at, hit = find_sorted(self.high, gone)
            self.high = np.delete(self.high, at[hit])
        self._batches += 1
        self._updates += len(d._enc)
        top = int(self._counts[0])
        if top + len(gone) > len(self._free):
            self._free = np.concatenate([self._free[:top], gone, np.zeros(
                max(16, top + len(gone)) // 4, np.int32)]).astype(np.int32)
        self._free[top:top + len(gone)] = gone
        self._counts[0] += len(gone)

    def undo(self, decided: Decided) -> None:
        """Back to the directory as it was before the batch."""
        d, enc = decided, decided._enc
        ok = np.flatnonzero(d._status[:d._decided] == OK)
        op = enc.op[ok]
        changed = ok[(op == ADD_VERTEX) | (op == DELETE_VERTEX)]
        for i in reversed(changed.tolist()):
            if enc.op[i] == ADD_VERTEX:
                self._ids.delete(enc.src[i:i + 1])
                self.load[self.owner[d._us[i]]] -= 1
                self.owner[d._us[i]] = FREE
            else:
                self._ids.insert(enc.src[i:i + 1], d._us[i:i + 1].astype(np.int32))
        self._counts[:] = d._counts

    @property
    def high_due(self) -> bool:
        """Whether the high in-degree set is still to be named (`mark_high`), for a
        strategy that places by locality: before the first batch. Checkpoints keep it."""
        return self.strategy != "hash" and self.high is None

    def asking(self) -> bool:
        """After a batch committed: whether to ask the partitions for the high in-degree
        set now, as that batch left them (RIPPLE++'s refresh: at the first batch boundary
        ``high_every`` updates after the last time; 0: never). The set asked for after
        batch i places from batch i + 2 (`answered` takes it, `use_asked` puts it in
        place): batch i is collected by then, whatever was in flight (two batches at
        most), so every run of the same batches, a replay from a checkpoint included,
        places every vertex alike. Checkpoints keep the schedule and a set asked for and
        not yet in place."""
        if (self.high is None or self.high_every <= 0 or self._asked_from is not None
                or self._updates - self._asked_at < self.high_every):
            return False
        self._asked_at = self._updates
        self._asked_from = self._batches + 1  # the batch after next (batches count from 0)
        return True

    def answered(self, ids: np.ndarray) -> None:
        """The partitions' answer to the last `asking` (the ids of the set)."""
        self._asked = ids

    def use_asked(self) -> None:
        """Before a batch: the set asked for after the batch before the last, from now on."""
        if self._asked_from != self._batches:
            return
        if self._asked is None:
            raise RuntimeError("the high in-degree set asked for two batches ago has no "
                               "answer: the batch it was asked after was not collected")
        self.mark_high(self._asked)
        self._asked = self._asked_from = None

    def mark_high(self, ids: np.ndarray) -> None:
        """The high in-degree set: these ids (the partitions name them:
        `Workers.high_in_degree`)."""
        slots = self._ids.get(ids)
        self.high = np.sort(slots[slots >= 0])

    def place(self, slots: np.ndarray, toward: np.ndarray | None = None) -> None:
        """Owners for the vertices the batch added (directory ``slots``, in batch order):
        with the ``hash`` strategy ``id % P``; else RIPPLE++'s Algorithm 1: the owner of
        the high in-degree vertex the new one sends its first edge to (``toward``, a slot
        per added vertex, -1: none), or the least-loaded partition, in turn."""
        if self.strategy == "hash":
            owner = self.ext[slots] % self.num_partitions
            self.owner[slots] = owner
            np.add.at(self.load, owner, 1)
            return
        toward = np.full(len(slots), -1, np.int64) if toward is None else toward
        _place_kernel(slots.astype(np.int64), toward.astype(np.int64), self.owner, self.load)

    def _toward_high(self, added: np.ndarray, op: np.ndarray, us: np.ndarray,
                     vs: np.ndarray) -> np.ndarray | None:
        """Per vertex ``added`` (slots), the destination of the first edge the batch
        adds from it into a high in-degree vertex (-1: none); None where there is no
        such edge (``op``, ``us``, ``vs``: the passed updates and their endpoints)."""
        if not len(added) or self.high is None or not len(self.high):
            return None
        edge = op == ADD_EDGE
        src, dst = us[edge], vs[edge]
        into = find_sorted(self.high, dst)[1]
        src, dst = src[into], dst[into]
        if not len(src):
            return None
        firsts, first = np.unique(src, return_index=True)  # each source's first such edge
        where, sends = find_sorted(firsts, added)
        return np.where(sends, dst[first[where]], -1)

    def _reserve(self, adds: int) -> None:
        self._ids.reserve(adds)
        need = int(self._counts[1]) + adds
        if need > len(self.owner):
            size = max(need, len(self.owner) * 5 // 4)
            self._ids.grow_slots(size)
            owner = np.full(size, FREE, np.int8)
            owner[:len(self.owner)] = self.owner
            self.owner = owner


@njit(cache=True)
def _place_kernel(slots, toward, owner, load):
    """`Directory.place`'s Algorithm 1, vertex by vertex in batch order: the owner of the
    high in-degree vertex ``toward`` it first sends to, else the least-loaded partition
    (the lowest-numbered of the least loaded), each placement counted before the next."""
    for k in range(len(slots)):
        t = toward[k]
        q = owner[t] if t >= 0 and owner[t] >= 0 else np.argmin(load)
        owner[slots[k]] = q
        load[q] += 1

