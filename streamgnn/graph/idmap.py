"""`IdMap`: external int64 vertex ids <-> internal int32 slots, and `Slotted`, the id
lookups of a class that keeps one (the graph, the directory). ``ext[slot]`` is the id of
a slot; the reverse direction is an open-addressing hash table (linear probing) of int32
cells, each a slot (the key of a cell is ``ext`` of its slot) and, in the bits above the
widest slot, a tag: more bits of the key's hash, so that a search reads the ``ext`` of
nearly no slot but its key's. The table has any number of cells: a key's home cell is the
high half of its multiplicative hash scaled to the table (fastrange), so a table made anew
holds its keys at load 0.6 and grows at 0.7, 5.7-6.7 bytes a key (a power-of-two table's
load fell to 0.35 after each doubling: 11.4 bytes a key). Its operations run in numba; the
single-key functions are called from other kernels.

Owns the id table only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streamgnn.allocator import lengthened
from streamgnn.errors import UnknownVertexError
from streamgnn.prefetch import prefetch

_EMPTY, _GONE = -1, -2
_MAX_LOAD = 0.7  # live plus deleted cells, as a fraction of the table
_FILL = 0.6  # the load of a table made anew: it takes 1/6 more keys before the next
_PREFETCHED = 3  # cells `prefetch_key` looks through for a tag that matches


@njit(cache=True, inline="always")
def _hash(key):
    return key * -7046029254386353131  # 0x9E3779B97F4A7C15, wraps in int64


@njit(cache=True, inline="always")
def _home(h, n):
    """The home cell of hash ``h`` in a table of ``n`` cells (n < 2**31): its high 32 bits,
    the best mixed, times n, over 2**32."""
    return ((h >> 32) & 0xFFFFFFFF) * n >> 32


@njit(cache=True, inline="always")
def _tag(h, bits):
    """The bits of a cell above its slot's ``bits``: the 31 - bits hash bits below the
    home's (0 where slots take all 31)."""
    return ((h & 0xFFFFFFFF) >> (bits + 1)) << bits


@njit(cache=True)
def _cell(table, key) -> int:
    cells, ext, counts = table
    n, bits = len(cells), counts[2]
    h = _hash(key)
    i, tag = _home(h, n), _tag(h, bits)
    high = -1 << bits  # a free or deleted cell, negative, never matches a tag
    while cells[i] != _EMPTY:
        if cells[i] & high == tag and ext[cells[i] & ~high] == key:
            return i
        i += 1
        if i == n:
            i = 0
    return -1


@njit(cache=True)
def get1(table, key) -> int:
    """Slot of ``key``, or -1. ``table`` is (cells, ext, counts[live, non-empty cells,
    slot bits])."""
    cells = table[0]
    i = _cell(table, key)
    if i < 0:  # not one conditional expression: numba compiles that to slower code here
        return -1
    return cells[i] & ~(-1 << table[2][2])


@njit(cache=True)
def prefetch_cell(table, key) -> None:
    """Ask for the hash cell where the search for ``key`` starts (a hint, first of two)."""
    cells = table[0]
    prefetch(cells.ctypes.data + _home(_hash(key), len(cells)) * cells.itemsize)


@njit(cache=True)
def prefetch_key(table, key) -> None:
    """Ask for the id of the first slot from that cell on whose tag matches (second hint,
    once the cell is cached): `get1` then finds ``key`` in cache, as it nearly always is
    that one."""
    cells, ext, counts = table
    n, bits = len(cells), counts[2]
    h = _hash(key)
    i, tag = _home(h, n), _tag(h, bits)
    high = -1 << bits
    for _ in range(_PREFETCHED):
        if cells[i] == _EMPTY:
            return
        if cells[i] & high == tag:
            prefetch(ext.ctypes.data + (cells[i] & ~high) * ext.itemsize)
            return
        i += 1
        if i == n:
            i = 0


@njit(cache=True)
def put1(table, key, slot) -> None:
    """Map ``key`` (absent; capacity reserved by the caller) to ``slot``."""
    cells, ext, counts = table
    n = len(cells)
    h = _hash(key)
    i = _home(h, n)
    while cells[i] >= 0:
        i += 1
        if i == n:
            i = 0
    if cells[i] == _EMPTY:
        counts[1] += 1
    cells[i] = slot | _tag(h, counts[2])
    ext[slot] = key
    counts[0] += 1


@njit(cache=True)
def del1(table, key) -> None:
    """Unmap ``key`` (present); ``ext`` of its slot is left as it was."""
    table[0][_cell(table, key)] = _GONE
    table[2][0] -= 1


@njit(cache=True)
def get_many(table, query, out):
    """``out[q]``: the slot of ``query[q]``, or -1 (kernels elsewhere call it)."""
    for q in range(len(query)):
        if q + 16 < len(query):
            prefetch_cell(table, query[q + 16])
        if q + 8 < len(query):
            prefetch_key(table, query[q + 8])
        out[q] = get1(table, query[q])


@njit(cache=True)
def _put_many(table, keys, slots):
    for q in range(len(keys)):
        put1(table, keys[q], slots[q])


@njit(cache=True)
def _del_many(table, keys):
    for q in range(len(keys)):
        del1(table, keys[q])


class IdMap:
    """Batch lookups, inserts and deletes of external ids; ``reserve`` keeps the load
    factor at most 0.7 so probes stay short (a table it makes anew is at 0.6). Each method
    changes the map in one step as other threads see it (its kernels hold the GIL; a
    rehashed table is filled before it replaces the old one), so a thread may `get` while
    another changes other ids."""

    def __init__(self, slot_capacity: int) -> None:
        self.ext = np.zeros(slot_capacity, np.int64)
        self.table = self._empty(slot_capacity)

    def _empty(self, keys: int) -> tuple:
        """A table for ``keys`` at load 0.6, its cells' slots as wide as ``ext`` needs."""
        cells = max(16, math.ceil(keys / _FILL))
        bits = max(1, (len(self.ext) - 1).bit_length())
        return np.full(cells, _EMPTY, np.int32), self.ext, np.array([0, 0, bits], np.int64)

    def __len__(self) -> int:
        return int(self.table[2][0])

    def get(self, ext: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 where absent."""
        ext = np.ascontiguousarray(ext, dtype=np.int64)
        out = np.empty(len(ext), np.int32)
        get_many(self.table, ext, out)
        return out

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` inserts (rehashing into a larger table if needed)."""
        if int(self.table[2][1]) + extra > _MAX_LOAD * len(self.table[0]):
            self._rehash(extra)

    def _rehash(self, extra: int) -> None:
        cells, _, counts = self.table
        slots = cells[cells >= 0] & ~(-1 << int(counts[2]))
        table = self._empty(len(slots) + extra)
        _put_many(table, self.ext[slots], slots)
        self.table = table

    def grow_slots(self, capacity: int) -> None:
        """Room for slots up to ``capacity`` (rehashing where slots need wider cells)."""
        ext = self.ext = lengthened(self.ext, capacity)
        if (capacity - 1).bit_length() > self.table[2][2]:
            self._rehash(0)
        else:
            self.table = (self.table[0], ext, self.table[2])

    def insert(self, ext: np.ndarray, slots: np.ndarray) -> None:
        """Insert ids that are absent (the caller checked)."""
        self.reserve(len(ext))
        _put_many(self.table, np.ascontiguousarray(ext, np.int64),
                  np.ascontiguousarray(slots, np.int32))

    def delete(self, ext: np.ndarray) -> None:
        """Unmap ids that are present (the caller checked)."""
        _del_many(self.table, np.ascontiguousarray(ext, np.int64))

    @property
    def nbytes(self) -> int:
        return self.table[0].nbytes + self.ext.nbytes


class Slotted:
    """Id lookups for a class that numbers its vertices by an `IdMap` ``_ids`` and marks
    live slots in ``alive`` up to ``num_slots`` (an array, or what indexes as one: the
    directory reads them from its owners)."""

    _ids: IdMap
    alive: np.ndarray

    @property
    def num_slots(self) -> int:
        """Slots ever handed out: per-vertex arrays are valid up to here."""
        raise NotImplementedError

    @property
    def ext(self) -> np.ndarray:
        """External id of each slot."""
        return self._ids.ext

    @property
    def num_vertices(self) -> int:
        return len(self._ids)

    def slots(self, ext) -> np.ndarray:
        """Internal slot of each external id; raises UnknownVertexError naming the first
        unknown one (``index`` is its position)."""
        ext = np.atleast_1d(np.asarray(ext, np.int64))
        slots = self._ids.get(ext)
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            i = int(missing[0])
            raise UnknownVertexError(f"vertex {ext[i]} is not in the graph", index=i)
        return slots

    def find(self, ext) -> np.ndarray:
        """Internal slot of each external id, -1 where it is not known."""
        return self._ids.get(np.atleast_1d(np.asarray(ext, np.int64)))

    def contains(self, ext) -> np.ndarray:
        return self.find(ext) >= 0

    def vertex_slots(self) -> np.ndarray:
        """Slots of the live vertices, ascending."""
        return np.flatnonzero(self.alive[:self.num_slots])

    def vertex_ids(self) -> np.ndarray:
        return self.ext[self.vertex_slots()]
