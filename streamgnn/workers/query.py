"""Query serving (docs/architecture.md "The life of a query"): new vertices answered from
the engine's exact embeddings, as if inserted, without changing them.

Over G plus the query Q (`QueryGraph`: existing vertices by the engine's `index` slots,
query vertex i at virtual slot N + i; G's in-edges fetched from the partitions owning
their destinations, as the plan reaches them), per layer l = 1..L (`plan`):
- *needed* B_l: the vertices whose h^l the answer reads: B_L = Q, B_(l-1) = B_l and their
  in-neighbors;
- *recomputed* R_l: exact mode, the needed vertices whose h^l the query changes (Q, what is
  within l hops downstream of it and, for degree-normalised layers, the vertices whose
  in-degree it changes and their out-neighbors); SRPE, Q and the candidates the budget
  lets a policy choose (OMEGA section 5). Every other row is the engine's stored one:
  exact for G, and for a vertex the query does not change, exact for G plus Q.
Layer l then aggregates each vertex of R_l over its in-edges in G plus Q (`run`): edges
from R_(l-1) here, from the rows just computed; edges from any other vertex at the
partition owning it, from its stored rows, one partial aggregate per destination and
partition (computation-graph parallelism: rows never travel, partials do); the partials
merge by the aggregation's own rule (`Aggregation.merge`) and the update runs here. The
query vertices live with the coordinator, so the all-to-all of partials is a gather to it.
The host lays out every layer of a batch before the dense work and hands it to the
executor's device in one upload; the answer comes back in one download. With the shards
in this process on that device (`Workers.held`), the layout holds what they need for their
stored rows and partials (their edges, the rows they transform and those rows' features),
and they compute those from the uploaded tensors where they are; shards elsewhere (MPI)
answer with host arrays, which travel in the same upload, but for attention's partials,
which need the destination parts only the dense work gives.

Owns query planning and execution; must not import kafka or mpi4py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from streamgnn.errors import DuplicateVertexError, InvalidQueryError, UnknownVertexError
from streamgnn.graph import DynamicGraph
from streamgnn.graph.idmap import IdMap, Slotted
from streamgnn.models.layers import Layer
from streamgnn.models.transfer import download, upload
from streamgnn.npz import prefixed, under
from streamgnn.queries import MAX_QUERY_VERTICES, QueryColumns
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.shard import Deferred
from streamgnn.workers.slotsets import SlotSets, marked

if TYPE_CHECKING:
    from streamgnn.workers.engine import Neighborhood

@dataclass
class QueryAnswer:
    """The answer to a query: for its vertices in request order, ``ids``, output
    ``embeddings`` [n, d_L] and ``labels`` (argmax); how it was computed: ``budget``
    (None: exact) and ``policy``, ``candidates`` (SRPE: existing vertices that receive a
    query edge and feed the answer) and per layer 1..L the ids of the existing vertices
    ``recomputed``; between the coordinator and the partitions per layer, the bytes
    ``sent`` and ``received`` (edge lists out, partial aggregates and rows back) and
    ``pull_bytes``, what fetching the stored in-neighbor rows instead of partials would
    have received; ``work``, the in-edges aggregated, and the ``device`` the dense work
    ran on. ``changed_labels``: with ``insert``, what inserting changed."""

    ids: np.ndarray
    embeddings: np.ndarray
    labels: np.ndarray
    budget: float | None
    policy: str
    candidates: int = 0
    recomputed: list[np.ndarray] = field(default_factory=list)
    sent_bytes: list[int] = field(default_factory=list)
    received_bytes: list[int] = field(default_factory=list)
    pull_bytes: list[int] = field(default_factory=list)
    work: int = 0
    device: str = "cpu"
    changed_labels: ChangedLabels = field(default_factory=ChangedLabels.empty)


class Reads(Protocol):
    """G's edges and degrees of existing vertices, by the engine's `index` slots."""

    def in_edges(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, source slots, weights float64) of distinct ``slots``' in-edges, CSR."""
        ...

    def degrees(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """In-degree and weighted in-degree (float64) of distinct ``slots``."""
        ...

    def receivers(self, vertices: np.ndarray, mark: np.ndarray) -> np.ndarray:
        """Per one of distinct ``vertices``: whether an edge of G enters it from a vertex
        ``mark`` (a mask over the virtual slots) marks."""
        ...


class GraphReads:
    """`Reads` of the engine's own graph (one partition): its arrays, read in place."""

    def __init__(self, graph: DynamicGraph) -> None:
        self.graph = graph

    def in_edges(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ptr, src, w = self.graph.in_edges(slots)
        return ptr, src.astype(np.int64), w.astype(np.float64)

    def degrees(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.graph.in_degree[slots], self.graph.in_weight[slots]

    def receivers(self, vertices: np.ndarray, mark: np.ndarray) -> np.ndarray:
        """Walks the marked sources' out-edges or the vertices' in-edges, whichever are
        fewer."""
        g = self.graph
        sources = np.flatnonzero(mark[:g.num_slots])
        if g.out_degree[sources].sum() <= g.in_degree[vertices].sum():
            _, dst, _ = g.out_edges(sources)
            return marked(len(mark), dst)[vertices]
        ptr, src, _ = g.in_edges(vertices)
        at = np.repeat(np.arange(len(vertices)), np.diff(ptr))
        return np.bincount(at[mark[src]], minlength=len(vertices)) > 0


class FetchedReads:
    """`Reads` of a graph held in partitions: in-edges and degrees asked of the vertices'
    owners through ``fetch`` (`Engine.in_edges`, by id), each vertex's once per query, in
    one call per question, kept in a cache. Every source fetched is a live vertex: its
    ``index`` slot is known."""

    def __init__(self, index: Slotted, fetch: Callable[[np.ndarray, bool], Neighborhood],
                 sets: SlotSets) -> None:
        self.index, self.fetch, self.sets = index, fetch, sets
        # one entry per vertex fetched (in fetch order): its in-degree and weighted
        # in-degree, and where its in-edges (sources' slots, weights) start in _src and _w
        # (-1: fetched without them)
        self._held = np.zeros(0, np.int64)
        self._count = np.zeros(0, np.int64)
        self._weight = np.zeros(0, np.float64)
        self._start = np.zeros(0, np.int64)
        self._src = np.zeros(0, np.int64)
        self._w = np.zeros(0, np.float64)

    def in_edges(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at = self._cached(slots, True)
        count = self._count[at]
        ptr = np.concatenate([[0], np.cumsum(count)])
        take = np.repeat(self._start[at] - ptr[:-1], count) + np.arange(ptr[-1])
        return ptr, self._src[take], self._w[take]

    def degrees(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = self._cached(slots, False)
        return self._count[at], self._weight[at]

    def receivers(self, vertices: np.ndarray, mark: np.ndarray) -> np.ndarray:
        """Walks the vertices' in-edges (the sources' out-edges are spread over every
        partition)."""
        ptr, src, _ = self.in_edges(vertices)
        at = np.repeat(np.arange(len(vertices)), np.diff(ptr))
        return np.bincount(at[mark[src]], minlength=len(vertices)) > 0

    def _cached(self, slots: np.ndarray, edges: bool) -> np.ndarray:
        """Positions in the cache of distinct ``slots``; those not in it (with ``edges``:
        or in it without their in-edges) are fetched first, in one call."""
        at = self.sets.find(self._held, slots)
        held = at >= 0
        missing = ~held
        if edges:
            missing[held] = self._start[at[held]] < 0
        if not missing.any():
            return at
        asked = slots[missing]
        got = self.fetch(self.index.ext[asked], edges)
        start = np.full(len(asked), -1, np.int64)
        if edges:
            start = len(self._src) + got.ptr[:-1]
            self._src = np.concatenate([self._src, self.index.find(got.src)])
            self._w = np.concatenate([self._w, got.w])
        new = ~held[missing]
        self._start[at[missing][~new]] = start[~new]  # had only their degrees
        at[np.flatnonzero(missing)[new]] = len(self._held) + np.arange(int(new.sum()))
        self._held = np.concatenate([self._held, asked[new]])
        self._count = np.concatenate([self._count, got.count[new]])
        self._weight = np.concatenate([self._weight, got.in_weight[new]])
        self._start = np.concatenate([self._start, start[new]])
        return at


class QueryGraph:
    """G plus a query's vertices and edges, read without changing G: existing vertices by
    their ``index`` slot (the engine's), query vertex i at virtual slot ``N + i`` (N =
    ``index.num_slots``); G's edges and degrees through ``reads``. Raises the error naming
    a query id already in G, an edge endpoint in neither, or an edge joining two existing
    vertices. Set operations on virtual slots go through ``sets`` (the engine's, kept
    between queries)."""

    def __init__(self, index: Slotted, reads: Reads, cols: QueryColumns, sets: SlotSets
                 ) -> None:
        self.index, self.reads, self.cols, self.sets = index, reads, cols, sets
        self.n0 = n0 = index.num_slots
        taken = np.flatnonzero(index.contains(cols.ids))
        if len(taken):
            i = int(taken[0])
            raise DuplicateVertexError(f"query vertex {cols.ids[i]} is already in the "
                                       "graph (a query adds new vertices)", index=i)
        self.q = n0 + np.arange(len(cols.ids), dtype=np.int64)
        sets.fit(len(index.alive) + MAX_QUERY_VERTICES)  # every virtual slot, any query
        self.src, self.dst = self._virtual(cols.src, cols.dst)
        self.w = cols.weight.astype(np.float64)
        # existing vertices a query edge enters
        self.degree_changed = sets.union(self.dst[self.dst < n0])

    def _virtual(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Virtual slots of the query edges' ends."""
        query = IdMap(len(self.q))
        query.insert(self.cols.ids, np.arange(len(self.q), dtype=np.int32))
        ends = np.concatenate([src, dst])
        slots = query.get(ends).astype(np.int64)
        found = slots >= 0
        slots += self.n0
        slots[~found] = self.index.find(ends[~found])
        s, d = slots[:len(src)], slots[len(src):]
        unknown = (s < 0) | (d < 0)
        existing = (s < self.n0) & (d < self.n0) & ~unknown
        if (bad := np.flatnonzero(unknown | existing)).size:
            j = int(bad[0])
            if unknown[j]:
                v = src[j] if s[j] < 0 else dst[j]
                raise UnknownVertexError(f"query edge {src[j]} -> {dst[j]}: vertex {v} is "
                                         "neither in the graph nor in the query", index=j)
            raise InvalidQueryError(f"query edge {src[j]} -> {dst[j]} joins two existing "
                                    "vertices: that is an update (add_edge), not a query",
                                    index=j)
        return s, d

    def ext(self, slots: np.ndarray) -> np.ndarray:
        """External ids of virtual slots."""
        out = np.empty(len(slots), np.int64)
        mine = slots >= self.n0
        out[mine] = self.cols.ids[slots[mine] - self.n0]
        out[~mine] = self.index.ext[slots[~mine]]
        return out

    def in_edges(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, src, weight) of the in-edges of sorted distinct ``targets``, CSR-style
        (virtual slots; weights float64)."""
        old = targets < self.n0
        ptr, src, w = self.reads.in_edges(targets[old])
        at = np.repeat(np.flatnonzero(old), np.diff(ptr))
        at_q = self.sets.find(targets, self.dst)
        into = at_q >= 0
        at = np.concatenate([at, at_q[into]])
        order = np.argsort(at, kind="stable")
        counts = np.bincount(at, minlength=len(targets))
        return (np.concatenate([[0], np.cumsum(counts)]),
                np.concatenate([src, self.src[into]])[order],
                np.concatenate([w, self.w[into]])[order])

    def reached(self, vertices: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """Per one of ``vertices``: whether it is one of ``sources`` or receives an edge
        from one (an edge of G comes from an existing source to an existing vertex)."""
        mark = self.mask(sources)
        reach = self.mask(self.dst[mark[self.src]])  # query edges from a source
        out = mark[vertices] | reach[vertices]
        old = vertices < self.n0
        if old.any() and (sources < self.n0).any():
            out[old] |= self.reads.receivers(vertices[old], mark)
        return out

    def mask(self, slots: np.ndarray) -> np.ndarray:
        """A boolean array over the virtual slots, True at ``slots``."""
        return marked(self.n0 + len(self.q), slots)

    def in_weight(self, vertices: np.ndarray) -> np.ndarray:
        """Weighted in-degree of sorted distinct ``vertices`` (float64)."""
        return self._degrees(vertices, True)

    def in_degree(self, vertices: np.ndarray) -> np.ndarray:
        """In-degree of sorted distinct ``vertices``."""
        return self._degrees(vertices, False)

    def _degrees(self, vertices: np.ndarray, weighted: bool) -> np.ndarray:
        """Per sorted distinct ``vertices``: its in-degree in G (query vertices: 0) plus
        its query in-edges; ``weighted``, their weights summed instead."""
        old = vertices < self.n0
        count, weight = self.reads.degrees(vertices[old])
        out = np.zeros(len(vertices), np.float64 if weighted else np.int64)
        out[old] = weight if weighted else count
        at = self.sets.find(vertices, self.dst)
        into = at >= 0
        return out + np.bincount(at[into], self.w[into] if weighted else None, len(vertices))


def plan(qg: QueryGraph, layers: list[Layer], budget: float | None, policy: str,
         seed: int = 0) -> tuple[list[np.ndarray], int]:
    """R_1..R_L (sorted virtual slots) and the number of SRPE candidates. Exact mode
    finds R_l among B_l alone: a vertex of B_l changes at layer l if it is in R_(l-1)
    or receives an edge from it (or, for degree-normalised layers, from a vertex whose
    in-degree the query changes), and all its in-neighbors are in B_(l-1)."""
    num = len(layers)
    need: list[np.ndarray] = [qg.q] * (num + 1)
    for hop in range(num, 1, -1):
        need[hop - 1] = qg.sets.union(need[hop], qg.in_edges(need[hop])[1])
    if budget is None:
        recompute, changed = [], qg.q
        for hop, layer in enumerate(layers, start=1):
            sources = (qg.sets.union(changed, qg.degree_changed) if layer.degree_normalised
                       else changed)
            changed = need[hop][qg.reached(need[hop], sources)]
            recompute.append(changed)
        return recompute, 0
    candidates = qg.degree_changed[qg.mask(need[1])[qg.degree_changed]]
    chosen = choose(qg, candidates, budget, policy, seed)
    return [np.concatenate([chosen[qg.mask(need[hop])[chosen]], qg.q])
            for hop in range(1, num)] + [qg.q], len(candidates)


def choose(qg: QueryGraph, candidates: np.ndarray, budget: float, policy: str,
           seed: int = 0) -> np.ndarray:
    """The ceil(budget x |candidates|) candidates to recompute (sorted): ``top-ratio``,
    the highest share of in-edges from the query (OMEGA's top-query-edges-ratio);
    ``degree``, the highest importance score 1/deg(v) x sum over in-neighbors u of
    1/deg(u) (OMEGA's IS); ``random``, uniformly with ``seed``. Ties go to the smaller
    external id."""
    k = min(len(candidates), math.ceil(round(budget * len(candidates), 9)))
    if k == 0:
        return candidates[:0]
    if policy == "random":
        return np.sort(np.random.default_rng(seed).choice(candidates, k, replace=False))
    if policy == "top-ratio":
        at = qg.sets.find(candidates, qg.dst)
        score = np.bincount(at[at >= 0], minlength=len(candidates)).astype(np.float64)
    elif policy == "degree":
        ptr, src, _ = qg.in_edges(candidates)
        sources, at = np.unique(src, return_inverse=True)
        inverse = 1.0 / np.maximum(qg.in_degree(sources), 1)
        score = np.add.reduceat(np.append(inverse[at], 0.0), ptr[:-1]) * (np.diff(ptr) > 0)
    else:
        raise InvalidQueryError(f"policy {policy!r}: use top-ratio, random or degree")
    score /= np.maximum(qg.in_degree(candidates), 1)  # (degree: read where in_edges left it)
    order = np.lexsort((qg.ext(candidates), -score))
    return np.sort(candidates[order[:k]])


@dataclass
class _Hop:
    """One layer of a query batch as the host lays it out before any dense work: the
    in-edges of ``targets`` (R_l) with their sources ``src``, message factors ``w`` and
    destinations ``at`` (positions in ``targets``); per edge, ``pos``, its source's row
    among those computed here at the layer below (-1: a stored row, aggregated at its
    owner); whether the targets' rows of the layer below are those rows as they are
    (``same_rows``); per partition, the ``requests`` for its partial aggregates (None:
    nothing asked of it) and how each reply joins the state (``joins``: ``merge``,
    ``all`` rows or ``some``); ``up``, the host arrays the dense work reads (the stored
    rows and the partials among them where the partitions answer over the wire); with
    ``local`` (the shards in this process, on the executor's device) ``works``, their
    work there instead (`Deferred`: ``stored``, the stored rows; ``reply<p>``, partition
    p's partials), whose arrays travel in ``up`` under their names; the bytes ``sent``
    and ``received`` and those of the stored rows ``fetched``."""

    targets: np.ndarray
    src: np.ndarray
    w: np.ndarray
    at: np.ndarray
    pos: np.ndarray
    same_rows: bool
    requests: list[dict | None]
    joins: list[tuple[int, str]]
    up: dict[str, np.ndarray]
    local: bool
    works: dict[str, Deferred] = field(default_factory=dict)
    sent: int = 0
    received: int = 0
    fetched: int = 0

    @property
    def mine(self) -> np.ndarray:
        """Per edge: whether its source's row was computed here."""
        return self.pos >= 0

    def ask(self, engine) -> None:
        """The partitions' partial aggregates as host arrays, into ``up`` (``reply<p>``)."""
        for p, reply in enumerate(engine.workers.partials(self.requests)):
            if reply is not None:
                self.up[f"reply{p}"] = reply
                self.received += reply.nbytes

    def add(self, name: str, work: Deferred) -> None:
        """``work`` of a shard on the executor's device, its arrays into ``up``."""
        self.works[name] = work
        self.up.update(prefixed(f"{name}/", work.arrays))

    def finish(self, name: str, up: dict[str, Tensor], dst_part: Tensor | None = None
               ) -> Tensor:
        """What work ``name`` gives, from its arrays in ``up`` (on the device)."""
        return self.works[name].finish(under(up, f"{name}/"), dst_part)


@torch.inference_mode()
def run(engine, qg: QueryGraph, recompute: list[np.ndarray], answer: QueryAnswer,
        layers: list[Layer]) -> Tensor:
    """The query vertices' output rows [n, d_L] (request order), layer by layer as the
    module says, with ``layers`` (on the executor's device); fills ``answer``'s per-layer
    counts. The host lays out every layer first (`_layout`: edges, stored rows, the
    partitions' partial aggregates, or where the shards run in this process on the same
    device, what they need to compute those there: their edges, the rows to transform
    and their features) and hands it all to the device in one upload; the dense work then
    reads nothing back, but for destination-dependent aggregations (attention) with the
    shards answering over the wire, whose partitions need each layer's destination parts:
    one download and one upload for each such layer that asks any."""
    device, dtype = torch.device(answer.device), engine.dtype
    local = engine.workers.held and _same(engine.device, device)
    hops = []
    for hop, (layer, targets) in enumerate(zip(layers, recompute, strict=True), start=1):
        hops.append(_layout(engine, qg, layer, hop, targets,
                            recompute[hop - 2] if hop > 1 else qg.q, local))
    features, *ups = _send(device, [{"x": qg.cols.x}] + [h.up for h in hops])
    here = features["x"].to(dtype)
    for hop, layer, up in zip(hops, layers, ups, strict=True):
        h, here = _compute(engine, layer, hop, up, here)
        old = hop.targets[hop.targets < qg.n0]
        answer.recomputed.append(qg.index.ext[old])
        answer.sent_bytes.append(hop.sent)
        answer.received_bytes.append(hop.received + hop.fetched)
        width = h.shape[1] * h.element_size() + 8
        answer.work += len(hop.src)
        answer.pull_bytes.append(len(qg.sets.union(hop.src[~hop.mine])) * width
                                 + hop.fetched)
    return here


def _layout(engine, qg: QueryGraph, layer: Layer, hop: int, targets: np.ndarray,
            below: np.ndarray, local: bool) -> _Hop:
    """Layer ``hop`` of the query batch on the host (`_Hop`): ``targets`` its R_l,
    ``below`` the vertices whose rows of the layer below are computed here. With
    ``local`` (the shards in this process, on the executor's device) the shards' rows and
    partials are work for the device (`_Hop.works`); else they are asked for now, but
    partials whose aggregation needs the destinations' parts (which only the dense work
    gives)."""
    ptr, src, w = qg.in_edges(targets)
    count = np.diff(ptr)
    at = np.repeat(np.arange(len(targets)), count)
    pos = qg.sets.find(below, src)
    if layer.degree_normalised:  # each edge's factor carries its source's scale
        sources, inverse = np.unique(src, return_inverse=True)
        w = w * layer.host_source_scale(qg.in_weight(sources))[inverse]
    out = _Hop(targets, src, w, at, pos, False, [], [],
               {"count": count, "in_weight": qg.in_weight(targets)}, local)
    up = out.up
    rows_at = qg.sets.find(below, targets)
    kept = rows_at >= 0
    out.same_rows = bool(len(targets) == len(below)
                         and (rows_at == np.arange(len(below))).all())
    if not out.same_rows:
        up["kept"] = rows_at[kept]
    if not kept.all():
        stored_at = np.flatnonzero(~kept)
        owners = engine.owners(targets[stored_at])
        order = np.argsort(owners, kind="stable")  # `LocalWorkers` hold them so, owner by owner
        stored_at, owners = stored_at[order], owners[order]
        ids = qg.index.ext[targets[stored_at]]
        up["kept_at"], up["stored_at"] = np.flatnonzero(kept), stored_at
        if local:
            out.add("stored", engine.workers.rows_work(owners, ids, hop - 1))
        else:
            up["stored"] = engine.workers.rows(owners, ids, hop - 1)
    mine = pos >= 0
    up["pos"], up["at"], up["w"] = pos[mine], at[mine], w[mine]  # edges from rows here
    got = np.bincount(at[mine], minlength=len(targets))
    stored = np.flatnonzero(~mine)
    owner = engine.owners(src[stored])
    for p in range(engine.num_partitions):
        edges = stored[owner == p]
        if not len(edges):
            out.requests.append(None)
            continue
        local_at, dst = np.unique(at[edges], return_inverse=True)
        req = {"hop": hop, "src": qg.index.ext[src[edges]], "dst": dst.astype(np.int32),
               "w": w[edges], "num": len(local_at), "dst_part": None}
        out.sent += sum(a.nbytes for a in req.values() if isinstance(a, np.ndarray))
        if engine.directory is None:  # one shard, on this graph: its slots are ours
            req["slots"] = src[edges]
        out.requests.append(req)
        theirs = np.bincount(dst, minlength=len(local_at))
        up[f"local{p}"] = local_at
        if got[local_at].any():
            out.joins.append((p, "merge"))
            up[f"got{p}"], up[f"theirs{p}"] = got[local_at], theirs
        else:  # every row of these a placeholder so far: theirs
            out.joins.append((p, "all" if len(local_at) == len(targets) else "some"))
        got[local_at] += theirs
    if local:
        for p, work in enumerate(engine.workers.partials_work(out.requests)):
            if work is not None:
                out.add(f"reply{p}", work)
    elif out.joins and not layer.aggr.destination_dependent:
        out.ask(engine)
    return out


def _compute(engine, layer: Layer, hop: _Hop, up: dict[str, Tensor], here: Tensor
             ) -> tuple[Tensor, Tensor]:
    """The dense work of layer ``hop`` (its host arrays ``up`` on the device) from the rows
    computed ``here`` at the layer below: the targets' rows of the layer below and of
    this one."""
    h = _rows(hop, up, here)
    t = layer.transform(h) if layer.self_transform or layer.caches_t else None
    dst_part = (layer.destination_part(t if t is not None else layer.transform(h))
                if layer.aggr.destination_dependent else None)
    parts: dict[int, Tensor] = {}  # per partition asked, its destinations' parts
    if dst_part is not None:
        parts = {p: dst_part.index_select(0, up[f"local{p}"]) for p, _ in hop.joins}
        hop.sent += sum(part.nbytes for part in parts.values())
    if parts and not hop.local:  # they answer over the wire: the parts go as host rows
        for p, part in zip(parts, download(*parts.values()), strict=True):
            hop.requests[p]["dst_part"] = part
        hop.up = {}
        hop.ask(engine)
        up = {**up, **_send(here.device, [hop.up])[0]}
    ours = here if hop.mine.any() else here[:0]  # no edge from here: placeholders only
    state = layer.partial(layer.transform(ours), up["pos"], up["at"], up["w"],
                          len(hop.targets), dst_part)
    for p, join in hop.joins:
        if hop.local:
            reply = hop.finish(f"reply{p}", up, parts.get(p))
            hop.received += reply.nbytes
        else:
            reply = up[f"reply{p}"]
        reply, index = reply.to(state.dtype), up[f"local{p}"]
        if join == "merge":
            state[index] = layer.aggr.merge(state.index_select(0, index), up[f"got{p}"],
                                            reply, up[f"theirs{p}"])
        elif join == "all":
            state = reply
        else:
            state[index] = reply
    agg = layer.aggr.finalize(state, up["count"]).to(h.dtype)
    return h, layer.update(h, agg, t, up["in_weight"].to(h.dtype))


def _rows(hop: _Hop, up: dict[str, Tensor], here: Tensor) -> Tensor:
    """h of the layer below of ``hop``'s targets: rows of those computed ``here``, and
    where none was the stored row, fetched from the partition owning it (``up``'s
    ``stored``, or the shards' work on this device); counts their bytes as the wire
    would carry them (``hop.fetched``)."""
    if hop.same_rows:
        return here
    if "stored_at" not in up:
        return here.index_select(0, up["kept"])
    stored = hop.finish("stored", up) if hop.local else up["stored"]
    hop.fetched = stored.shape[0] * (stored.shape[1] * here.element_size() + 8)
    out = here.new_empty((len(hop.targets), here.shape[1]))
    out[up["kept_at"]] = here.index_select(0, up["kept"])
    out[up["stored_at"]] = stored.to(here.dtype)
    return out


def _same(a: torch.device, b: torch.device) -> bool:
    """Whether devices ``a`` and ``b`` are one (a device without an index: the current one
    of its type)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _send(device: torch.device, parcels: list[dict[str, np.ndarray]]
          ) -> list[dict[str, Tensor]]:
    """Every parcel's host arrays as tensors on ``device``, by the same names, in one
    upload."""
    names = [(i, name) for i, parcel in enumerate(parcels) for name in parcel]
    tensors = upload(device, *(parcels[i][name] for i, name in names))
    out: list[dict[str, Tensor]] = [{} for _ in parcels]
    for (i, name), tensor in zip(names, tensors, strict=True):
        out[i][name] = tensor
    return out
