"""The halo exchange between supersteps: each partition's `Ghosts` for every other one,
packed into one flat byte buffer per destination (a header, the ids, the rows, the
in-degrees), handed over all-to-all and unpacked. `InProcess` hands the buffers over in
one process; an MPI exchange sends the same buffers, one to each peer. No pickling, no
per-message objects. A shard's buffers for all its peers are written by one kernel into one
allocation (`pack_many`); kernels and `unpack` read each buffer it is sent as it lies,
through one reader of its header (`received_ids`, `received_rows`). A shard's program is
sent a list of buffers, or where an exchange fills them as they arrive, an `Arriving`
sequence: `sizes` and `as_they_arrive` read either without waiting for the rest.

Owns the wire format and the in-process hand-over; must not import torch or kafka. Only
an MPI implementation may import mpi4py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numba import njit

from streamgnn.prefetch import AHEAD, prefetch_row


@dataclass
class Ghosts:
    """Rows one shard sends another between supersteps: the external ids of vertices it
    owns, their embedding rows at the layer just computed (features before the first), and
    before the first also their weighted in-degrees (degree-normalised layers)."""

    ids: np.ndarray
    rows: np.ndarray
    in_weight: np.ndarray | None = None


_HEADER = np.dtype([("n", "<i8"), ("dim", "<i8"), ("itemsize", "<i8"), ("weights", "<i8")])
_HEADER_BYTES = _HEADER.itemsize


NO_WEIGHTS = np.zeros(0, np.float64)  # `pack_many`'s in-degrees where none go (read only)


@njit(cache=True)
def pack_many(counts, slots, rows, at, ids, in_weight, weighted):
    """`pack` buffers for several destinations, filled, in one allocation: destination q
    is sent ``counts[q]`` of ``slots`` (those of q after those of q - 1), each with its id
    ``ids[slot]``, its row ``rows[at[k]]`` (k: its position in ``slots``) and, where
    ``weighted``, its in-degree ``in_weight[slot]``. Returns the allocation and each
    buffer's offset (a multiple of 64) and size in it (0: nothing for q)."""
    dim, itemsize = rows.shape[1], rows.itemsize
    offsets = np.zeros(len(counts), np.int64)
    sizes = np.zeros(len(counts), np.int64)
    end = 0
    for q in range(len(counts)):
        if counts[q]:
            offsets[q] = end
            sizes[q] = _HEADER_BYTES + counts[q] * (8 + dim * itemsize + 8 * weighted)
            end += sizes[q] + (-sizes[q]) % 64
    buffer = np.empty(end, np.uint8)
    k = 0
    for q in range(len(counts)):
        n = counts[q]
        if not n:
            continue
        head = offsets[q] + _HEADER_BYTES
        header = buffer[offsets[q]:head].view(np.int64)  # (`_HEADER`)
        header[0], header[1], header[2], header[3] = n, dim, itemsize, weighted
        out_ids = buffer[head:head + 8 * n].view(np.int64)
        first_row = head + 8 * n
        out_rows = buffer[first_row:first_row + n * dim * itemsize].view(rows.dtype)
        out_weights = buffer[first_row + n * dim * itemsize:offsets[q] + sizes[q]].view(
            np.float64)
        for i in range(n):
            if k + i + AHEAD < len(slots):
                prefetch_row(rows, at[k + i + AHEAD])
            s, r = slots[k + i], at[k + i]
            out_ids[i] = ids[s]
            for j in range(dim):  # (a row slice a time costs more)
                out_rows[i * dim + j] = rows[r, j]
            if weighted:
                out_weights[i] = in_weight[s]
        k += n
    return buffer, offsets, sizes


@njit(cache=True)
def _layout(buffer):
    """A `pack` buffer's header: its rows, their width and item size, and whether
    in-degrees follow them (1 or 0)."""
    header = buffer[:_HEADER_BYTES].view(np.int64)  # (`_HEADER`)
    return header[0], header[1], header[2], header[3]


@njit(cache=True)
def received_ids(buffer):
    """The ids a non-empty `pack` buffer carries and their in-degrees (none where it
    carries none), views of it."""
    n, dim, itemsize, weighted = _layout(buffer)
    at = _HEADER_BYTES + 8 * n + n * dim * itemsize  # where the in-degrees start
    return (buffer[_HEADER_BYTES:_HEADER_BYTES + 8 * n].view(np.int64),
            buffer[at:at + (8 * n if weighted else 0)].view(np.float64))


@njit(cache=True)
def received_rows(buffer, like):
    """The rows a non-empty `pack` buffer carries, a view in the dtype of ``like`` (a
    table of the same width and item size)."""
    n, dim, _, _ = _layout(buffer)
    at = _HEADER_BYTES + 8 * n
    return buffer[at:at + n * dim * like.itemsize].view(like.dtype).reshape(n, dim)


def pack(ghosts: Ghosts | None) -> np.ndarray:
    """``ghosts`` as one uint8 buffer (empty for None)."""
    if ghosts is None or not len(ghosts.ids):
        return np.zeros(0, np.uint8)
    every = np.arange(len(ghosts.ids))
    weighted = ghosts.in_weight is not None
    buffer, _, sizes = pack_many(
        np.array([len(every)]), every, np.ascontiguousarray(ghosts.rows), every,
        np.asarray(ghosts.ids, np.int64),
        np.asarray(ghosts.in_weight, np.float64) if weighted else NO_WEIGHTS, weighted)
    return buffer[:sizes[0]]


def unpack(buffer: np.ndarray) -> Ghosts | None:
    """The `Ghosts` a `pack` buffer holds (None for an empty one), views of it, read by
    the kernels' own readers (`received_ids`, `received_rows`)."""
    if not len(buffer):
        return None
    _, dim, itemsize, weighted = _layout(buffer)
    ids, in_weight = received_ids(buffer)
    rows = received_rows(buffer, np.empty((0, dim), f"<f{itemsize}"))
    return Ghosts(ids, rows, in_weight if weighted else None)


class Arriving(Protocol):
    """Buffers received that an exchange fills as they arrive (an MPI worker's,
    `mpi.Arrivals`): item q waits for buffer q; each one's size is known before it comes;
    ``waited``: the seconds spent waiting for them so far."""

    waited: float

    def __len__(self) -> int: ...

    def __getitem__(self, q: int) -> np.ndarray: ...

    def sizes(self) -> list[int]:
        """The bytes of every buffer, arrived or not."""
        ...

    def as_they_arrive(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each buffer with its position, as each arrives."""
        ...


# A program is sent a list (all buffers there at once) or an `Arriving` sequence. The
# helpers below tell them apart by the list's type: a runtime check of the protocol
# costs tens of microseconds, more than an idle superstep.

def sizes(buffers: list[np.ndarray] | Arriving) -> list[int]:
    """The bytes of each buffer a program is sent, without waiting for any (`Arriving`)."""
    return [len(b) for b in buffers] if isinstance(buffers, list) else buffers.sizes()


def waited(buffers: list[np.ndarray] | Arriving) -> float:
    """The seconds a program has waited so far for the buffers it is sent (none for a
    list: all of them came at once)."""
    return 0.0 if isinstance(buffers, list) else buffers.waited


def as_they_arrive(buffers: list[np.ndarray] | Arriving) -> Iterable[tuple[int, np.ndarray]]:
    """Each buffer a program is sent with its position: a list's in order, an `Arriving`
    sequence's in the order they arrive."""
    return enumerate(buffers) if isinstance(buffers, list) else buffers.as_they_arrive()


class Exchange(Protocol):
    def alltoall(self, outgoing: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """``outgoing[p][q]``: the buffer partition p sends q; returns ``incoming[q][p]``."""
        ...


class InProcess:
    """All partitions in this process: the hand-over is a transpose."""

    def alltoall(self, outgoing: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        return [list(column) for column in zip(*outgoing, strict=True)]
