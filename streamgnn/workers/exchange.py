"""The halo exchange between supersteps: each partition's `Ghosts` for every other one,
packed into one flat byte buffer per destination (a header, the ids, the rows, the
in-degrees), handed over all-to-all and unpacked. `InProcess` hands the buffers over in
one process; an MPI exchange sends the same buffers, one to each peer. No pickling, no
per-message objects.

Owns the wire format and the in-process hand-over; must not import torch or kafka. Only
an MPI implementation may import mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Ghosts:
    """Rows one shard sends another between supersteps: the external ids of vertices it
    owns, their embedding rows at the layer just computed (features before the first), and
    before the first also their weighted in-degrees (degree-normalised layers)."""

    ids: np.ndarray
    rows: np.ndarray
    in_weight: np.ndarray | None = None


_HEADER = np.dtype([("n", "<i8"), ("dim", "<i8"), ("itemsize", "<i8"), ("weights", "<i8")])


def packed(n: int, dim: int, dtype: np.dtype, weighted: bool) -> tuple[np.ndarray, Ghosts]:
    """A buffer for ``n`` rows of ``dim`` values of ``dtype`` (and in-degrees where
    ``weighted``) with its header written, and `Ghosts` viewing the ids, rows and
    in-degrees in it, to be filled (a sender writes them in place: no copy)."""
    itemsize = np.dtype(dtype).itemsize
    buffer = np.empty(_HEADER.itemsize + n * (8 + dim * itemsize + 8 * weighted), np.uint8)
    buffer[:_HEADER.itemsize].view("<i8")[:] = (n, dim, itemsize, weighted)  # (`_HEADER`)
    return buffer, _views(buffer, n, dim, itemsize, weighted)


def _views(buffer: np.ndarray, n: int, dim: int, itemsize: int, weighted: bool) -> Ghosts:
    """The ids, rows and in-degrees in a buffer with this header."""
    at = _HEADER.itemsize + 8 * n  # where the rows start
    end = at + n * dim * itemsize
    return Ghosts(buffer[_HEADER.itemsize:at].view("<i8"),
                  buffer[at:end].view(f"<f{itemsize}").reshape(n, dim),
                  buffer[end:end + 8 * n].view("<f8") if weighted else None)


def pack(ghosts: Ghosts | None) -> np.ndarray:
    """``ghosts`` as one uint8 buffer (empty for None)."""
    if ghosts is None or not len(ghosts.ids):
        return np.zeros(0, np.uint8)
    rows = np.asarray(ghosts.rows)
    buffer, into = packed(len(ghosts.ids), rows.shape[1], rows.dtype,
                          ghosts.in_weight is not None)
    into.ids[:], into.rows[:] = ghosts.ids, rows
    if ghosts.in_weight is not None:
        into.in_weight[:] = ghosts.in_weight
    return buffer


def unpack(buffer: np.ndarray) -> Ghosts | None:
    """The `Ghosts` a `pack` buffer holds (None for an empty one)."""
    if not len(buffer):
        return None
    n, dim, itemsize, weighted = buffer[:_HEADER.itemsize].view("<i8").tolist()  # (`_HEADER`)
    return _views(buffer, n, dim, itemsize, bool(weighted))


class Exchange(Protocol):
    def alltoall(self, outgoing: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """``outgoing[p][q]``: the buffer partition p sends q; returns ``incoming[q][p]``."""
        ...


class InProcess:
    """All partitions in this process: the hand-over is a transpose."""

    def alltoall(self, outgoing: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        return [list(column) for column in zip(*outgoing, strict=True)]
