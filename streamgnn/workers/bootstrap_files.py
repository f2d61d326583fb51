"""A partition started from its own partition file (`partition_files`), where it lives:
the BSP program that builds the shard `Engine._bootstrap` cuts from the whole graph on
the coordinator (its vertices, the edges into them, their sources it does not own as
ghosts), then computes its first state (`Shard.bootstrap`).

The file holds the partition's vertices and the edges into them, not who owns the sources
it lacks. Two exchanges find out: each partition asks every other one for its ghosts'
ids, and each answers with the features and weighted in-degrees of those it owns (the
vertex's in-edges are all in its owner's file), so the ghost's owner is the partition that
answered and each owner learns who holds its vertices (``holders``) from who asked. No
worker reads the map (12 B a vertex of the whole graph, and a sort or table to look ids up
in it): what a partition takes in grows with the other partitions' ghosts, never with the
graph. Each request goes to every peer: P - 1 copies of a partition's ghost ids, against
one for a map lookup, a cost paid once per bootstrap.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import numpy as np
import torch

from streamgnn.datasets import GraphData
from streamgnn.errors import InputError
from streamgnn.graph import DynamicGraph
from streamgnn.models.layers import Layer
from streamgnn.updates import CHECKED
from streamgnn.workers.exchange import Ghosts, pack, unpack
from streamgnn.workers.partition_files import read_partition
from streamgnn.workers.placement import bit
from streamgnn.workers.shard import Shard

_NOTHING = np.zeros(0, np.uint8)


def bootstrap_from_file(layers: list[Layer], folder: Path, device: torch.device,
                        dtype: torch.dtype, recompute: bool, me: int, partitions: int,
                        progress: bool = False
                        ) -> Generator[list[np.ndarray], list[np.ndarray], Shard]:
    """Partition ``me``'s shard from its file in ``folder``: `cut_from_file`, then
    `Shard.bootstrap` on it (one BSP program: run by `lockstep` or an MPI worker's
    `_drive`)."""
    cut = yield from cut_from_file(folder, me, partitions)
    return (yield from Shard.bootstrap(layers, cut, device, dtype, recompute, me, partitions,
                                       progress))


def cut_from_file(folder: Path, me: int, partitions: int
                  ) -> Generator[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray]]:
    """Partition ``me``'s shard without layer state, as `Engine._bootstrap` cuts it from
    the whole graph (``graph/...``, ``ghost``, ``holders``, ``ghost_owner``), from its
    file alone and two exchanges: its ghosts' ids to every peer, then from each peer the
    features and weighted in-degrees of those it owns. The ghosts follow the vertices it
    owns, in id order."""
    part = read_partition(folder, me)
    if part.parts != partitions:
        raise InputError(f"{folder} holds {part.parts} partitions, not {partitions}",
                         "start as many workers as the folder has partitions")
    owned = len(part.ids)
    ghosts = np.setdiff1d(part.src, part.ids)
    local = np.concatenate([part.ids, ghosts])
    x = np.zeros((len(local), part.x.shape[1]), np.float32)
    x[:owned] = part.x
    graph = DynamicGraph.from_data(GraphData(local, part.src, part.dst, x,
                                             weight=part.weight), CHECKED)
    del part, x
    holders = np.zeros(len(graph.alive), np.uint64)
    asked = yield [_NOTHING if q == me else ghosts.view(np.uint8) for q in range(partitions)]
    answers = [_answer(graph, owned, holders, q, request.view(np.int64))
               for q, request in enumerate(asked)]
    del asked
    ghost_owner = np.full(len(graph.alive), -1, np.int16)
    for q, answer in enumerate((yield answers)):
        if (got := unpack(answer)) is not None:
            slots = graph.slots(got.ids)
            graph.x[slots] = got.rows
            graph.in_weight[slots] = got.in_weight
            ghost_owner[slots] = q
    if (unowned := np.flatnonzero(ghost_owner[owned:len(local)] < 0)).size:
        raise InputError(f"{folder}/part-{me}.npz has edges from vertex "
                         f"{ghosts[unowned[0]]}, which no partition file holds",
                         "write the folder again with `streamgnn datasets partition`")
    return Shard.cut(graph, owned, holders, ghost_owner)


def _answer(graph: DynamicGraph, owned: int, holders: np.ndarray, q: int, asked: np.ndarray
            ) -> np.ndarray:
    """The answer to partition ``q`` asking for ids ``asked``: the features and weighted
    in-degrees of those this partition owns (its first ``owned`` slots), whose holders
    gain ``q``."""
    slots = graph.find(asked)
    mine = slots[(slots >= 0) & (slots < owned)]
    holders[mine] |= bit(q)
    return pack(Ghosts(graph.ext[mine], graph.x[mine], graph.in_weight[mine]))
