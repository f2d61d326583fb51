"""`ChangedLabels`: the predicted labels a batch changed, kept as three columns (vertex id,
old label, new label) and read as a mapping id -> (old, new).

A batch of 1,000 updates changes ~1,600 labels on arxiv-like: columns cost a few numpy
calls where a dict of tuples builds Python objects for every label, and shards' columns merge
and travel between ranks as they are. The mapping view (a dict) is built on first lookup.
`relabel_` finds which of a shard's stored labels a batch changed, in one numba pass.

Owns this type only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from numba import njit

NO_LABEL = -1  # ``old`` of a vertex the batch added


class ChangedLabels(Mapping[int, tuple[int | None, int]]):
    """Vertex id -> (old, new) predicted label; old is None for a vertex the batch added.
    ``ids`` (distinct), ``old`` (`NO_LABEL` for None) and ``new`` are int64 columns."""

    def __init__(self, ids: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        self.ids = np.asarray(ids, np.int64)
        self.old = np.asarray(old, np.int64)
        self.new = np.asarray(new, np.int64)
        if not len(self.ids) == len(self.old) == len(self.new):
            raise ValueError(f"columns of {len(self.ids)}, {len(self.old)} and "
                             f"{len(self.new)} labels")
        self._dict: dict[int, tuple[int | None, int]] | None = None

    @classmethod
    def empty(cls) -> ChangedLabels:
        nothing = np.zeros(0, np.int64)
        return cls(nothing, nothing, nothing)

    @classmethod
    def concat(cls, parts: Sequence[ChangedLabels]) -> ChangedLabels:
        """The changes of vertices in disjoint ``parts`` (shards), together (one part as it
        is)."""
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, name) for p in parts])
                     for name in ("ids", "old", "new")))

    def triples(self) -> list[tuple[int, int | None, int]]:
        """(vertex, old or None, new) per change, in column order."""
        old = [None if o == NO_LABEL else o for o in self.old.tolist()]
        return list(zip(self.ids.tolist(), old, self.new.tolist(), strict=True))

    def _mapping(self) -> dict[int, tuple[int | None, int]]:
        if self._dict is None:
            self._dict = {v: (o, n) for v, o, n in self.triples()}
        return self._dict

    def __getitem__(self, vertex: int) -> tuple[int | None, int]:
        return self._mapping()[vertex]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids.tolist())

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, vertex: object) -> bool:
        return vertex in self._mapping()

    def __repr__(self) -> str:
        return f"ChangedLabels({self._mapping()!r})"


@njit(cache=True)
def relabel_(labels: np.ndarray, slots: np.ndarray, new: np.ndarray, fresh: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Store the labels ``new`` of ``slots`` (distinct) into ``labels``; returns the
    positions whose label changed or that are ``fresh`` (added by the batch), and their
    old labels (`NO_LABEL` where fresh)."""
    at = np.empty(len(slots), np.int64)
    old = np.empty(len(slots), np.int64)
    k = 0
    for i in range(len(slots)):
        before = labels[slots[i]]
        if fresh[i] or new[i] != before:
            at[k] = i
            old[k] = NO_LABEL if fresh[i] else before
            k += 1
        labels[slots[i]] = new[i]
    return at[:k], old[:k]
