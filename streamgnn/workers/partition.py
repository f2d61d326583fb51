"""Where an engine's messages go between supersteps: the halo exchange behind one
interface. `SinglePartition` (everything is local: the exchange is a no-op) is the only
implementation until the MPI exchange plugs in ``Alltoallv``.

Owns the exchange interface; must not import kafka. Only its MPI implementation may import
mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass
class Outbox:
    """One superstep's messages, combined per destination by the receiver: messages that
    start arriving (``new``) and stop arriving (``old``) at destination slots."""

    new_dst: Tensor
    new_msg: Tensor
    old_dst: Tensor
    old_msg: Tensor


class Partition(Protocol):
    def exchange(self, superstep: int, outbox: Outbox) -> Outbox:
        """Send messages for halo vertices to their owners; return what is local."""
        ...


class SinglePartition:
    """The whole graph in one partition: no halo, nothing to exchange."""

    def exchange(self, superstep: int, outbox: Outbox) -> Outbox:
        return outbox
