"""`warm_up`: compile the numba kernels an engine of a model runs, or load them from
numba's on-disk cache, before its first batch rather than during it.

numba compiles a kernel on its first call for each kind of argument and keeps it on disk;
a process that finds no cache for this machine and source (a fresh install, a new
container, an upgrade) compiles each kernel where a batch first needs it. The first
batches after bootstrap, and the first one large enough to split its loops over threads
(`cores.RowLoop`), then stall for many times a batch's usual latency while numba compiles;
with the cache they do not. `serve` calls this before it consumes, so the stall comes
once, at start-up, and a stream's latency holds from its first batch.

It runs the engine on a small random graph of the model's feature width: bootstrap,
LinkBench batches of every update type, then one that re-anchors the states it touches
(`worn_out`) and one refused as a whole (`refused`), and an exact and a selective query,
once with the row loops serial and, where torch may use more than one thread, once with
every one on threads whatever its size (the threaded builds); with two partitions too
where the service is partitioned. Without the last two batches, the first re-anchoring
batch of a stream stalled to compile, the first large one again (its threaded build), and
so did the first bad batch a library user applied (its undo kernel). The batches are drawn
from a copy of the random graph that follows them (an engine with partitions keeps no
graph to draw from).

Owns that start-up step; must not import kafka or mpi4py.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

from streamgnn import cores
from streamgnn.datasets import GraphData
from streamgnn.errors import InvalidUpdateError
from streamgnn.graph import DynamicGraph
from streamgnn.models.convert import decompose
from streamgnn.queries import QueryEdge, QueryRequest, QueryVertex
from streamgnn.replay.linkbench import LinkBenchWorkload
from streamgnn.updates import AddEdge, AddVertex
from streamgnn.workers.engine import Engine

VERTICES = 48  # the random graph's size: every kernel runs, none for long
DEGREE = 4
BATCH_SIZES = (1, 4, 16, 16)
WARMING_UP = ("compiling the engine's kernels (about a minute a model family the first time "
              "on a machine or version; then loaded from numba's cache in about a second)")


def warm_up(model: torch.nn.Module, device: str = "cpu", partitions: int = 1,
            recompute: bool = False) -> float:
    """Run ``model``'s engine (``recompute``: the RC baseline) through every kind of
    batch on a small graph (in one process; with ``partitions`` > 1, two partitions too)
    and a query of each kind, so that every kernel they call is compiled; returns the
    seconds it took."""
    start = time.perf_counter()
    data = _random_graph(decompose(model)[0].in_dim)
    for parts in (1, 2) if partitions > 1 else (1,):
        engine = Engine.from_pyg(model, data, device, recompute=recompute, partitions=parts)
        workload = LinkBenchWorkload(DynamicGraph.from_data(data), seed=parts)
        for threaded in (False, True) if torch.get_num_threads() > 1 else (False,):
            with cores.threads_whatever_the_size() if threaded else contextlib.nullcontext():
                for size in BATCH_SIZES:
                    engine.apply(workload.applied(size))
                worn_out(engine)  # and one that re-anchors
                engine.apply(workload.applied(BATCH_SIZES[-1]))
                refused(engine, data.num_features)
                for budget in (None, 0.5):
                    engine.query(_query(engine.vertex_ids(), data.num_features, budget),
                                 device="cpu")
    return time.perf_counter() - start


def worn_out(engine: Engine) -> None:
    """Put every rounding bound of ``engine``'s states past its limit, so that its next
    batch re-anchors each state it touches (`SumAggregation.re_anchored`): a stream does
    so after hundreds of batches, and the pull it runs (a row loop, serial and threaded)
    compiles like any other kernel."""
    with torch.inference_mode():  # (the engine's tables are inference tensors)
        for shard in engine.shards:
            for drift in shard.tables.drift:
                if drift is not None:
                    drift.fill_(float("inf"))


def refused(engine: Engine, features: int) -> None:
    """Apply a batch that ``engine`` refuses as a whole (a vertex, then an edge from it to
    a vertex that does not exist): the graph undoes the vertex (`DynamicGraph.apply`'s
    undo kernel, which a stream of valid batches never runs)."""
    new = int(engine.vertex_ids().max()) + 1
    with contextlib.suppress(InvalidUpdateError):
        engine.apply([AddVertex(id=new, x=[0.0] * features), AddEdge(src=new, dst=new + 1)])


def warm_up_if_possible(model: torch.nn.Module, device: str = "cpu",
                        partitions: int = 1) -> float | None:
    """`warm_up`, which only saves time: where it fails, the reason goes to stderr, the
    kernels compile where first used, and None is returned (what `serve`, its MPI
    workers and the demo call: none of them stops for it)."""
    try:
        return warm_up(model, device, partitions)
    except Exception as e:  # (the engine runs as well without it)
        print(f"warm-up failed ({type(e).__name__}: {e}); kernels compile where first used",
              file=sys.stderr)
        return None


def _random_graph(features: int) -> GraphData:
    """``VERTICES`` vertices, ``DEGREE`` distinct in-neighbors each on average (no
    self-loops), features and weights at random."""
    rng = np.random.default_rng(0)
    pairs = rng.choice(VERTICES * (VERTICES - 1), VERTICES * DEGREE, replace=False)
    src, other = np.divmod(pairs, VERTICES - 1)
    dst = other + (other >= src)
    return GraphData(ids=np.arange(VERTICES), src=src, dst=dst,
                     x=rng.standard_normal((VERTICES, features)).astype(np.float32),
                     weight=rng.uniform(0.5, 2.0, len(src)).astype(np.float32))


def _query(ids: np.ndarray, features: int, budget: float | None) -> QueryRequest:
    new = int(ids.max()) + 1
    x = [0.5] * features
    return QueryRequest(vertices=[QueryVertex(id=new, x=x), QueryVertex(id=new + 1, x=x)],
                        edges=[QueryEdge(src=int(ids[0]), dst=new),
                               QueryEdge(src=new, dst=new + 1),
                               QueryEdge(src=new + 1, dst=int(ids[1]))],
                        budget=budget)
