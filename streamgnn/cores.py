"""Row loops on several cores. A numba loop over rows that are independent of each other
(each destination or slot read and written by one iteration) is written once, over
``chunks`` contiguous ranges of its rows in a ``prange``, and compiled twice: serially,
and split over threads (`RowLoop`). Each call picks one by the work's size and torch's
thread count, the project's one thread setting (`torch.set_num_threads`: `serve
--torch-threads`, the benchmarks' ``--threads``): loops touching fewer than `MIN_WORK`
elements run serially, larger ones on as many threads as torch uses, in chunks of about
equal cost (`chunk_rows`). Waking
threads that went to sleep is a fixed cost a small loop does not earn back: the sum fold
of a bs=100 batch (50-120K elements) ran slower threaded, that of a bs=1000 batch
(0.5-0.9M elements) quicker. The chunks cover the same rows as the serial loop, each
row computed alike, so both give the same bits.

Threads come from numba's OpenMP or TBB layer ("threadsafe": queries and REST reads call
kernels from threads of their own); where neither loads, every loop runs serially.

Owns that choice; must not import kafka, mpi4py or the engine.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator

import numba
import numpy as np
import torch
from numba import njit

MIN_WORK = 1 << 18  # elements a loop touches below which one thread is quicker
if "NUMBA_THREADING_LAYER" not in os.environ:  # (a user's choice stands)
    numba.config.THREADING_LAYER = "threadsafe"
_threads_load: bool | None = None  # whether a threading layer loaded (None: not tried)
_threads_pid: int | None = None  # the process that started threads


class RowLoop:
    """A numba loop whose last argument is ``chunks``, compiled serially and (once asked
    for) split over threads; call it with the work's size first."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.serial = njit(cache=True)(fn)
        self._parallel = None

    def __call__(self, work: int, *args):
        chunks = threads_for(work)
        if chunks > 1 and (loop := self.parallel) is not None:
            threads = min(chunks, numba.config.NUMBA_NUM_THREADS)
            if numba.get_num_threads() != threads:  # (numba's count is per calling thread)
                numba.set_num_threads(threads)
            return loop(*args, chunks)
        return self.serial(*args, 1)

    @property
    def parallel(self):
        """The loop split over threads, compiled on first use (None where no threading
        layer loads)."""
        global _threads_load, _threads_pid
        if self._parallel is None and _threads_load is not False:
            self._parallel = njit(cache=True, parallel=True)(_renamed(self.fn, "_threads"))
            if _threads_load is None:
                _threads_load, _threads_pid = _layer_loads(), os.getpid()
        return self._parallel if _threads_load else None


@njit(cache=True, inline="always")
def chunk_rows(cost, chunks, chunk):
    """Rows ``[lo, hi)`` of chunk ``chunk`` of ``chunks``, split so that each chunk has
    about the same cost: ``cost[i]`` is the cost of rows 0..i-1 (ascending, ``cost[0]`` 0,
    one more entry than rows). Consecutive chunks meet; together they cover every row."""
    n, total = len(cost) - 1, cost[len(cost) - 1]
    lo = 0 if chunk == 0 else np.searchsorted(cost, total * chunk // chunks)
    hi = n if chunk == chunks - 1 else np.searchsorted(cost, total * (chunk + 1) // chunks)
    return lo, hi


@njit(cache=True)
def block_costs(begin, end, row):
    """`chunk_rows`'s cost of rows whose work is a block ``[begin[i], end[i])`` of edges
    plus ``row`` for the row itself."""
    cost = np.zeros(len(begin) + 1, np.int64)
    for i in range(len(begin)):
        cost[i + 1] = cost[i] + end[i] - begin[i] + row
    return cost


def block_work(begin: np.ndarray, end: np.ndarray, width: int) -> int:
    """The elements a loop over blocks ``[begin[i], end[i])`` of edges touches, ``width``
    each (the blocks' own sizes: their edge list may be a whole adjacency's storage)."""
    return int(np.sum(end - begin)) * width


def row_loop(fn: Callable) -> RowLoop:
    """Decorator: `RowLoop` of ``fn``."""
    return RowLoop(fn)


def threads_for(work: int) -> int:
    """How many threads a loop touching ``work`` elements runs on: torch's thread count,
    or 1 below `MIN_WORK` and in a child forked from a process whose loops used threads
    (OpenMP's threads do not survive a fork: a checkpoint's writer); within
    `threads_whatever_the_size`, its count at any size."""
    if _threads_pid is not None and os.getpid() != _threads_pid:
        return 1
    if _every_loop_chunks:
        return _every_loop_chunks
    return 1 if work < MIN_WORK else torch.get_num_threads()


_every_loop_chunks = 0  # `threads_whatever_the_size`'s chunks (0: by the work's size)


@contextlib.contextmanager
def threads_whatever_the_size(chunks: int = 2) -> Iterator[None]:
    """Within it, every row loop runs split into ``chunks`` ranges over threads, however
    small its work (the threaded build compiles on its first call: `warm_up` calls them
    all; the tests check their bits against the serial loop's)."""
    global _every_loop_chunks
    before, _every_loop_chunks = _every_loop_chunks, chunks
    try:
        yield
    finally:
        _every_loop_chunks = before


def _renamed(fn: Callable, suffix: str) -> Callable:
    """A copy of ``fn`` named with ``suffix``: numba's cache keys a compiled function by
    its name and signature, not by its options, so the threaded build needs a name of
    its own or it loads the serial one."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix,
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + suffix
    copy.__module__ = fn.__module__
    return copy


@njit(cache=True, parallel=True)
def _probe(n):
    total = 0
    for i in numba.prange(n):
        total += i
    return total


def _layer_loads() -> bool:
    """Whether numba can start threads here (OpenMP or TBB)."""
    try:
        _probe(2)
    except ValueError:  # "No threading layer could be loaded"
        return False
    return True
