"""`GraphData`: a static graph snapshot keyed by external vertex ids.

Owns validation and normalisation of a snapshot (dtypes, shapes, self-loop and parallel-edge
policy) and conversion to PyG tensors (torch is imported by that conversion only); must
not import kafka or mpi4py.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from streamgnn.errors import (
    DuplicateEdgeError,
    DuplicateVertexError,
    FeatureDimensionError,
    NonFiniteValueError,
    SelfLoopError,
    UnknownVertexError,
)

if TYPE_CHECKING:
    import torch


@dataclass
class GraphData:
    """A directed graph: ``x[i]`` and ``y[i]`` belong to vertex ``ids[i]``; ``src``/``dst``
    are external ids. ``weight`` defaults to 1. The graph is simple: no self-loops, no
    parallel edges (use :meth:`cleaned` on raw input that has them)."""

    ids: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    x: np.ndarray
    y: np.ndarray | None = None
    weight: np.ndarray | None = None
    name: str = field(default="graph", compare=False)

    def __post_init__(self) -> None:
        self.ids = np.ascontiguousarray(self.ids, dtype=np.int64)
        self.src = np.ascontiguousarray(self.src, dtype=np.int64)
        self.dst = np.ascontiguousarray(self.dst, dtype=np.int64)
        self.x = np.ascontiguousarray(self.x, dtype=np.float32)
        if self.y is not None:
            self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        self.weight = (np.ones(len(self.src), np.float32) if self.weight is None
                       else np.ascontiguousarray(self.weight, dtype=np.float32))
        self._validate()

    def _validate(self) -> None:
        n = len(self.ids)
        if self.x.ndim != 2 or len(self.x) != n:
            raise FeatureDimensionError(f"x has shape {self.x.shape}, expected ({n}, d)")
        if self.y is not None and self.y.shape != (n,):
            raise ValueError(f"y has shape {self.y.shape}, expected ({n},)")
        if not (len(self.src) == len(self.dst) == len(self.weight)):
            raise ValueError("src, dst and weight must have the same length")
        if not np.isfinite(self.x).all():
            bad = self.ids[~np.isfinite(self.x).all(axis=1)][0]
            raise NonFiniteValueError(f"vertex {bad}: features contain NaN or inf")
        if not np.isfinite(self.weight).all():
            i = int(np.flatnonzero(~np.isfinite(self.weight))[0])
            raise NonFiniteValueError(
                f"edge ({self.src[i]}, {self.dst[i]}): weight {self.weight[i]} is not finite")
        uniq, counts = np.unique(self.ids, return_counts=True)
        if len(uniq) != n:
            raise DuplicateVertexError(f"vertex {uniq[counts > 1][0]} appears twice in ids")
        rows = []
        for ends in (self.src, self.dst):
            pos, missing = self._lookup(ends)
            if missing.any():
                raise UnknownVertexError(f"edge endpoint {ends[missing][0]} is not in ids")
            rows.append(pos)
        loops = self.src == self.dst
        if loops.any():
            raise SelfLoopError(
                f"self-loop on vertex {self.src[loops][0]}; use GraphData.cleaned()")
        pairs = np.sort(rows[0] * n + rows[1])  # one key per edge: a sort finds repeats
        if (pairs[1:] == pairs[:-1]).any():
            i = int(np.flatnonzero(_duplicate_mask(self.src, self.dst))[0])
            raise DuplicateEdgeError(
                f"parallel edge ({self.src[i]}, {self.dst[i]}); use GraphData.cleaned()")

    @classmethod
    def cleaned(cls, ids, src, dst, x, y=None, weight=None, name: str = "graph") -> GraphData:
        """Build a snapshot from raw edges: drops self-loops and keeps the first of parallel
        edges, warning with the counts."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        keep = src != dst
        loops = int((~keep).sum())
        keep &= ~_duplicate_mask(src, dst)
        dropped = int((~keep).sum()) - loops
        if loops or dropped:
            warnings.warn(f"{name}: dropped {loops} self-loops and {dropped} parallel edges",
                          stacklevel=2)
        w = None if weight is None else np.asarray(weight)[keep]
        return cls(ids=ids, src=src[keep], dst=dst[keep], x=x, y=y, weight=w, name=name)

    @property
    def num_vertices(self) -> int:
        return len(self.ids)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    @property
    def num_features(self) -> int:
        return self.x.shape[1]

    @property
    def num_classes(self) -> int:
        return 0 if self.y is None else int(self.y.max()) + 1

    def positions(self, ext: np.ndarray) -> np.ndarray:
        """Row index in ``ids``/``x`` of each external id in ``ext``."""
        pos, bad = self._lookup(np.asarray(ext))
        if bad.any():
            raise UnknownVertexError(f"vertex {np.asarray(ext)[bad][0]} is not in the graph")
        return pos

    def _lookup(self, ext: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each id's row, and where it is not an id: through a table indexed by id where
        the ids are dense enough (a products-like graph's 62M edge ends: seconds instead of
        minutes by binary search), else by binary search."""
        if not len(self.ids) or not len(ext):
            return np.zeros(len(ext), np.int64), np.ones(len(ext), bool)
        low, high = int(self.ids.min()), int(self.ids.max())
        if high - low < 8 * len(self.ids) and ext.dtype.kind == "i":
            table = np.full(high - low + 1, -1, np.int64)
            table[self.ids - low] = np.arange(len(self.ids))
            pos = table[np.clip(ext - low, 0, high - low)]  # wrapped differences: caught
            return pos, (pos < 0) | (ext < low) | (ext > high)
        order = np.argsort(self.ids, kind="stable")
        pos = order[np.minimum(np.searchsorted(self.ids[order], ext), len(order) - 1)]
        return pos, self.ids[pos] != ext

    def edge_index(self) -> torch.Tensor:
        """PyG ``edge_index`` over row positions (``x[i]`` is vertex ``ids[i]``)."""
        import torch

        return torch.from_numpy(np.stack([self.positions(self.src), self.positions(self.dst)]))

    def to_pyg(self):
        """A ``torch_geometric.data.Data`` with x, edge_index, edge_weight and y."""
        import torch
        from torch_geometric.data import Data

        return Data(x=torch.from_numpy(self.x), edge_index=self.edge_index(),
                    edge_weight=torch.from_numpy(self.weight),
                    y=None if self.y is None else torch.from_numpy(self.y))

    def __repr__(self) -> str:
        return (f"GraphData({self.name!r}, vertices={self.num_vertices:,}, "
                f"edges={self.num_edges:,}, features={self.num_features}, "
                f"classes={self.num_classes})")


def _duplicate_mask(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """True for every edge that repeats an earlier (src, dst) pair."""
    order = np.lexsort((dst, src))  # stable: the first of equal pairs comes first
    s, d = src[order], dst[order]
    repeat = np.zeros(len(src), bool)
    repeat[1:] = (s[1:] == s[:-1]) & (d[1:] == d[:-1])
    mask = np.empty(len(src), bool)
    mask[order] = repeat
    return mask
