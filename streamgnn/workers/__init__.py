"""The incremental engine: per-layer state and hop-by-hop BSP propagation (`Shard`), the
partitions it is split into (`Placement`) and the halo exchange between them
(`exchange`). Must not import kafka; only an MPI exchange imports mpi4py."""

from streamgnn.workers.engine import Engine
from streamgnn.workers.placement import Placement
from streamgnn.workers.shard import ApplyResult, Shard

__all__ = ["ApplyResult", "Engine", "Placement", "Shard"]
