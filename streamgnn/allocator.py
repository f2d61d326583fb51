"""How the engine's process asks the C library and the kernel for memory: malloc keeping
freed memory (`keep_freed_memory`) but for a bootstrap's (`freed_memory_returned`), and
tables on 2 MB pages (`huge_pages`) that grow in place (`lengthened`).

By default malloc hands blocks above 128 KB back to the kernel on free (mmap) and trims
the heap's free top, so every batch's temporaries (message rows, gathered states) fault
their pages in again. Page faults are dear on virtual machines: on the 2-core VM this
project is measured on, a 3-layer GAT batch of 1,000 updates spent more than half its
time in them. `keep_freed_memory` makes malloc serve every block from its heap and keep
what is freed for reuse: the process's resident memory then stays at its peak.

The engine's per-vertex tables (every layer's embeddings, states, carrier counts and kept
terms) are read and written a row at a time at random: with 4 KB pages nearly every row
costs a TLB miss. `huge_pages` puts such a table in its own mapping, aligned to 2 MB and
advised as huge-page memory (transparent huge pages in "madvise" mode, the common default):
random rows of such a table read quicker cold, and a GraphConv-sum batch's fold and store
passes ran quicker in place (the graph's own tables gained nothing).
Such a mapping reserves room after the table (address space, no memory until written), so
that a table growing with the graph (`lengthened`) takes its new rows in place instead of
being copied whole, with the old and the new copy both resident, at every growth.

Owns these process settings only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import sys
import weakref
from collections.abc import Iterator

import numpy as np

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_DEFAULT_MMAP_MAX = 65536  # glibc's defaults for them
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
_RETURNED_MMAP_THRESHOLD = 1 << 20  # blocks from 1 MB up: their own mappings, unmapped on free
_MADV_HUGEPAGE = 14  # from the kernel's mman-common.h
_HUGE_PAGE = 2 << 20
_HUGE_MIN_BYTES = 8 * _HUGE_PAGE  # smaller tables: as numpy allocates them
_MAP_NORESERVE = 0x4000  # Linux's mmap flag (Python's mmap module does not name it)
# `huge_zeros` tables with room to grow: [where the rows in use end, where the room ends,
# the mapping]
_rooms: list[list] = []


_kept = False  # whether keep_freed_memory took
_returning = False  # within freed_memory_returned


def keep_freed_memory() -> bool:
    """Keep freed memory in this process for reuse (glibc only); True if malloc took it."""
    global _kept
    _kept = _mallopt(mmap_max=0, trim_threshold=2**31 - 1)
    return _kept


@contextlib.contextmanager
def freed_memory_returned() -> Iterator[None]:
    """Within: freed memory goes back to the kernel, as glibc does by default; after:
    what `keep_freed_memory` set, if it did, on a heap trimmed to what is in use. For a
    bootstrap or a restore: their temporaries are GBs on a large graph, and a heap kept at
    their peak, fragmented, held a products-like worker at 7.1 GB whose shard needs 3.8."""
    global _returning
    if not _kept or _returning:  # nested: the outermost one switches back
        yield
        return
    _returning = True
    _mallopt(mmap_max=_DEFAULT_MMAP_MAX, trim_threshold=_DEFAULT_TRIM_THRESHOLD)
    _libc().mallopt(_M_MMAP_THRESHOLD, _RETURNED_MMAP_THRESHOLD)  # not grown to 32 MB
    try:
        yield
    finally:
        _libc().malloc_trim(0)
        keep_freed_memory()
        _returning = False


def _mallopt(mmap_max: int, trim_threshold: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_MAX, mmap_max)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def huge_pages(array: np.ndarray, room: int = 0) -> np.ndarray:
    """``array`` copied into a `huge_zeros` table with ``room`` (else ``array`` itself)."""
    out = huge_zeros(array.shape, array.dtype, room)
    if out is None:
        return array
    out[...] = array
    return out


def huge_zeros(shape: tuple[int, ...], dtype: np.dtype, room: int = 0) -> np.ndarray | None:
    """A zero table that the kernel backs with 2 MB pages where it can, in its own mapping
    (returned to the system once no longer referenced), with ``room`` rows more mapped
    after it for `lengthened` to take without copying (address space: no memory until
    written); None when it would be under 16 MB or this is not Linux."""
    row = int(np.prod(shape[1:])) * np.dtype(dtype).itemsize
    nbytes, mapped = shape[0] * row, (shape[0] + room) * row
    if nbytes < _HUGE_MIN_BYTES or not sys.platform.startswith("linux"):
        return None
    try:
        mapping = mmap.mmap(-1, mapped + _HUGE_PAGE,
                            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except OSError:  # the room refused (strict overcommit, a limit on address space)
        return huge_zeros(shape, dtype) if room else None
    raw = np.frombuffer(mapping, np.uint8)
    start = -raw.ctypes.data % _HUGE_PAGE
    _advise_huge(raw.ctypes.data + start, mapped - mapped % _HUGE_PAGE)
    if room:
        _rooms.append([raw.ctypes.data + start + nbytes, raw.ctypes.data + start + mapped,
                       weakref.ref(mapping)])
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def lengthened(table: np.ndarray, rows: int) -> np.ndarray:
    """``table`` (C-contiguous) with ``rows`` rows, the new ones zero: the same memory,
    lengthened, where it is a `huge_zeros` table with room for them (nothing copied;
    ``table`` itself then sees the rows it had change); else a copy onto a new table with
    as much room again after it (where large enough for `huge_zeros`)."""
    if rows < len(table):
        raise ValueError(f"lengthened to {rows} rows: the table has {len(table)}")
    row = int(np.prod(table.shape[1:])) * table.itemsize
    end, new_end = (table.ctypes.data + n * row for n in (len(table), rows))
    _rooms[:] = [r for r in _rooms if r[2]() is not None]  # (the batch loop's thread only)
    for room in _rooms:
        used, limit, mapping = room
        # (a shorter or strided view of a table ends elsewhere, or is not contiguous: copied)
        if end == used and new_end <= limit and table.flags.c_contiguous:
            room[0] = new_end
            raw = np.frombuffer(mapping(), np.uint8)
            at = table.ctypes.data - raw.ctypes.data
            return raw[at:at + rows * row].view(table.dtype).reshape((rows, *table.shape[1:]))
    out = growable_zeros((rows, *table.shape[1:]), table.dtype)
    out[:len(table)] = table
    return out


def growable_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero table with room for as many rows again after it (`huge_zeros`), or as numpy
    allocates it where it is small."""
    out = huge_zeros(shape, dtype, room=shape[0])
    return np.zeros(shape, dtype) if out is None else out


def _advise_huge(address: int, length: int) -> None:
    """Advise the kernel to back ``length`` bytes at ``address`` with huge pages; a kernel
    that cannot (THP off) keeps 4 KB pages."""
    try:
        madvise = _libc().madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise(address, length, _MADV_HUGEPAGE)


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library of this process (loaded once)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
