"""The incremental engine: per-layer state and hop-by-hop BSP propagation (`Shard`), the
partitions it is split into (`Placement`), the halo exchange between them (`exchange`)
and query serving (`query`). Must not import kafka; only an MPI exchange imports
mpi4py."""

from streamgnn.workers.engine import Engine
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.placement import Placement
from streamgnn.workers.query import QueryAnswer
from streamgnn.workers.shard import ApplyResult, Shard

__all__ = ["ApplyResult", "ChangedLabels", "Engine", "Placement", "QueryAnswer", "Shard"]
