"""A shard's side of the halo, one call a step: who holds what as the batch begins
(`begin_halo`), the rows of its vertices another partition holds as ghosts (`rows_for`),
and the ghost rows it is sent, their ids looked up once (`received_slots`) and the rows
copied once, from each buffer as it lies (as it arrives, where the exchange hands them
over so), into its tables, with which of them join the next superstep's sources
(`take_ghost_rows`). Each is a numba kernel (the id lookups, the
marks, the copies and comparisons, an elementwise activation); where the tables are on
another device, torch twins (``*_torch``) move the rows.

Owns these three steps only; must not import kafka or mpi4py (the buffers' wire format is
`exchange`'s).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numba import njit
from torch import Tensor

from streamgnn.graph.idmap import get_many
from streamgnn.models.transfer import download, upload
from streamgnn.prefetch import AHEAD, prefetch_row
from streamgnn.workers.exchange import (
    NO_WEIGHTS,
    as_they_arrive,
    pack_many,
    received_ids,
    received_rows,
    sizes,
    unpack,
)
from streamgnn.workers.placement import holder_bit
from streamgnn.workers.slotsets import find_marked, union_marked


@njit(cache=True)
def begin_halo(id_table, removed, added, ghosts, ghost_owners, subscribed, subscribers,
               unsubscribed, unsubscribers, ghost, ghost_owner, holders, owned, in_weight):
    """Who holds what once a batch (applied to the shard's graph: it ``removed`` and
    ``added`` these slots) begins: the slots it freed or filled hold nothing and are no
    ghosts; the ids ``ghosts`` it added are, owned by ``ghost_owners``; partition
    ``subscribers[i]`` now holds the owned id ``subscribed[i]`` and ``unsubscribers[i]``
    no longer holds ``unsubscribed[i]`` (bits of ``holders``); ``owned`` follows. A
    ghost's in-degree came from its owner: a later vertex in its slot starts at 0
    (``in_weight``). Returns the position of the first id the graph does not know among
    ``ghosts``, ``subscribed`` and ``unsubscribed`` in that order (then nothing changed)
    or -1, and the slots of ``subscribed``."""
    ids = np.concatenate((ghosts, subscribed, unsubscribed))
    slots = np.empty(len(ids), np.int64)
    get_many(id_table, ids, slots)
    sub_slots = slots[len(ghosts):len(ghosts) + len(subscribed)]
    for i in range(len(slots)):
        if slots[i] < 0:
            return i, sub_slots
    for v in removed:
        if ghost[v]:
            in_weight[v] = 0.0
        ghost[v], holders[v], owned[v] = False, 0, False
    for v in added:
        ghost[v], holders[v] = False, 0
    for i in range(len(ghosts)):
        ghost[slots[i]], ghost_owner[slots[i]] = True, ghost_owners[i]
    for i in range(len(unsubscribed)):  # (let go of before this batch: first)
        s = slots[len(ghosts) + len(subscribed) + i]
        holders[s] &= ~holder_bit(unsubscribers[i])
    for i in range(len(subscribed)):
        holders[sub_slots[i]] |= holder_bit(subscribers[i])
    for v in added:
        owned[v] = not ghost[v]
    return -1, sub_slots


@njit(cache=True)
def let_go(src, after, added, alive, ghost, out_degree, mark):
    """The ghosts a batch leaves without an edge from them: the distinct live slots,
    ascending, among the sources of the edges it deleted (``after`` NaN) and the slots it
    ``added`` that are ``ghost``s with ``out_degree`` 0. ``mark``: `SlotSets`' own."""
    values = np.empty(len(src) + len(added), np.int64)
    n = 0
    for k in range(len(src) + len(added)):
        if k < len(src) and not np.isnan(after[k]):
            continue
        s = src[k] if k < len(src) else added[k - len(src)]
        if alive[s] and ghost[s] and out_degree[s] == 0:
            values[n] = s
            n += 1
    return union_marked(values[:n], mark, mark, False)


@njit(cache=True)
def _held_by_each(moved, owned, holders, subscribed, subscribers, me, partitions, mark,
                  scratch):
    """Per partition q but ``me``, in turn: the sorted distinct slots among ``moved`` that
    are ``owned`` and held by q (bit q of ``holders``), with the ``subscribed`` ones q
    subscribed to (``subscribers``). Returns them all, q after q, and how many each q
    has."""
    values = np.empty(len(moved) + len(subscribed), np.int64)
    n = 0
    for s in moved:
        if owned[s] and holders[s]:
            values[n] = s
            n += 1
    for s in subscribed:
        values[n] = s
        n += 1
    slots = union_marked(values[:n], mark, mark, False)
    for i in range(len(slots)):
        scratch[slots[i]] = i
    held = np.zeros(len(slots), np.uint64)  # per slot, who is sent it
    for s in moved:
        if owned[s] and holders[s]:
            held[scratch[s]] |= holders[s]
    for i in range(len(subscribed)):
        held[scratch[subscribed[i]]] |= holder_bit(subscribers[i])
    others = ~holder_bit(me)
    counts = np.zeros(partitions, np.int64)
    for i in range(len(slots)):
        h = held[i] & others
        held[i] = h
        for q in range(partitions):
            if h & holder_bit(q):
                counts[q] += 1
    at = np.zeros(partitions, np.int64)  # where q's next slot goes
    for q in range(1, partitions):
        at[q] = at[q - 1] + counts[q - 1]
    out = np.empty(counts.sum(), np.int64)
    for i in range(len(slots)):
        h = held[i]
        for q in range(partitions):
            if h & holder_bit(q):
                out[at[q]] = slots[i]
                at[q] += 1
    return out, counts


def rows_for(me: int, partitions: int, moved: np.ndarray, owned: np.ndarray,
             holders: np.ndarray, subscribed: np.ndarray, subscribers: np.ndarray,
             table: Tensor, ext: np.ndarray, in_weight: np.ndarray | None, mark: np.ndarray,
             scratch: np.ndarray) -> list[np.ndarray]:
    """What partition ``me`` sends each partition q of the rows in ``table`` (by slot),
    packed (`exchange.pack`; empty for nothing, and for ``me``): those of the ``moved``
    slots that are ``owned`` and that q holds (`placement.held_by` of ``holders``), and of
    the ``subscribed`` slots whose ``subscribers`` entry is q (it began to hold them), in
    slot order, with their external ids (``ext``) and, given ``in_weight``, their
    in-degrees. All buffers are written by one kernel into one allocation
    (`exchange.pack_many`). ``mark`` and ``scratch``: `SlotSets`' own."""
    slots, counts = _held_by_each(moved, owned, holders, subscribed, subscribers, me,
                                  partitions, mark, scratch)
    none = np.zeros(0, np.uint8)
    if not len(slots):
        return [none] * partitions
    gather = gather_rows_numba if table.device.type == "cpu" else gather_rows_torch
    rows, at = gather(table, slots)
    weighted = in_weight is not None
    buffer, offsets, sizes = pack_many(counts, slots, rows, at, ext,
                                       in_weight if weighted else NO_WEIGHTS, weighted)
    return [buffer[o:o + n] if n else none
            for o, n in zip(offsets.tolist(), sizes.tolist(), strict=True)]




def gather_rows_numba(table: Tensor, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`gather_rows_torch` for tables on the CPU: the table itself, read at ``slots``."""
    return table.numpy(), slots


def gather_rows_torch(table: Tensor, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``slots`` in ``table`` on the host: an array and the row of it holding
    each slot's."""
    rows = download(table.index_select(0, upload(table.device, slots)[0]))[0]
    return rows, np.arange(len(slots))


@njit(cache=True)
def received_slots(buffer, id_table, ghost, in_weight):
    """The slot of each id a non-empty `exchange.pack` buffer carries, looked up once in
    the graph's ``id_table``: -1 where the graph holds no ghost of it (rows of a vertex it
    no longer holds as a ghost: not taken). Where the buffer carries in-degrees, each
    ghost's is stored in ``in_weight``. Returns the slots, the ghosts whose in-degree
    changed and whether the buffer carries in-degrees."""
    ids, weights = received_ids(buffer)
    slots = np.empty(len(ids), np.int64)
    get_many(id_table, ids, slots)
    degree = np.empty(len(weights), np.int64)
    m = 0
    for i in range(len(ids)):
        s = slots[i]
        if s >= 0 and not ghost[s]:
            slots[i] = -1
        elif s >= 0 and len(weights):
            if in_weight[s] != weights[i]:
                degree[m] = s
                m += 1
            in_weight[s] = weights[i]
    return slots, degree[:m], len(weights) > 0


@njit(cache=True)
def _take_one(buffer, id_table, ghost, in_weight, table, relu, added, joined, k, joined_old,
              m, old, o, degree, d, mark):
    """`take_ghost_rows` of one buffer: the joining ghosts written from ``joined[k]``, the
    replaced ones from ``joined_old[m]``, their old rows from ``old[o]`` and the ghosts
    whose in-degree changed from ``degree[d]``; ``joined[:k]`` are the sources so far.
    Returns the next k, m, o, d and whether the buffer carries in-degrees."""
    slots, changed, weighted = received_slots(buffer, id_table, ghost, in_weight)
    degree[d:d + len(changed)] = changed
    rows = received_rows(buffer, table)
    n, width = len(slots), table.shape[1]
    for a in added:
        mark[a] = True
    fresh = np.zeros(n, np.bool_)
    for i in range(n):
        if slots[i] >= 0:
            fresh[i] = mark[slots[i]]
    for a in added:
        mark[a] = False
    sources = k
    for s in joined[:sources]:
        mark[s] = True
    zero = table.dtype.type(0)
    for i in range(n):
        if i + AHEAD < n and slots[i + AHEAD] >= 0:
            prefetch_row(table, slots[i + AHEAD])
        r = slots[i]
        if r < 0:
            continue
        differs = fresh[i]
        for j in range(width):
            differs |= table[r, j] != rows[i, j]
        if differs and not mark[r]:  # a ghost moved that is not a source yet
            joined[k] = r
            k += 1
            if not fresh[i]:
                joined_old[m] = r
                m += 1
                for j in range(width):
                    v = table[r, j]
                    old[o, j] = zero if relu and v < zero else v
                o += 1
        table[r] = rows[i]
    for s in joined[:sources]:
        mark[s] = False
    return k, m, o, d + len(changed), weighted


def take_ghost_rows_numba(buffers: Sequence[np.ndarray], id_table: tuple,
                          ghost: np.ndarray, in_weight: np.ndarray, table: Tensor,
                          relu: bool, added: np.ndarray, sources: np.ndarray,
                          old_slots: np.ndarray, mark: np.ndarray, scratch: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, Tensor, np.ndarray, bool]:
    t = table.numpy()
    most = sum(sizes(buffers)) // (8 + t.shape[1] * t.itemsize)  # rows at most
    joined = np.empty(len(sources) + most, np.int64)
    joined[:len(sources)] = sources
    joined_old = np.empty(len(old_slots) + most, np.int64)
    joined_old[:len(old_slots)] = old_slots
    old, degree = np.empty((most, t.shape[1]), t.dtype), np.empty(most, np.int64)
    ends = [(len(sources), len(old_slots), 0, 0)]  # k, m, o, d after each buffer taken
    taken, weighted = [], False
    for q, buffer in as_they_arrive(buffers):
        if len(buffer):
            k, m, o, d = ends[-1]
            *end, weighted = _take_one(buffer, id_table, ghost, in_weight, t, relu, added,
                                       joined, k, joined_old, m, old, o, degree, d, mark)
            ends.append(tuple(end))
            taken.append(q)
    k, m, o, d = ends[-1]
    out = [joined[:k], joined_old[:m], old[:o], degree[:d]]
    if taken != sorted(taken):  # arrived out of order: each buffer's part where its peer is
        out = [_by_position(a, [e[i] for e in ends], taken) for i, a in enumerate(out)]
    return out[0], out[1], torch.from_numpy(out[2]), out[3], weighted


def _by_position(array: np.ndarray, ends: list[int], taken: list[int]) -> np.ndarray:
    """``array`` as the buffers in the order ``taken`` made it (``array[:ends[0]]`` before
    them, buffer i's part up to ``ends[i + 1]``), with the buffers' parts in the order of
    their positions."""
    order = np.argsort(taken, kind="stable")
    return np.concatenate([array[:ends[0]], *(array[ends[i]:ends[i + 1]] for i in order)])


def take_ghost_rows_torch(buffers: Sequence[np.ndarray], id_table: tuple, ghost: np.ndarray,
                          in_weight: np.ndarray, table: Tensor, relu: bool,
                          added: np.ndarray, sources: np.ndarray, old_slots: np.ndarray,
                          mark: np.ndarray, scratch: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, Tensor, np.ndarray, bool]:
    buffers = [buffer for buffer in buffers if len(buffer)]  # (each waited for in turn)
    found = [received_slots(buffer, id_table, ghost, in_weight) for buffer in buffers]
    slots = np.concatenate([f[0] for f in found])
    held = slots >= 0
    rows = np.concatenate([unpack(buffer).rows for buffer in buffers])[held]
    slots = slots[held]
    fresh = find_marked(added, slots, scratch, mark) >= 0
    at, new = upload(table.device, slots, rows)  # the slots and rows in one copy
    new = new.to(table.dtype)
    before = table.index_select(0, at)
    table[at] = new
    moved = download((new != before).any(dim=-1))[0] | fresh
    joins = moved & (find_marked(sources, slots, scratch, mark) < 0)
    replaced = np.flatnonzero(joins & ~fresh)
    old = before.index_select(0, upload(table.device, replaced)[0])
    return (np.concatenate([sources, slots[joins]]),
            np.concatenate([old_slots, slots[replaced]]), old.relu() if relu else old,
            np.concatenate([f[1] for f in found]), found[0][2])


def take_ghost_rows(buffers: Sequence[np.ndarray], id_table: tuple, ghost: np.ndarray,
                    in_weight: np.ndarray, table: Tensor, relu: bool, added: np.ndarray,
                    sources: np.ndarray, old_slots: np.ndarray, mark: np.ndarray,
                    scratch: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, Tensor, np.ndarray, bool]:
    """Store the rows the `exchange.pack` buffers ``buffers`` carry (a list, or an
    `exchange.Arriving` sequence: on the CPU each is taken as it arrives) into ``table``,
    read from the buffers as they lie, each at its ghost's slot, looked up once in the
    graph's ``id_table`` (`received_slots`: the rows of ids the graph holds no
    ``ghost`` of are not taken; in-degrees sent are stored in ``in_weight``). A ghost whose
    row changed (every one the batch ``added``) and that is not among the ``sources`` yet
    joins them. Returns ``sources`` then the joining ghosts, ``old_slots`` then those of
    them the batch did not add, those ghosts' rows before (ReLU'd where ``relu``), the
    ghosts whose in-degree changed and whether the buffers carry in-degrees. ``mark`` /
    ``scratch``: `SlotSets`' own (int64 ``sources``, ``old_slots`` and ``added``). The
    buffers' ids are distinct (each ghost's rows come from its one owner), so what each
    buffer adds is the same whichever comes first, and the results list it in the buffers'
    order, bit for bit as taken in that order."""
    kernel = take_ghost_rows_numba if table.device.type == "cpu" else take_ghost_rows_torch
    return kernel(buffers, id_table, ghost, in_weight, table, relu, added, sources,
                  old_slots, mark, scratch)
