"""Where the shards run: `Workers`, the interface the engine drives them through (MPI
ranks: `streamgnn.workers.mpi.MpiWorkers`), `LocalWorkers` (the shards in this process)
and `lockstep`, which runs the shards' BSP programs together in one process.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from streamgnn.errors import InvalidUpdateError
from streamgnn.graph import GraphDiff
from streamgnn.npz import prefixed, under, write_arrays
from streamgnn.workers.batch import ApplyResult
from streamgnn.workers.exchange import Exchange, InProcess
from streamgnn.workers.placement import Routed
from streamgnn.workers.planned import plans
from streamgnn.workers.planned_shards import plans_together, run_together
from streamgnn.workers.shard import Deferred, Shard

T = TypeVar("T")


class Workers(Protocol):
    """Shards running elsewhere (an MPI job: `streamgnn.workers.mpi.MpiWorkers`). The
    engine builds `LocalWorkers` itself, which need only what it calls on both: `submit`,
    `rows`, `partials`, `arrays`, `write`, `summaries`, `max_in_flight`, `held`."""

    size: int  # how many partitions they hold
    max_in_flight: int  # batches they take submitted and not yet collected
    held: bool
    """Whether the shards run in this process (`LocalWorkers`): a query on their device
    then uploads what they need with its own arrays and takes their rows and partial
    aggregates as tensors there (`LocalWorkers.rows_work`, `partials_work`). Else (MPI)
    they answer `rows` and `partials` with host arrays, over the wire."""

    def load(self, shard: Callable[[int], dict[str, np.ndarray]]) -> None:
        """Take the shards' state: ``shard(p)``, partition p's (`Shard.arrays`)."""
        ...

    def bootstrap(self, cut: Callable[[int], dict[str, np.ndarray]], recompute: bool
                  ) -> None:
        """Compute the shards' first state where they live (`Shard.bootstrap`) from
        ``cut(p)``, partition p without layer state."""
        ...

    def bootstrap_files(self, folder: Path, recompute: bool) -> None:
        """Compute the shards' first state where they live, each from its partition file
        in ``folder`` (`bootstrap_from_file`)."""
        ...

    def submit(self, routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
        """Start every shard's part of a batch, run in lock step; returns what waits for
        them to finish and gives their results."""
        ...

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each partition's edges (those into its vertices), one after the other."""
        ...

    def check(self, routed: list[Routed]) -> list[InvalidUpdateError | None]:
        """Each partition's first rejection of its share, as `DynamicGraph.check` finds it
        (``index``: the position in the share), or None; nothing changes."""
        ...

    def neighbors(self, asked: list[np.ndarray], out: bool, edges: bool
                  ) -> list[dict[str, np.ndarray]]:
        """Each partition's `Shard.neighbors` of the ids ``asked[p]`` of it."""
        ...

    def high_in_degree(self, factor: float) -> Callable[[], np.ndarray]:
        """Ask every partition for the ids of its vertices with more in-edges than
        ``factor`` times the mean over all partitions (`above_mean`), as the batches
        submitted so far leave them; returns what gives the answer. It may be asked with
        batches in flight: the answer then comes after the last one's results, and must
        be taken right after them (before the next batch's)."""
        ...

    def rows(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> np.ndarray:
        """Rows of ``ids`` (owned by ``owner``) at ``layer``, as host arrays."""
        ...

    def partials(self, requests: list[dict | None]) -> list[np.ndarray | None]:
        """Each shard's partial aggregates for a query layer (`Shard.partials` with the
        request's keywords; None: nothing asked of it), as host arrays."""
        ...

    def arrays(self, with_graph: bool) -> list[dict[str, np.ndarray]]:
        """Each shard's state (`Shard.arrays`)."""
        ...

    def write(self, folder: Path, with_graph: bool) -> list[dict]:
        """Each shard's state as file ``shard<p>`` in ``folder`` (without its graph unless
        ``with_graph``); their manifest entries."""
        ...

    def read(self, folder: Path, weights: dict[str, np.ndarray]) -> None:
        """Take the shards' state from the files `write` wrote into ``folder`` (each
        where it lives), and the model's ``weights`` (its state dict: the model the state
        was computed with, whatever model file a worker started from)."""
        ...

    def summaries(self) -> list[dict]:
        ...


class LocalWorkers:
    """The shards in this process, exchanging through ``exchange`` (a transpose), or run
    all together where their batches plan (`planned_shards`: no exchange). `submit`
    returns with the batch done but, where it runs planned, its copy back (`copying`):
    what it returns waits for that copy and closes the batch (labels, the rows to
    re-anchor), which the next batch's plan reads; a batch submitted while one is open
    closes that one first."""

    max_in_flight = 1  # `submit` returns with the batch done on the host's side
    held = True  # `Workers.held`

    def __init__(self, shards: list[Shard], exchange: Exchange | None = None) -> None:
        self.shards = shards
        self.exchange = exchange or InProcess()
        self._open: Callable[[], list[ApplyResult]] | None = None  # (`copying`)

    @property
    def copying(self) -> bool:
        """Whether the batch last submitted ran planned and was not closed yet: its copy
        back may still be under way (the host may do other work before it waits)."""
        return self._open is not None

    def submit_diff(self, diff: GraphDiff) -> Callable[[], list[ApplyResult]]:
        """One shard working on the engine's own graph, which ``diff`` changed (done
        before this returns, but a planned batch's copy back: `copying`)."""
        self._close()
        [close] = lockstep([self.shards[0].run(diff)], self.exchange)
        return (self._opened(lambda: [close()]) if plans(self.shards[0].tables)
                else lambda: [close()])

    def submit(self, routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
        self._close()
        if plans_together(self.shards):  # one upload and one download for all shards
            return self._opened(run_together(self.shards, routed))
        n = len(self.shards)
        results = lockstep([shard.run_routed(r, p, n) for p, (shard, r) in enumerate(
            zip(self.shards, routed, strict=True))], self.exchange)
        return lambda: results

    def _opened(self, close: Callable[[], list[ApplyResult]]
                ) -> Callable[[], list[ApplyResult]]:
        """``close`` (what waits for a planned batch's copy back and closes it), open
        until it is first called: it runs once, and gives the same results after."""
        results: list[list[ApplyResult]] = []

        def closed() -> list[ApplyResult]:
            if not results:
                self._open = None
                results.append(close())
            return results[0]
        self._open = closed
        return closed

    def _close(self) -> None:
        """Close the batch still open, if any (`copying`): the next one's plan reads what
        closing it writes."""
        if self._open is not None:
            self._open()

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [shard.graph.edges() for shard in self.shards]
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

    def check(self, routed: list[Routed]) -> list[InvalidUpdateError | None]:
        return [shard.graph.check(r.batch, ghosts=True)
                for shard, r in zip(self.shards, routed, strict=True)]

    def neighbors(self, asked: list[np.ndarray], out: bool, edges: bool
                  ) -> list[dict[str, np.ndarray]]:
        return [shard.neighbors(ids, out, edges)
                for shard, ids in zip(self.shards, asked, strict=True)]

    def high_in_degree(self, factor: float) -> Callable[[], np.ndarray]:
        totals = sum(owned_and_in_edges(shard) for shard in self.shards)
        ids = np.concatenate([above_mean(shard, factor, totals) for shard in self.shards])
        return lambda: ids

    def rows(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> np.ndarray:
        parts = [(self.shards[p], owner == p) for p in np.unique(owner).tolist()]
        if not parts:
            return self.shards[0].rows(np.zeros(0, np.int64), layer)
        rows = [shard.rows(shard.graph.slots(ids[mine]), layer) for shard, mine in parts]
        out = np.empty((len(ids), rows[0].shape[1]), rows[0].dtype)
        for (_, mine), part in zip(parts, rows, strict=True):
            out[mine] = part
        return out

    def rows_work(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> Deferred:
        """`rows` as work for a caller that uploads its arrays to the shards' device
        (`Shard.rows_work`: each shard's under ``<i>/``, the i-th owner's): the rows as
        they are there, each shard's after the last's (``owner`` must be sorted)."""
        if (np.diff(owner) < 0).any():
            raise ValueError("rows held on a device come in the order of sorted owners")
        shards = [(self.shards[p], owner == p) for p in np.unique(owner).tolist()]
        works = [shard.rows_work(shard.graph.slots(ids[mine]), layer) for shard, mine in shards]

        def finish(up: dict[str, Tensor], _: Tensor | None) -> Tensor:
            return torch.cat([work.finish(under(up, f"{i}/"), None)
                              for i, work in enumerate(works)])
        return Deferred({k: a for i, work in enumerate(works)
                         for k, a in prefixed(f"{i}/", work.arrays).items()}, finish)

    def partials(self, requests: list[dict | None]) -> list[np.ndarray | None]:
        return [None if r is None else shard.partials(**r)
                for shard, r in zip(self.shards, requests, strict=True)]

    def partials_work(self, requests: list[dict | None]) -> list[Deferred | None]:
        """`partials` as work for a caller that uploads its arrays to the shards' device
        (`Shard.partials_work`)."""
        return [None if r is None else shard.partials_work(**r)
                for shard, r in zip(self.shards, requests, strict=True)]

    def arrays(self, with_graph: bool) -> list[dict[str, np.ndarray]]:
        return [shard.arrays(with_graph) for shard in self.shards]

    def write(self, folder: Path, with_graph: bool) -> list[dict]:
        return [write_arrays(folder, f"shard{p}", shard.arrays(with_graph))
                for p, shard in enumerate(self.shards)]

    def summaries(self) -> list[dict]:
        return [shard.summary() for shard in self.shards]


def owned_and_in_edges(shard: Shard) -> np.ndarray:
    """[vertices, in-edges] that ``shard`` owns (it keeps every edge into its vertices):
    summed over the partitions, what their mean in-degree is taken from."""
    owned = np.count_nonzero(shard.tables.owned[:shard.graph.num_slots])
    return np.array([owned, shard.graph.num_edges], np.int64)


def above_mean(shard: Shard, factor: float, totals: np.ndarray) -> np.ndarray:
    """The ids of the vertices ``shard`` owns with more in-edges than ``factor`` times the
    mean (``totals``: `owned_and_in_edges` summed over the partitions): RIPPLE++'s high
    in-degree set, its part of it."""
    return shard.high_in_degree(factor * int(totals[1]) / max(int(totals[0]), 1))


def lockstep(programs: list[Generator[list[np.ndarray], list[np.ndarray], T]],
             exchange: Exchange) -> list[T]:
    """Run shards' BSP programs (`Shard.run`, `Shard.bootstrap`) together, handing their
    buffers over through ``exchange`` at each barrier; what they return."""
    results: list[T | None] = [None] * len(programs)
    incoming: list[list[np.ndarray] | None] = [None] * len(programs)
    while True:
        outgoing = []
        for p, program in enumerate(programs):
            try:
                outgoing.append(next(program) if incoming[p] is None
                                else program.send(incoming[p]))
            except StopIteration as done:
                results[p] = done.value
        if not outgoing:
            return results
        incoming = exchange.alltoall(outgoing)

