"""`Engine`: exact incremental GNN inference over a dynamic graph split into partitions
(docs/architecture.md "Partitions and MPI ranks"). With one partition the engine keeps the
graph, validates and applies each batch to it atomically, and its shard works on that graph
with nothing exchanged. With more, the engine (the coordinator) keeps no graph: its
`Directory` decides the batch's vertex questions and where each update goes, each
partition applies its share to the edges it keeps and decides the rest, and the `Shard`
supersteps run in lock step: before superstep l each shard sends the rows of h^(l-1) that
changed to the shards holding them as ghosts, as packed buffers through an `Exchange` (a
transpose in one process; point to point between MPI ranks). Bootstrap cuts the graph into
partitions and each shard computes its own first state the same way; from partition files
(`from_partitions`) the engine reads the map alone and each partition builds its own shard
from its file (`bootstrap_files`).

Owns the public engine API; must not import kafka or mpi4py.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError

from streamgnn.allocator import freed_memory_returned
from streamgnn.datasets import GraphData
from streamgnn.errors import (
    InputError,
    InvalidQueryError,
    InvalidUpdateError,
    NonFiniteEmbeddingError,
    UnknownVertexError,
)
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.graph.directory import HIGH_FACTOR, Directory
from streamgnn.graph.idmap import Slotted
from streamgnn.graph.slotmap import SlotMap
from streamgnn.models import decompose
from streamgnn.models.inference import layerwise_states
from streamgnn.npz import prefixed, read_arrays, under, write_arrays
from streamgnn.queries import QueryColumns, QueryRequest
from streamgnn.updates import CHECKED, AddEdge, AddVertex, Update, UpdateBatch, ValueLimits
from streamgnn.workers.batch import ApplyResult
from streamgnn.workers.bootstrap_files import bootstrap_from_file
from streamgnn.workers.exchange import InProcess
from streamgnn.workers.executors import Executors
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.local import LocalWorkers, Workers, lockstep
from streamgnn.workers.partition_files import read_map, sizes
from streamgnn.workers.placement import Strategy, bit, initial_owners, shares
from streamgnn.workers.query import (
    FetchedReads,
    GraphReads,
    QueryAnswer,
    QueryGraph,
    plan,
    run,
)
from streamgnn.workers.shard import Shard
from streamgnn.workers.slotsets import SlotSets

T = TypeVar("T")
_NONE_RELEASED = (np.zeros(0, np.int64),) * 3  # ghosts let go of: ids, owners, holders
_NO_PAIRS = (np.zeros(0, np.int64),) * 2


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
            self._workers = LocalWorkers([Shard(self.layers, graph, hs, states, self.device,
                                               self.dtype)])
        else:
            _check_workers(workers, partitions)
            owner = initial_owners(graph, partitions, placement)
            slots = graph.vertex_slots()
            self.directory = Directory(graph.ext[slots], owner[slots], partitions,
                                       graph.num_features, graph.limits, placement)
            self.index = self.directory
            self._released = _NONE_RELEASED
            self._num_edges = graph.num_edges
            cut = _cutter(graph, owner)
            if workers is None:  # each shard computes its own first state, layer by layer
                self._workers = LocalWorkers(lockstep([
                    Shard.bootstrap(self.layers, cut(p), self.device, self.dtype, recompute,
                                    p, partitions, progress and p == 0)
                    for p in range(partitions)], InProcess()))
            else:  # each worker gets its partition, cut just before it is sent
                workers.bootstrap(cut, recompute)
                self._workers = workers
            self.graph = None  # the partitions have it: the coordinator keeps the directory

    def _attach(self, model: torch.nn.Module, graph: DynamicGraph | None, device: str
                ) -> None:
        self.layers = decompose(model.to(device))
        self.graph: DynamicGraph | None = graph  # with partitions: None once they have it
        self.index: Slotted = graph  # the vertices' slots: the graph's or the directory's
        self.directory: Directory | None = None  # with partitions: ids -> owners
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
        self._collected: list[ApplyResult] = []
        self._in_flight: deque[_InFlight] = deque()  # batches `submit` started, oldest first

    @classmethod
    def from_pyg(cls, model: torch.nn.Module, data: GraphData, device: str = "cpu",
                 limits: ValueLimits | None = None, **kwargs) -> Engine:
        """Bootstrap: load ``data`` and compute every layer's state (layer-wise). The
        graph accepts feature values and weights within ``limits`` (default `ValueLimits`).
        ``partitions=P`` splits the state into P shards by ``placement`` ("metis",
        "hash" or "stream": `placement.initial_owners`); every method means the same for
        every P."""
        return cls(model, DynamicGraph.from_data(data, limits), device, **kwargs)

    @classmethod
    def from_partitions(cls, model: torch.nn.Module, folder: Path, device: str = "cpu",
                        recompute: bool = False, progress: bool = False,
                        workers: Workers | None = None) -> Engine:
        """Bootstrap from the partition files `streamgnn datasets partition` wrote into
        ``folder``, each loaded where its partition lives: the engine reads the map alone
        (the directory; the feature width and edge count from the files' headers), and
        each shard builds itself from its own file (`bootstrap_from_file`). The same
        engine as `from_pyg` with the folder's partition count and placement, on the
        dataset it was written from, accepting values within the default `ValueLimits`
        (those the files were checked against). ``workers``: as many as the partitions
        (default: in this process)."""
        folder = Path(folder)
        engine = cls.__new__(cls)
        engine._attach(model, None, device)
        with freed_memory_returned():
            mapped = read_map(folder)
            parts = mapped.parts
            _check_workers(workers, parts)
            num_features, engine._num_edges = sizes(folder, parts)
            engine.directory = engine.index = Directory(mapped.ids, mapped.part, parts,
                                                        num_features, strategy=mapped.strategy)
            del mapped
            engine._released = _NONE_RELEASED
            if workers is None:
                engine._workers = LocalWorkers(lockstep([
                    bootstrap_from_file(engine.layers, folder, engine.device, engine.dtype,
                                        recompute, p, parts, progress and p == 0)
                    for p in range(parts)], InProcess()))
            else:
                workers.bootstrap_files(folder, recompute)
                engine._workers = workers
        return engine

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything the engine knows beside the model, as plain arrays (what a checkpoint
        holds): with one partition the graph as laid out (``graph/...``), with more the
        directory; and each shard's state (``shard<p>/...``, its graph
        with more than one), so a restored engine repeats this one bit for bit."""
        out = self._head()
        for p, arrays in enumerate(self.workers.arrays(with_graph=self.directory is not None)):
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
        file ``engine`` (`_head`) here, and ``shard<p>`` where each shard lives
        (every MPI rank writes its own); returns their manifest entries."""
        return [write_arrays(folder, "engine", self._head()),
                *self.workers.write(folder, with_graph=self.directory is not None)]

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
        directory = under(head, "directory/")
        if under(head, "placement/"):
            raise InputError("this state predates the partitions' directory: bootstrap the "
                             "engine again (the coordinator kept the whole graph then, and "
                             "keeps none now)",
                             "start `serve` with a fresh --state-dir (in Python: "
                             "Engine.from_pyg or from_partitions)")
        engine = cls.__new__(cls)
        engine._attach(model, None if directory else
                       DynamicGraph.from_arrays(under(head, "graph/")), device)
        if directory:
            engine.directory = engine.index = Directory.from_arrays(directory)
            engine._released = (tuple(head["released"]) if "released" in head
                                else _NONE_RELEASED)  # (written before it was kept)
            engine._num_edges = int(head["edges"])
        if engine.directory is None:  # one partition: the shard works on this graph
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
        """The arrays of a `snapshot` beside the shards' state: the graph (one partition)
        or the directory, the edge count and the ghosts the partitions let go of that
        their owners are still to be told of (with the next batch)."""
        if self.directory is None:
            return prefixed("graph/", self.graph.to_arrays())
        return {**prefixed("directory/", self.directory.to_arrays()),
                "edges": np.array(self._num_edges), "released": np.stack(self._released)}

    # ---------------------------------------------------------------- reads
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_partitions(self) -> int:
        return 1 if self.directory is None else self.directory.num_partitions

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
        if self.directory is None:
            return self.graph.vertex_ids()
        return self.directory.vertex_ids()

    def contains(self, ids) -> np.ndarray:
        """Whether each of ``ids`` is a vertex of the graph."""
        ids = np.atleast_1d(np.asarray(ids, np.int64))
        if self.directory is None:
            return self.graph.contains(ids)
        return self.directory.owners(ids) >= 0

    @property
    def num_vertices(self) -> int:
        return (self.graph.num_vertices if self.directory is None
                else self.directory.num_vertices)

    @property
    def num_edges(self) -> int:
        """Edges in the graph (with partitions: as the last batch collected left them)."""
        return self.graph.num_edges if self.directory is None else self._num_edges

    @property
    def num_features(self) -> int:
        return self._checker.num_features

    @property
    def limits(self) -> ValueLimits:
        """The largest feature value and weight the engine takes (`ValueLimits`)."""
        return self._checker.limits

    @limits.setter
    def limits(self, limits: ValueLimits) -> None:
        self._checker.limits = limits

    @property
    def _checker(self) -> DynamicGraph | Directory:
        """What checks a batch's vertices and values against the feature width and the
        limits: the graph (one partition) or the directory."""
        return self.graph if self.directory is None else self.directory

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every edge as (source ids, destination ids, weights); with partitions, each
        partition's (the edges into its vertices), one after the other."""
        if self.directory is None:
            return self.graph.edges()
        return self.workers.edges()

    def to_data(self) -> GraphData:
        """The current graph as a snapshot (vertices in `vertex_ids` order; edges as
        `edges` gives them), asked of the partitions."""
        ids = self.vertex_ids()
        src, dst, w = self.edges()
        return GraphData(ids, src, dst, self.lookup(ids, 0), weight=w)

    def in_edges(self, ids, edges: bool = True) -> Neighborhood:
        """The in-edges of vertices ``ids`` (each at its owner): per id the in-degree and
        weighted in-degree; with ``edges``, the sources' ids and the weights, id after id.
        Raises `UnknownVertexError` for an id not in the graph."""
        ids = np.atleast_1d(np.asarray(ids, np.int64))
        owner = self.partition_of(ids)
        asked = [ids[owner == p] for p in range(self.num_partitions)]
        return Neighborhood.gathered(owner, self._neighbors(asked, False, edges))

    def out_edges(self, id: int) -> tuple[np.ndarray, np.ndarray]:
        """The destinations' ids and the weights of vertex ``id``'s out-edges (kept at
        each destination's owner), in no order."""
        self.partition_of([id])
        got = self._neighbors([np.array([id], np.int64)] * self.num_partitions, True, True)
        return (np.concatenate([r["nbr"] for r in got]),
                np.concatenate([r["w"] for r in got]))

    def _neighbors(self, asked: list[np.ndarray], out: bool, edges: bool
                   ) -> list[dict[str, np.ndarray]]:
        if self.directory is None:
            return [self.shards[0].neighbors(asked[0], out, edges)]
        return self.workers.neighbors(asked, out, edges)

    def partition_of(self, ids) -> np.ndarray:
        """The partition owning each of ``ids`` (raises `UnknownVertexError` for an id
        not in the graph)."""
        if self.directory is None:
            return self.owners(self.graph.slots(ids))
        ids = np.atleast_1d(np.asarray(ids, np.int64))
        owners = self.directory.owners(ids).astype(np.int64)
        if (missing := np.flatnonzero(owners < 0)).size:
            i = int(missing[0])
            raise UnknownVertexError(f"vertex {ids[i]} is not in the graph", index=i)
        return owners

    def owners(self, slots: np.ndarray) -> np.ndarray:
        """The partition owning each of ``slots`` (`index` slots of live vertices)."""
        if self.directory is None:
            return np.zeros(len(slots), np.int64)
        return self.directory.owner[slots].astype(np.int64)

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
            cols = req.checked(self.num_features, self.limits)
        else:
            cols = QueryColumns.from_request(req, self.num_features, self.limits)
        reads = (GraphReads(self.graph) if self.directory is None
                 else FetchedReads(self.index, self.in_edges, self._query_sets))
        qg = QueryGraph(self.index, reads, cols, self._query_sets)
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
        in this process are done before this returns but for a planned batch's copy back
        from the device (`LocalWorkers.copying`); that copy and MPI workers go on while
        the caller does other work (`computing`: a service reads its next batch). MPI
        workers meanwhile take more batches, up to `Workers.max_in_flight` in all
        (`takes_another`): each as soon as they are done, and `collect` gives the results
        oldest first. Until the last is collected, nothing else may use the shards
        (`workers` raises)."""
        if self._poisoned is not None:
            raise NonFiniteEmbeddingError(self._poisoned)
        if len(self._in_flight) >= self._workers.max_in_flight:
            raise self._refusal()
        workers = self._workers
        if self.directory is None:
            with self.graph_lock:
                diff = self.last_diff = self.graph.apply(batch, skip_invalid)
            self._in_flight.append(_InFlight(workers.submit_diff(diff), len(batch),
                                             diff.rejected, self.graph.ext[diff.removed]))
            return
        enc = (batch.with_width(self.num_features) if isinstance(batch, UpdateBatch)
               else UpdateBatch.from_updates(batch, self.num_features))
        if self.directory.high_due:  # before the first batch
            self.directory.mark_high(workers.high_in_degree(HIGH_FACTOR)())
        self.directory.use_asked()
        decided = self.directory.decide(enc, skip_invalid)
        routed = shares(decided, enc, self.num_partitions, self._released)
        self._released = _NONE_RELEASED
        if not skip_invalid:  # the directory's first rejection, or one of an edge
            errors = decided.rejected + [e.at(int(r.positions[e.index])) for r, e in zip(
                routed, workers.check(routed), strict=True) if e is not None]
            if errors:
                self.directory.undo(decided)
                raise min(errors, key=lambda e: e.index)
        self.directory.commit(decided)
        subscribed = (np.concatenate([r.subscribed for r in routed]),
                      np.concatenate([r.subscribers for r in routed]))
        results = workers.submit(routed)
        asked = workers.high_in_degree(HIGH_FACTOR) if self.directory.asking() else None
        self._in_flight.append(_InFlight(results, len(batch), decided.rejected,
                                         decided.removed, subscribed,
                                         [r.positions for r in routed], asked))

    def collect(self) -> ApplyResult:
        """The result of the oldest batch `submit` started and nothing collected yet,
        once every shard is done with it (numpy only: no torch mode to enter)."""
        if not self._in_flight:
            raise RuntimeError("no batch in flight: collect() follows submit()")
        flight = self._in_flight.popleft()
        results = self._collected = self._results(flight)
        if bad := [r.non_finite for r in results if r.non_finite]:
            self._poisoned = (f"a batch of {flight.size} updates drove layer {min(bad)} "
                              "embeddings to NaN or inf; restore the engine from a snapshot")
            while self._in_flight:  # the workers' replies to a batch after it, let go
                self._results(self._in_flight.popleft())
            raise NonFiniteEmbeddingError(self._poisoned)
        rejected = flight.rejected
        if self.directory is not None:
            self._let_go(results)
            self._num_edges += sum(r.edges_added for r in results)
            rejected = sorted(rejected + [  # the partitions' rejections in their shares
                e.at(int(at[e.index])) for at, r in zip(flight.positions, results, strict=True)
                for e in r.rejected], key=lambda e: e.index)
        labels = ChangedLabels.concat([r.changed_labels for r in results])
        names = ("recomputed", "pulled", "pulled_columns", "remote_reads", "combined_messages")
        counts = ({name: getattr(results[0], name) for name in names} if len(results) == 1
                  else {name: [sum(c) for c in zip(*(getattr(r, name) for r in results),
                                                    strict=True)]
                        for name in names})  # per layer, summed over the shards
        return ApplyResult(labels, rejected, removed=flight.removed, **counts)

    def _results(self, flight: _InFlight) -> list[ApplyResult]:
        """A batch's results, then the high in-degree set asked for after it (the workers'
        next answer)."""
        results = flight.results()
        if flight.asked is not None:
            self.directory.answered(flight.asked())
        return results

    def _let_go(self, results: list[ApplyResult]) -> None:
        """Add the ghosts the partitions let go of in a batch to what the next batch tells
        their owners, but those that a batch submitted after it (still in flight) made the
        same partition hold again: its owner must keep sending it their rows."""
        if not any(len(r.released[0]) for r in results if r.released is not None):
            return
        again = {pair for f in self._in_flight
                 for pair in zip(*(a.tolist() for a in f.subscribed), strict=True)}
        ids, owners, holders = (list(a) for a in self._released)
        for q, r in enumerate(results):
            for u, owner in zip(*(a.tolist() for a in r.released or ((), ())), strict=True):
                if (u, q) not in again:
                    ids.append(u)
                    owners.append(owner)
                    holders.append(q)
        self._released = tuple(np.array(a, np.int64) for a in (ids, owners, holders))

    @property
    def computing(self) -> bool:
        """Whether a batch `submit` started may still be computing: it was not collected
        yet and its workers go on meanwhile (they run elsewhere: MPI workers; or a planned
        batch's copy back from the device, `LocalWorkers.copying`)."""
        workers = self._workers
        return bool(self._in_flight) and (workers.max_in_flight > 1
                                          or (workers.held and workers.copying))

    @property
    def takes_another(self) -> bool:
        """Whether `submit` takes a batch now, before those in flight are collected
        (fewer than `Workers.max_in_flight`)."""
        return len(self._in_flight) < self._workers.max_in_flight

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
        """Per layer 0..L (0: the features), the rows the last batch collected wrote, as
        (`index` slots ascending, rows); merged from the shards' reports when asked (the
        read view asks, before the next batch), empty where the shards run elsewhere or a
        batch is in flight (their slots may have moved on)."""
        results = self._collected
        if self._in_flight or not results or not all(r.rewritten for r in results):
            return []
        return [self._rewritten(layer) for layer in zip(*(r.rewritten for r in results))]

    def _rewritten(self, shards: tuple[tuple[np.ndarray, np.ndarray], ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """One layer's rows the shards wrote (their slots, their rows), by `index` slots
        (ascending)."""
        if self.directory is None:
            return shards[0]
        if [m.source for m in self._slot_maps] != [shard.graph for shard in self.shards]:
            self._slot_maps = [SlotMap(shard.graph, self.index) for shard in self.shards]
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
class Neighborhood:
    """Some vertices' in-edges in CSR form: vertex i's sources are ``src[ptr[i]:ptr[i+1]]``
    (ids; weights ``w`` alongside; both empty when asked without edges), its in-degree
    ``count[i]`` and its weighted in-degree ``in_weight[i]``."""

    count: np.ndarray
    in_weight: np.ndarray
    ptr: np.ndarray
    src: np.ndarray
    w: np.ndarray

    @classmethod
    def gathered(cls, owner: np.ndarray, replies: list[dict[str, np.ndarray]]
                 ) -> Neighborhood:
        """The vertices' neighborhoods in their order from each partition's reply about
        the vertices it owns (``owner``: each vertex's partition, `Shard.neighbors`)."""
        if len(replies) == 1:  # one partition: its reply is in the vertices' order
            r = replies[0]
            return cls(r["count"], r["in_weight"], np.concatenate([[0], np.cumsum(r["count"])]),
                       r.get("nbr", np.zeros(0, np.int64)),
                       np.asarray(r.get("w", np.zeros(0)), np.float64))
        n = len(owner)
        count, in_weight = np.zeros(n, np.int64), np.zeros(n, np.float64)
        where = [np.flatnonzero(owner == p) for p in range(len(replies))]
        for at, reply in zip(where, replies, strict=True):
            count[at], in_weight[at] = reply["count"], reply["in_weight"]
        ptr = np.concatenate([[0], np.cumsum(count)])
        if "nbr" not in replies[0]:
            return cls(count, in_weight, ptr, np.zeros(0, np.int64), np.zeros(0))
        src = np.empty(int(ptr[-1]), np.int64)
        w = np.empty(int(ptr[-1]), np.float64)
        for at, reply in zip(where, replies, strict=True):
            c = reply["count"]
            first = np.repeat(ptr[at] - np.concatenate([[0], np.cumsum(c)[:-1]]), c)
            into = first + np.arange(len(reply["nbr"]))
            src[into], w[into] = reply["nbr"], reply["w"]
        return cls(count, in_weight, ptr, src, w)


@dataclass
class _InFlight:
    """A batch `Engine.submit` started: what waits for its shards' results, and what the
    result needs of the graph as the batch left it."""

    results: Callable[[], list[ApplyResult]]
    size: int
    rejected: list[InvalidUpdateError]  # (with partitions: the directory's)
    removed: np.ndarray  # ids of the vertices it deleted
    subscribed: tuple[np.ndarray, np.ndarray] = _NO_PAIRS  # (ids, holders) told owners
    positions: list[np.ndarray] = field(default_factory=list)  # of each share in the batch
    asked: Callable[[], np.ndarray] | None = None  # the high in-degree set asked for after it


def _cutter(graph: DynamicGraph, part: np.ndarray) -> Callable[[int], dict[str, np.ndarray]]:
    """``cut(p)``: shard ``p`` of ``graph`` with owners ``part`` (by slot), without layer
    state (`Shard.bootstrap` computes it): the vertices it owns, the in-neighbors it needs
    as ghosts (their in-degrees too), the edges into its vertices, and who holds its
    vertices as ghosts."""
    src, dst, w = graph.edge_slots()
    holders = np.zeros(graph.num_slots, np.uint64)  # per slot, a bit per holder
    cut = part[src] != part[dst]
    np.bitwise_or.at(holders, src[cut], bit(part[dst[cut]]))
    return functools.partial(_cut, graph, part, holders, (src, dst, w))


def _cut(g: DynamicGraph, part: np.ndarray, holders_of: np.ndarray,
         edges: tuple[np.ndarray, np.ndarray, np.ndarray], p: int) -> dict[str, np.ndarray]:
    src, dst, w = edges
    into = part[dst] == p
    owned = np.flatnonzero(part[:g.num_slots] == p)
    ghosts = np.setdiff1d(src[into], owned)
    local = np.concatenate([owned, ghosts])
    data = GraphData(g.ext[local], g.ext[src[into]], g.ext[dst[into]], g.x[local],
                     weight=w[into])
    graph = DynamicGraph.from_data(data, CHECKED)
    graph.in_weight[len(owned):len(local)] = g.in_weight[ghosts]
    holders = np.zeros(len(graph.alive), np.uint64)
    holders[:len(owned)] = holders_of[owned]
    owner = np.full(len(graph.alive), -1, np.int16)
    owner[len(owned):len(local)] = part[ghosts]
    return Shard.cut(graph, len(owned), holders, owner)


def _check_workers(workers: Workers | None, partitions: int) -> None:
    if workers is not None and workers.size != partitions:
        raise ValueError(f"{partitions} partitions for {workers.size} workers")
