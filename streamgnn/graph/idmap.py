"""`IdMap`: external int64 vertex id -> internal int32 slot, an open-addressing hash table
whose batch operations run in numba.

Owns the id table only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EMPTY, _FULL, _GONE = 0, 1, 2


@njit(cache=True, inline="always")
def _home(key: int, mask: int) -> int:
    h = key * -7046029254386353131  # 0x9E3779B97F4A7C15, wraps in int64
    h ^= h >> 29
    return h & mask


@njit(cache=True)
def _lookup(keys, vals, state, query, out):
    mask = len(keys) - 1
    for q in range(len(query)):
        key = query[q]
        i = _home(key, mask)
        out[q] = -1
        while state[i] != _EMPTY:
            if state[i] == _FULL and keys[i] == key:
                out[q] = vals[i]
                break
            i = (i + 1) & mask


@njit(cache=True)
def _insert(keys, vals, state, new_keys, new_vals):
    """Insert keys known to be absent."""
    mask = len(keys) - 1
    for q in range(len(new_keys)):
        i = _home(new_keys[q], mask)
        while state[i] == _FULL:
            i = (i + 1) & mask
        keys[i] = new_keys[q]
        vals[i] = new_vals[q]
        state[i] = _FULL


@njit(cache=True)
def _remove(keys, state, old_keys):
    """Remove keys known to be present."""
    mask = len(keys) - 1
    for q in range(len(old_keys)):
        key = old_keys[q]
        i = _home(key, mask)
        while not (state[i] == _FULL and keys[i] == key):
            i = (i + 1) & mask
        state[i] = _GONE


class IdMap:
    """Batch lookups, inserts and removals of external ids; load factor kept <= 1/2."""

    def __init__(self, capacity: int = 1024) -> None:
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.zeros(cap, np.int64)
        self._vals = np.zeros(cap, np.int32)
        self._state = np.zeros(cap, np.uint8)
        self._size = 0
        self._used = 0  # full + gone slots: what probing sees

    def __len__(self) -> int:
        return self._size

    def get(self, ext: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 where absent."""
        ext = np.ascontiguousarray(ext, dtype=np.int64)
        out = np.empty(len(ext), np.int32)
        _lookup(self._keys, self._vals, self._state, ext, out)
        return out

    def insert(self, ext: np.ndarray, slots: np.ndarray) -> None:
        """Insert ids that are absent (the caller checked)."""
        if 2 * (self._used + len(ext)) > len(self._keys):
            live = self._state == _FULL
            keys, vals = self._keys[live], self._vals[live]
            self._alloc(4 * (self._size + len(ext)))
            _insert(self._keys, self._vals, self._state, keys, vals)
            self._size = self._used = len(keys)
        _insert(self._keys, self._vals, self._state,
                np.ascontiguousarray(ext, np.int64), np.ascontiguousarray(slots, np.int32))
        self._size += len(ext)
        self._used += len(ext)

    def remove(self, ext: np.ndarray) -> None:
        """Remove ids that are present (the caller checked)."""
        _remove(self._keys, self._state, np.ascontiguousarray(ext, np.int64))
        self._size -= len(ext)

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._vals.nbytes + self._state.nbytes
