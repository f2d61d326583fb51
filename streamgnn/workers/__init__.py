"""The incremental engine (per-layer state, hop-by-hop BSP propagation) and the partition
exchange it runs over. Must not import kafka; only the MPI exchange imports mpi4py."""

from streamgnn.workers.engine import ApplyResult, Engine
from streamgnn.workers.partition import Outbox, Partition, SinglePartition

__all__ = ["ApplyResult", "Engine", "Outbox", "Partition", "SinglePartition"]
