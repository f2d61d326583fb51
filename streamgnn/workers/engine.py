"""`Engine`: exact incremental GNN inference over a dynamic graph split into partitions
(docs/architecture.md "Partitions and MPI ranks"). The engine keeps the whole graph for
validation (the coordinator's view: a batch is checked and applied to it atomically, exactly as
with one partition), routes the batch's net change to the partitions (`Placement`) and runs
the `Shard` supersteps in lock step: before superstep l each shard sends the rows of h^(l-1)
that changed to the shards holding them as ghosts, as packed buffers through an `Exchange`
(a transpose in one process; point to point between MPI ranks). Bootstrap cuts the graph
into partitions and each shard computes its own first state the same way. With one partition
the shard works on the engine's own graph and nothing is exchanged.

Owns the public engine API; must not import kafka or mpi4py.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Protocol, TypeVar

import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError

from streamgnn.allocator import freed_memory_returned
from streamgnn.datasets import GraphData
from streamgnn.errors import InvalidQueryError, NonFiniteEmbeddingError
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.graph.slotmap import SlotMap
from streamgnn.models import decompose
from streamgnn.models.inference import layerwise_states
from streamgnn.npz import prefixed, read_arrays, under, write_arrays
from streamgnn.queries import QueryColumns, QueryRequest
from streamgnn.updates import AddEdge, AddVertex, Update, UpdateBatch, ValueLimits
from streamgnn.workers.batch import ApplyResult
from streamgnn.workers.exchange import Exchange, InProcess
from streamgnn.workers.executors import Executors
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.placement import Placement, Routed, Strategy
from streamgnn.workers.query import QueryAnswer, QueryGraph, plan, run
from streamgnn.workers.shard import Shard
from streamgnn.workers.slotsets import SlotSets

T = TypeVar("T")
_CHECKED = ValueLimits(float("inf"), float("inf"))  # a shard's input: the engine checked it


class Engine:
    """Exact incremental inference of a PyG model over a dynamic graph
    (docs/architecture.md "The incremental engine")."""

    def __init__(self, model: torch.nn.Module, graph: DynamicGraph, device: str = "cpu",
                 recompute: bool = False, progress: bool = False, partitions: int = 1,
                 placement: Strategy = "metis", workers: Workers | None = None) -> None:
        """``workers``: where the shards run (default: in this process); with workers
        elsewhere (`streamgnn.workers.mpi`), the state is split even for one partition."""
        if not 1 <= partitions <= min(64, max(graph.num_vertices, 1)):
            raise ValueError(f"partitions={partitions}: must be 1 to 64 and at most the "
                             f"graph's {graph.num_vertices} vertices")
        self._attach(model, graph, device)
        with freed_memory_returned():  # a bootstrap's temporaries: GBs on a large graph
            self._bootstrap(recompute, progress, partitions, placement, workers)

    def _bootstrap(self, recompute: bool, progress: bool, partitions: int,
                   placement: Strategy, workers: Workers | None) -> None:
        graph = self.graph
        if partitions == 1 and workers is None:
            hs, states = layerwise_states(self.layers, graph, str(self.device), progress=progress,
                                          dtype=self.dtype, keep_states=not recompute)
            if recompute:  # RC re-aggregates from scratch: it keeps no states
                states = [None] * len(self.layers)
            self.placement = None
            self._workers = LocalWorkers([Shard(self.layers, graph, hs, states, self.device,
                                               self.dtype)])
        else:
            _check_workers(workers, partitions)
            self.placement = Placement.initial(graph, partitions, placement)
            cut = self._cutter()
            if workers is None:  # each shard computes its own first state, layer by layer
                self._workers = LocalWorkers(lockstep([
                    Shard.bootstrap(self.layers, cut(p), self.device, self.dtype, recompute,
                                    p, partitions, progress and p == 0)
                    for p in range(partitions)], InProcess()))
            else:  # each worker gets its partition, cut just before it is sent
                workers.bootstrap(cut, recompute)
                self._workers = workers

    def _attach(self, model: torch.nn.Module, graph: DynamicGraph, device: str) -> None:
        self.layers = decompose(model.to(device))
        self.graph = graph
        self.device = torch.device(device)
        self.executors = Executors(model, self.layers, self.device)
        self.dtype = next(model.parameters()).dtype  # float32, or float64 for checks
        self._poisoned: str | None = None  # why the state can no longer be trusted
        self._query_sets = SlotSets(0)  # over the virtual slots of a query (`QueryGraph`)
        self._slot_maps: list[SlotMap] = []  # per local shard: its slots -> the graph's
        # `apply` changes the graph holding this lock; then ``last_diff`` is that change:
        # other threads read the graph under it (`ReadView.neighbors`)
        self.graph_lock = threading.Lock()
        self.last_diff: GraphDiff | None = None
        # the last batch collected: its change and the shards' reports
        self._collected: tuple[GraphDiff | None, list[ApplyResult]] = (None, [])
        self._in_flight: deque[_InFlight] = deque()  # batches `submit` started, oldest first

    def _cutter(self) -> Callable[[int], dict[str, np.ndarray]]:
        """``cut(p)``: shard ``p`` without layer state (`Shard.bootstrap` computes it):
        the vertices it owns, the in-neighbors it needs as ghosts (their in-degrees too),
        the edges into its vertices."""
        edges = self.graph.edge_slots()
        return functools.partial(self._cut, edges)

    def _cut(self, edges: tuple[np.ndarray, np.ndarray, np.ndarray], p: int
             ) -> dict[str, np.ndarray]:
        g, part = self.graph, self.placement.part
        src, dst, w = edges
        into = part[dst] == p
        owned = np.flatnonzero(part[:g.num_slots] == p)
        ghosts = np.setdiff1d(src[into], owned)
        local = np.concatenate([owned, ghosts])
        data = GraphData(g.ext[local], g.ext[src[into]], g.ext[dst[into]], g.x[local],
                         weight=w[into])
        graph = DynamicGraph.from_data(data, _CHECKED)
        graph.in_weight[len(owned):len(local)] = g.in_weight[ghosts]
        ghost = np.zeros(len(graph.alive), bool)
        ghost[len(owned):len(local)] = True
        holders = np.zeros(len(graph.alive), np.uint64)
        holders[:len(owned)] = self.placement.holders[owned]
        owner = np.full(len(graph.alive), -1, np.int16)
        owner[len(owned):len(local)] = part[ghosts]
        return {**prefixed("graph/", graph.to_arrays()), "ghost": ghost, "holders": holders,
                "ghost_owner": owner}

    @classmethod
    def from_pyg(cls, model: torch.nn.Module, data: GraphData, device: str = "cpu",
                 limits: ValueLimits | None = None, **kwargs) -> Engine:
        """Bootstrap: load ``data`` and compute every layer's state (layer-wise). The
        graph accepts feature values and weights within ``limits`` (default `ValueLimits`).
        ``partitions=P`` splits the state into P shards by ``placement`` ("metis",
        "hash" or "stream": `placement.initial_owners`); every method means the same for
        every P."""
        return cls(model, DynamicGraph.from_data(data, limits), device, **kwargs)

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything the engine knows beside the model, as plain arrays (what a checkpoint
        holds): the graph as laid out (``graph/...``), the placement and each shard's
        state (``shard<p>/...``), so a restored engine repeats this one bit for bit."""
        out = self._head()
        for p, arrays in enumerate(self.workers.arrays(with_graph=self.placement is not None)):
            out.update(prefixed(f"shard{p}/", arrays))
        return out

    @classmethod
    def restore(cls, model: torch.nn.Module, snapshot: dict[str, np.ndarray],
                device: str = "cpu", workers: Workers | None = None) -> Engine:
        """The engine `snapshot` was taken of, with ``model`` (the same weights)."""
        with freed_memory_returned():
            snapshot = {k: np.array(a) for k, a in snapshot.items()}  # the engine adopts them
            return cls._restore(model, snapshot, lambda p: under(snapshot, f"shard{p}/"),
                                device, workers)

    def write(self, folder: Path) -> list[dict]:
        """Write the state as `snapshot` holds it into checkpoint folder ``folder``: the
        file ``engine`` (graph, placement) here, and ``shard<p>`` where each shard lives
        (every MPI rank writes its own); returns their manifest entries."""
        return [write_arrays(folder, "engine", self._head()),
                *self.workers.write(folder, with_graph=self.placement is not None)]

    @property
    def in_host_memory(self) -> bool:
        """Whether all the state lives in this process's host memory (the shards here, on
        the CPU): then a forked child can `write` it as it was at the fork."""
        return isinstance(self._workers, LocalWorkers) and self.device.type == "cpu"

    @classmethod
    def read(cls, model: torch.nn.Module, folder: Path, device: str = "cpu",
             workers: Workers | None = None) -> Engine:
        """The engine `write` wrote into ``folder`` (whose files the caller checked)."""
        with freed_memory_returned():
            return cls._restore(model, read_arrays(folder / "engine.npz"),
                                lambda p: read_arrays(folder / f"shard{p}.npz"), device,
                                workers, folder)

    @classmethod
    def _restore(cls, model: torch.nn.Module, head: dict[str, np.ndarray],
                 shard: Callable[[int], dict[str, np.ndarray]], device: str,
                 workers: Workers | None, folder: Path | None = None) -> Engine:
        engine = cls.__new__(cls)
        engine._attach(model, DynamicGraph.from_arrays(under(head, "graph/")), device)
        placement = under(head, "placement/")
        engine.placement = Placement.from_arrays(placement) if placement else None
        if engine.placement is None:  # one partition: the shard works on this graph
            engine._workers = LocalWorkers([Shard.from_arrays(
                engine.layers, shard(0), engine.device, engine.dtype, engine.graph)])
        elif workers is None:
            engine._workers = LocalWorkers([
                Shard.from_arrays(engine.layers, shard(p), engine.device, engine.dtype)
                for p in range(engine.num_partitions)])
        else:
            _check_workers(workers, engine.num_partitions)
            if folder is not None:  # each rank reads its own file, with the model's weights
                workers.read(folder, {k: t.detach().cpu().numpy()
                                      for k, t in model.state_dict().items()})
            else:
                workers.load(shard)
            engine._workers = workers
        return engine

    def _head(self) -> dict[str, np.ndarray]:
        """The graph and placement arrays of a `snapshot` (no shard state)."""
        out = prefixed("graph/", self.graph.to_arrays())
        if self.placement is not None:
            out.update(prefixed("placement/", self.placement.to_arrays()))
        return out

    # ---------------------------------------------------------------- reads
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_partitions(self) -> int:
        return 1 if self.placement is None else self.placement.num_partitions

    @property
    def shards(self) -> list[Shard]:
        """The shards, where they run in this process."""
        return self.workers.shards

    def lookup(self, ids, layer: int = -1) -> np.ndarray:
        """Embeddings of ``ids`` at ``layer`` (0: features, -1: the output)."""
        layer = layer % (self.num_layers + 1)
        ids = np.atleast_1d(np.asarray(ids, np.int64))
        return self.workers.rows(self.partition_of(ids), ids, layer)

    def label(self, ids) -> np.ndarray:
        """Predicted class of ``ids``: argmax of the output layer."""
        return self.lookup(ids, -1).argmax(axis=1)

    def vertex_ids(self) -> np.ndarray:
        return self.graph.vertex_ids()

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.graph.edges()

    def partition_of(self, ids) -> np.ndarray:
        """The partition owning each of ``ids`` (raises `UnknownVertexError` for an id
        not in the graph)."""
        return self.owners(self.graph.slots(ids))

    def owners(self, slots: np.ndarray) -> np.ndarray:
        """The partition owning each of ``slots``."""
        if self.placement is None:
            return np.zeros(len(slots), np.int64)
        return self.placement.owners(slots).astype(np.int64)

    def stats(self) -> list[dict]:
        """Per partition: vertices owned, halo (ghost) vertices, and for the last batch
        the bytes it sent and received per exchange and its compute seconds per step
        between exchanges (``busy_s``)."""
        return self.workers.summaries()

    # ---------------------------------------------------------------- queries
    def query(self, req: QueryRequest | QueryColumns, device: str | None = None,
              **options) -> QueryAnswer:
        """Answer a query (docs/architecture.md "The life of a query"): its vertices'
        output embeddings and labels, exactly as if inserted (``budget=None``) or by
        selective recomputation with ``budget`` gamma in [0, 1] and ``policy``
        ("top-ratio", "random", "degree"); the engine is left as it was unless
        ``insert=True``, which applies the query as a batch of updates and answers from
        the result. ``req`` is a `QueryRequest` or, the fast way for large queries,
        `QueryColumns`; the keyword ``options`` (``budget``, ``policy``, ``insert``)
        override a request's own. The dense work runs on ``device``, by default the one
        `Executors.pick` chooses for its size. A bad request raises the
        `InvalidInputError` naming its problem."""
        if self._poisoned is not None:
            raise NonFiniteEmbeddingError(self._poisoned)
        settings = _options(req, options)
        if isinstance(req, QueryColumns):
            cols = req.checked(self.graph.num_features, self.graph.limits)
        else:
            cols = QueryColumns.from_request(req, self.graph.num_features, self.graph.limits)
        qg = QueryGraph(self.graph, cols, self._query_sets)
        budget, policy = settings["budget"], settings["policy"]
        if settings["insert"]:
            result = self.apply(
                [AddVertex(id=i, x=row) for i, row in zip(cols.ids.tolist(), cols.x.tolist())]
                + [AddEdge(src=a, dst=b, weight=w) for a, b, w in zip(
                    cols.src.tolist(), cols.dst.tolist(), cols.weight.tolist())])
            rows = self.lookup(cols.ids)
            return QueryAnswer(cols.ids, rows, rows.argmax(axis=1), None, policy,
                               changed_labels=result.changed_labels)
        recompute, candidates = plan(qg, self.layers, budget, policy)
        device = torch.device(device) if device is not None else self.executors.pick(
            lambda: int(sum(qg.in_degree(r).sum() for r in recompute)))
        answer = QueryAnswer(cols.ids, np.zeros(0), np.zeros(0, np.int64), budget, policy,
                             candidates, device=str(device))
        rows = run(self, qg, recompute, answer, self.executors.layers(device)).cpu().numpy()
        answer.embeddings, answer.labels = rows, rows.argmax(axis=1)
        return answer

    # ---------------------------------------------------------------- batches
    def apply(self, batch: Sequence[Update] | UpdateBatch, skip_invalid: bool = False
              ) -> ApplyResult:
        """Apply one batch (updates, or their columns; in order, atomically) and bring every
        embedding up to date.
        A bad update raises its `InvalidUpdateError` and nothing is applied; with
        ``skip_invalid`` it is left out and listed in ``ApplyResult.rejected``.
        A batch that drives an embedding to NaN or inf raises `NonFiniteEmbeddingError`
        and leaves the engine unusable (every later call raises it): restore a snapshot.
        Refused while batches `submit` started are not collected."""
        if self._in_flight:
            raise self._refusal()
        self.submit(batch, skip_invalid)
        return self.collect()

    @torch.inference_mode()
    def submit(self, batch: Sequence[Update] | UpdateBatch, skip_invalid: bool = False
               ) -> None:
        """`apply`'s first half: the batch changes the graph (or raises as `apply` does)
        and the shards start on it; `collect` waits for them and gives the result. Shards
        in this process are done before this returns; MPI workers go on while the caller
        does other work (a service reads its next batch), and while they do (`computing`)
        more batches may be submitted, up to `Workers.max_in_flight` in all: the workers
        take each up as soon as they are done, and `collect` gives the results oldest
        first. Until the last is collected, nothing else may use the shards (`workers`
        raises)."""
        if self._poisoned is not None:
            raise NonFiniteEmbeddingError(self._poisoned)
        if len(self._in_flight) >= self._workers.max_in_flight:
            raise self._refusal()
        workers = self._workers
        with self.graph_lock:
            diff = self.last_diff = self.graph.apply(batch, skip_invalid)
        if self.placement is None:
            results = workers.submit_diff(diff)
        else:
            results = workers.submit(self.placement.route(self.graph, diff, len(batch)))
        self._in_flight.append(_InFlight(results, len(batch), diff, self.graph.ext[diff.removed]))

    def collect(self) -> ApplyResult:
        """The result of the oldest batch `submit` started and nothing collected yet,
        once every shard is done with it (numpy only: no torch mode to enter)."""
        if not self._in_flight:
            raise RuntimeError("no batch in flight: collect() follows submit()")
        flight = self._in_flight.popleft()
        results = flight.results()
        self._collected = flight.diff, results
        if bad := [r.non_finite for r in results if r.non_finite]:
            self._poisoned = (f"a batch of {flight.size} updates drove layer {min(bad)} "
                              "embeddings to NaN or inf; restore the engine from a snapshot")
            while self._in_flight:  # the workers' replies to a batch after it, let go
                self._in_flight.popleft().results()
            raise NonFiniteEmbeddingError(self._poisoned)
        labels = ChangedLabels.concat([r.changed_labels for r in results])
        names = ("recomputed", "pulled", "pulled_columns", "remote_reads", "combined_messages")
        counts = ({name: getattr(results[0], name) for name in names} if len(results) == 1
                  else {name: [sum(c) for c in zip(*(getattr(r, name) for r in results),
                                                    strict=True)]
                        for name in names})  # per layer, summed over the shards
        return ApplyResult(labels, flight.diff.rejected, removed=flight.removed, **counts)

    @property
    def computing(self) -> bool:
        """Whether a batch `submit` started may still be computing: it was not collected
        yet and its workers take another meanwhile (they run elsewhere: MPI workers)."""
        return bool(self._in_flight) and self._workers.max_in_flight > 1

    @property
    def workers(self) -> Workers:
        """Where the shards run; refused while a batch is in flight (`submit`)."""
        if self._in_flight:
            raise self._refusal()
        return self._workers

    def _refusal(self) -> RuntimeError:
        """What refuses the shards to a caller while batches are in flight."""
        if len(self._in_flight) == 1:
            return RuntimeError("a batch is in flight: collect() it first")
        return RuntimeError(f"{len(self._in_flight)} batches in flight: collect() first")

    def rewritten(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer 0..L (0: the features), the rows the last batch wrote, as (the graph's
        slots ascending, rows); merged from the shards' reports when asked (the read view
        asks, before the next batch), empty where the shards run elsewhere or the graph
        has moved on to a batch still in flight."""
        diff, results = self._collected
        if diff is None or diff is not self.last_diff or not all(r.rewritten for r in results):
            return []
        return [self._features(diff), *(
            self._rewritten(layer) for layer in zip(*(r.rewritten for r in results)))]

    def _features(self, diff: GraphDiff) -> tuple[np.ndarray, np.ndarray]:
        """The feature rows ``diff`` wrote, by the graph's slots (ascending)."""
        slots = np.sort(np.concatenate([diff.changed, diff.added]).astype(np.int64))
        return slots, self.graph.x[slots]

    def _rewritten(self, shards: tuple[tuple[np.ndarray, np.ndarray], ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """One layer's rows the shards wrote (their slots, their rows), by the graph's
        slots (ascending)."""
        if self.placement is None:
            return shards[0]
        if [m.source for m in self._slot_maps] != [shard.graph for shard in self.shards]:
            self._slot_maps = [SlotMap(shard.graph, self.graph) for shard in self.shards]
        slots = np.concatenate([to_engine(s) for to_engine, (s, _) in
                                zip(self._slot_maps, shards, strict=True)])
        order = np.argsort(slots)
        return slots[order], np.concatenate([rows for _, rows in shards])[order]


QUERY_OPTIONS = ("budget", "policy", "insert")


@functools.cache
def _option_adapter(name: str) -> TypeAdapter:
    """The validator of `QueryRequest` field ``name`` (built once: building one costs
    more than a query of a few vertices)."""
    field = QueryRequest.model_fields[name]
    return TypeAdapter(Annotated[field.annotation, *field.metadata] if field.metadata
                       else field.annotation)


def _options(req: QueryRequest | QueryColumns, options: dict) -> dict:
    """The query's ``budget``, ``policy`` and ``insert``: ``req``'s own (columns: the
    defaults) with ``options`` over them, each validated by its `QueryRequest` field's
    rules (the request itself was validated when it was made)."""
    out = {name: (getattr(req, name) if isinstance(req, QueryRequest)
                  else QueryRequest.model_fields[name].default) for name in QUERY_OPTIONS}
    for name, value in options.items():
        if name not in QUERY_OPTIONS:
            raise InvalidQueryError(f"{name!r} is not a query option: use "
                                    f"{', '.join(QUERY_OPTIONS)}")
        try:
            out[name] = _option_adapter(name).validate_python(value)
        except ValidationError as e:
            raise InvalidQueryError(f"{name}: {e.errors(include_url=False)[0]['msg']}"
                                    ) from None
    return out


@dataclass
class _InFlight:
    """A batch `Engine.submit` started: what waits for its shards' results, and what the
    result needs of the graph as the batch left it."""

    results: Callable[[], list[ApplyResult]]
    size: int
    diff: GraphDiff  # its change of the graph
    removed: np.ndarray  # ids of the vertices it deleted


def _check_workers(workers: Workers | None, partitions: int) -> None:
    if workers is not None and workers.size != partitions:
        raise ValueError(f"{partitions} partitions for {workers.size} workers")


class Workers(Protocol):
    """Shards running elsewhere (an MPI job: `streamgnn.workers.mpi.MpiWorkers`). The
    engine builds `LocalWorkers` itself, which need only what it calls on both: `submit`,
    `rows`, `arrays`, `write`, `summaries`, `max_in_flight`."""

    size: int  # how many partitions they hold
    max_in_flight: int  # batches they take submitted and not yet collected

    def load(self, shard: Callable[[int], dict[str, np.ndarray]]) -> None:
        """Take the shards' state: ``shard(p)``, partition p's (`Shard.arrays`)."""
        ...

    def bootstrap(self, cut: Callable[[int], dict[str, np.ndarray]], recompute: bool
                  ) -> None:
        """Compute the shards' first state where they live (`Shard.bootstrap`) from
        ``cut(p)``, partition p without layer state."""
        ...

    def submit(self, routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
        """Start every shard's part of a batch, run in lock step; returns what waits for
        them to finish and gives their results."""
        ...

    def rows(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> np.ndarray:
        """Rows of ``ids`` (owned by ``owner``) at ``layer``."""
        ...

    def partials(self, requests: list[dict | None]) -> list[np.ndarray | None]:
        """Each shard's partial aggregates for a query layer (`Shard.partials` with the
        request's keywords; None: nothing asked of it)."""
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
    """The shards in this process, exchanging through ``exchange`` (a transpose)."""

    max_in_flight = 1  # `submit` returns with the batch done

    def __init__(self, shards: list[Shard], exchange: Exchange | None = None) -> None:
        self.shards = shards
        self.exchange = exchange or InProcess()

    def submit_diff(self, diff: GraphDiff) -> Callable[[], list[ApplyResult]]:
        """One shard working on the engine's own graph, which ``diff`` changed (done
        before this returns)."""
        results = lockstep([self.shards[0].run(diff)], self.exchange)
        return lambda: results

    def submit(self, routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
        n = len(self.shards)
        results = lockstep([shard.run_routed(r, p, n) for p, (shard, r) in enumerate(
            zip(self.shards, routed, strict=True))], self.exchange)
        return lambda: results

    def rows(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> np.ndarray:
        out = None
        for p in np.unique(owner).tolist():
            shard, mine = self.shards[p], owner == p
            rows = shard.rows(shard.graph.slots(ids[mine]), layer)
            if out is None:
                out = np.empty((len(ids), rows.shape[1]), rows.dtype)
            out[mine] = rows
        return out if out is not None else self.shards[0].rows(np.zeros(0, np.int64), layer)

    def partials(self, requests: list[dict | None]) -> list[np.ndarray | None]:
        return [None if r is None else shard.partials(**r)
                for shard, r in zip(self.shards, requests, strict=True)]

    def arrays(self, with_graph: bool) -> list[dict[str, np.ndarray]]:
        return [shard.arrays(with_graph) for shard in self.shards]

    def write(self, folder: Path, with_graph: bool) -> list[dict]:
        return [write_arrays(folder, f"shard{p}", shard.arrays(with_graph))
                for p, shard in enumerate(self.shards)]

    def summaries(self) -> list[dict]:
        return [shard.summary() for shard in self.shards]


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

