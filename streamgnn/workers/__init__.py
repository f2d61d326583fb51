"""The incremental engine: per-layer state and hop-by-hop BSP propagation (`Shard`), the
partitions it is split into (`placement`), the halo exchange between them (`exchange`)
and query serving (`query`); an MPI job's ranks (`mpi`) and its supervisor (`supervisor`).
Must not import kafka; only `mpi` and `supervisor` import mpi4py. Importing this package
imports none of its modules (the names below load on use), so `serve --workers`'s
supervisor starts without torch."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {"ApplyResult": "batch", "ChangedLabels": "labels", "Engine": "engine",
         "QueryAnswer": "query", "Shard": "shard"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"streamgnn.workers.{_HOME[name]}"), name)
    raise AttributeError(f"module 'streamgnn.workers' has no attribute {name!r}")
