"""Query-serving benchmark (issue 15): new vertices answered by the engine (exact mode and
SRPE) against full k-hop recompute and neighbor sampling with PyG's layers, in the same run.

    python benchmarks/queries.py                      # arxiv-like, 500 requests per batch size
    python benchmarks/queries.py --quick              # 40 requests, shorter Poisson/mixed runs
    python benchmarks/queries.py --undirected --requests 100 --out docs/undirected
    python benchmarks/queries.py --dataset products-like --requests 20 --epochs 3 \
        --partitions 0 --poisson-seconds 5 --mixed-seconds 5 --out docs/products-like
    python benchmarks/queries.py --model gcn --batch-sizes 64 1024 --requests 200
    python benchmarks/queries.py --parts main --batch-sizes 1 64 --merge   # re-measure some

products-like (2.45M vertices) peaks at ~20 GB (training); its CGP part does not fit in
24 GiB (the partitioned engine holds the router's graph, four shard graphs and their
states beside the first engine, even with ``--cgp-sequential``): leave it out there.

Workload (OMEGA section 8, "Workloads"): a seeded 25 % of the vertices is held out; the
model (2 layers, hidden 128, `streamgnn.models.train`, best-validation weights) is trained
on the 75 % snapshot (the graph without them) and the engine bootstrapped on it. A request
of B vertices picks B held-out vertices at random (seeded; 500 requests per batch size,
reused by every method) with all their edges to the snapshot, both directions. Edges
between two held-out vertices are dropped, as in OMEGA (``--query-to-query`` keeps those
whose ends are both in the same request). Edges have weight 1.

Methods, one request at a time, each timed from the request in hand to the labels:
- full k-hop: the request's k-hop in-neighborhood in G plus the query, extracted from a
  numpy CSR, features gathered, PyG's own convs run layer by layer (layer l only for the
  vertices layer l+1 needs). GCN's normalisation uses the true in-degrees of G plus the
  query (a sampler's subgraph lacks the in-edges of its outermost hop), so full k-hop
  computes exactly the embeddings inserting the query would give.
- NS: the same with at most ``--fanout`` in-edges sampled per vertex (uniform without
  replacement, Floyd's algorithm; a vertex is sampled once per request), PyG's layers on
  the sampled subgraph as they are (GCN normalised within it, as PyG's NeighborLoader).
- exact: ``engine.query(req)``, the engine's mode that answers as if inserted, ``req``
  the request's arrays (`sg.QueryColumns`, as the baselines get them); "exact (objects)"
  the same from a `sg.QueryRequest` of pydantic objects (what a decoded JSON request is).
- SRPE: ``engine.query(req, budget=gamma, policy=...)`` for each gamma and policy.
Requests are built before the clock starts; ``engine.query``'s own validation is timed.
Per method and batch size: p50/p99 latency per request, query vertices/s, accuracy
against y of the held-out vertices, agreement with exact mode's labels, speed-up (full
k-hop p50 / p50), and max |full k-hop - exact| (asserted <= 1e-4).

Then: CGP, exact mode with ``partitions=4`` (in process, METIS) vs 1 on the same requests:
bytes per request (sent + received, and the pull-rows alternative) and latency; Poisson
arrivals at fractions of exact mode's capacity, served one at a time, latency measured
from each request's intended arrival (no coordinated omission); a mixed run, LinkBench
updates arriving at ``--update-rate`` in ``--update-ms`` micro-batches through
``engine.apply`` while Poisson queries arrive, served FIFO. Writes
``benchmarks/results/queries-<dataset>.json`` and the accuracy / latency vs gamma plots.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib import ticker
from rich.console import Console
from rich.table import Table
from torch_geometric.nn import GCNConv, GraphConv
from torch_geometric.nn.models.basic_gnn import BasicGNN
from tqdm.auto import tqdm

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.models.gnn import GNN
from streamgnn.models.train import train
from streamgnn.models.zoo import MODELS, ModelSpec
from streamgnn.plotstyle import series_style
from streamgnn.queries import MAX_QUERY_VERTICES, POLICIES
from streamgnn.replay import LinkBenchWorkload

try:  # HdrHistogram for percentiles where installed, numpy otherwise
    from hdrh.histogram import HdrHistogram
except ImportError:
    HdrHistogram = None

console = Console(width=170)
ALIASES = {"sage": "sage-mean", "graphconv": "graphconv-mean"}
GAMMAS = [0.0, 0.01, 0.05, 0.2, 1.0]
TOLERANCE = 1e-4  # max |full k-hop - exact| allowed


# ---------------------------------------------------------------- workload
@dataclass
class Workload:
    """The snapshot (75 %) and the held-out vertices with their edges to it."""

    snapshot: sg.GraphData
    held_ids: np.ndarray   # external ids of the held-out vertices
    held_x: np.ndarray
    held_y: np.ndarray
    cross_ptr: np.ndarray  # CSR by held-out index: edges to / from the snapshot
    cross_pos: np.ndarray  # the snapshot end, as a snapshot position
    cross_out: np.ndarray  # True: held-out -> snapshot; False: snapshot -> held-out
    inner_ptr: np.ndarray  # CSR by held-out source index: held-out -> held-out edges
    inner_dst: np.ndarray  # held-out index of the destination


def split(data: sg.GraphData, frac: float, seed: int) -> Workload:
    """Hold out ``frac`` of the vertices (seeded); the snapshot is the graph without them."""
    rng = np.random.default_rng(seed)
    n = data.num_vertices
    held = np.zeros(n, bool)
    held[rng.permutation(n)[:round(frac * n)]] = True
    s, d = data.positions(data.src), data.positions(data.dst)
    keep = ~held[s] & ~held[d]
    snapshot = sg.GraphData(ids=data.ids[~held], src=data.src[keep], dst=data.dst[keep],
                            x=data.x[~held], y=data.y[~held], weight=data.weight[keep],
                            name=f"{data.name}-snapshot")
    pos = np.cumsum(~held) - 1     # snapshot position of a kept vertex
    hidx = np.cumsum(held) - 1     # index among the held-out of a held-out vertex
    cross = held[s] ^ held[d]
    out = held[s[cross]]
    h = np.where(out, hidx[s[cross]], hidx[d[cross]])
    other = np.where(out, pos[d[cross]], pos[s[cross]])
    order = np.argsort(h, kind="stable")
    nh = int(held.sum())
    inner = held[s] & held[d]
    io = np.argsort(hidx[s[inner]], kind="stable")
    return Workload(snapshot, data.ids[held], data.x[held], data.y[held],
                    _ptr(h[order], nh), other[order], out[order],
                    _ptr(hidx[s[inner]][io], nh), hidx[d[inner]][io])


def undirected(data: sg.GraphData) -> sg.GraphData:
    """``data`` with every edge in both directions (unit weights), as OMEGA's datasets."""
    n = data.num_vertices
    s, d = data.positions(data.src), data.positions(data.dst)
    key = np.unique(np.concatenate([s * n + d, d * n + s]))
    s, d = key // n, key % n
    return sg.GraphData(ids=data.ids, src=data.ids[s], dst=data.ids[d], x=data.x, y=data.y,
                        name=f"{data.name}-undirected")


def _ptr(sorted_keys: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.bincount(sorted_keys, minlength=n))])


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, index) of every position of the ranges [starts[i], starts[i] + counts[i])."""
    rows = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts
    return rows, np.repeat(starts, counts) + np.arange(int(counts.sum())) - first[rows]


@dataclass
class Request:
    """One request as arrays: ``held`` (indices of its held-out vertices), its query edges
    in *virtual* positions (snapshot position, or N + i for the request's vertex i)."""

    held: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray

    def columns(self, wl: Workload) -> sg.QueryColumns:
        ids = wl.held_ids[self.held]
        ext = np.concatenate([wl.snapshot.ids, ids])  # virtual position -> external id
        return sg.QueryColumns(ids, wl.held_x[self.held], ext[self.src], ext[self.dst], self.w)

    def pydantic(self, wl: Workload) -> sg.QueryRequest:
        ids = wl.held_ids[self.held]
        ext = np.concatenate([wl.snapshot.ids, ids])  # virtual position -> external id
        x = wl.held_x[self.held].tolist()
        return sg.QueryRequest(
            vertices=[sg.QueryVertex(id=int(i), x=row) for i, row in zip(ids.tolist(), x)],
            edges=[sg.QueryEdge(src=int(a), dst=int(b), weight=float(c)) for a, b, c in
                   zip(ext[self.src].tolist(), ext[self.dst].tolist(), self.w.tolist())])


def make_requests(wl: Workload, size: int, count: int, seed: int,
                  query_to_query: bool) -> list[Request]:
    n0 = wl.snapshot.num_vertices
    rng = np.random.default_rng([seed, size])
    nh = len(wl.held_ids)
    local = np.full(nh, -1, np.int64)
    out = []
    for _ in range(count):
        held = rng.choice(nh, size, replace=False)
        rows, at = _ranges(wl.cross_ptr[held], np.diff(wl.cross_ptr)[held])
        me, other, is_out = n0 + rows, wl.cross_pos[at], wl.cross_out[at]
        src, dst = np.where(is_out, me, other), np.where(is_out, other, me)
        if query_to_query:
            local[held] = np.arange(size)
            rows, at = _ranges(wl.inner_ptr[held], np.diff(wl.inner_ptr)[held])
            mine = local[wl.inner_dst[at]] >= 0
            src = np.concatenate([src, n0 + rows[mine]])
            dst = np.concatenate([dst, n0 + local[wl.inner_dst[at][mine]]])
            local[held] = -1
        out.append(Request(held, src.astype(np.int64), dst.astype(np.int64),
                           np.ones(len(src), np.float32)))
    return out


# ---------------------------------------------------------------- baselines
class Baseline:
    """Full k-hop recompute and neighbor sampling: subgraphs from a numpy CSR of the
    snapshot's in-edges plus the request's edges, PyG's convs on them."""

    def __init__(self, model: torch.nn.Module, wl: Workload, seed: int = 0) -> None:
        snap = wl.snapshot
        self.n0 = n0 = snap.num_vertices
        s, d = snap.positions(snap.src), snap.positions(snap.dst)
        order = np.argsort(d, kind="stable")
        self.indptr = _ptr(d[order], n0)
        self.indices, self.weight = s[order], snap.weight[order].astype(np.float32)
        self.in_weight = np.bincount(d, snap.weight, minlength=n0)
        self.x = torch.from_numpy(snap.x)
        self.wl = wl
        self.scratch = np.full(n0 + MAX_QUERY_VERTICES, -1, np.int64)
        self.rng = np.random.default_rng(seed)
        model.eval()
        self.convs = list(model.convs)
        self.posts = [self._post(model, i) for i in range(len(self.convs) - 1)] + [None]
        # full k-hop: GCN with the true degrees, normalised here (normalize=False copies)
        self.exact_convs = []
        for conv in self.convs:
            if isinstance(conv, GCNConv):
                conv = copy.deepcopy(conv)
                conv.normalize = False
            self.exact_convs.append(conv)

    @staticmethod
    def _post(model: torch.nn.Module, i: int):
        if isinstance(model, GNN):
            return model.act
        if isinstance(model, BasicGNN):
            norm, act = model.norms[i], model.act

            def post(x):
                if act is not None and model.act_first:
                    x = act(x)
                x = norm(x)
                return act(x) if act is not None and not model.act_first else x
            return post
        raise TypeError(f"{type(model).__name__}: no per-layer runner")

    def in_edges(self, req: Request, qorder: np.ndarray, targets: np.ndarray,
                 fanout: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In-edges (src, dst, w; virtual positions) of sorted distinct ``targets`` in G
        plus the request; at most ``fanout`` per target, uniformly without replacement."""
        old = targets < self.n0
        t = np.where(old, targets, 0)
        c_csr = np.where(old, self.indptr[t + 1] - self.indptr[t], 0)
        qdst = req.dst[qorder]
        q0 = np.searchsorted(qdst, targets, "left")
        count = c_csr + np.searchsorted(qdst, targets, "right") - q0
        if fanout is None:
            rows, off = _ranges(np.zeros(len(targets), np.int64), count)
        else:
            small = count <= fanout
            rows, off = _ranges(np.zeros(int(small.sum()), np.int64), count[small])
            rows = np.flatnonzero(small)[rows]
            big = np.flatnonzero(~small)
            if len(big):
                picks = floyd(count[big], fanout, self.rng)
                rows = np.concatenate([rows, np.repeat(big, fanout)])
                off = np.concatenate([off, picks.ravel()])
        from_csr = off < c_csr[rows]
        src = np.empty(len(rows), np.int64)
        w = np.empty(len(rows), np.float32)
        at = self.indptr[t[rows[from_csr]]] + off[from_csr]
        src[from_csr], w[from_csr] = self.indices[at], self.weight[at]
        q = ~from_csr
        at = qorder[q0[rows[q]] + off[q] - c_csr[rows[q]]]
        src[q], w[q] = req.src[at], req.w[at]
        return src, targets[rows], w

    @torch.inference_mode()
    def run(self, req: Request, fanout: int | None = None) -> tuple[np.ndarray, dict]:
        """The request's output rows [B, d_L] in request order, and the subgraph's size."""
        n0, num = self.n0, len(self.convs)
        qorder = np.argsort(req.dst, kind="stable")
        need = [None] * (num + 1)
        need[num] = n0 + np.arange(len(req.held))
        edges = [None] * (num + 1)
        edges[num] = self.in_edges(req, qorder, need[num], fanout)
        for hop in range(num - 1, 0, -1):  # layer hop needs in-edges of need[hop]
            need[hop] = np.union1d(need[hop + 1], edges[hop + 1][0])
            new = self.in_edges(req, qorder, np.setdiff1d(need[hop], need[hop + 1],
                                                          assume_unique=True), fanout)
            edges[hop] = tuple(np.concatenate([a, b]) for a, b in zip(edges[hop + 1], new))
        need[0] = np.union1d(need[1], edges[1][0])
        # local order: need[L] first, then need[L-1] \ need[L], ...: every need a prefix
        parts = [need[num]] + [np.setdiff1d(need[h], need[h + 1], assume_unique=True)
                               for h in range(num - 1, -1, -1)]
        order = np.concatenate(parts)
        scratch = self.scratch
        scratch[order] = np.arange(len(order))
        b = len(req.held)
        x = torch.cat([torch.from_numpy(self.wl.held_x[req.held]),
                       self.x.index_select(0, torch.from_numpy(order[b:]))])
        convs = self.exact_convs if fanout is None else self.convs
        if fanout is None and any(isinstance(c, GCNConv) for c in convs):
            in_w = np.zeros(len(order))
            in_w[b:] = self.in_weight[order[b:]]
            into = scratch[req.dst]
            np.add.at(in_w, into[into >= 0], req.w[into >= 0])
        edge_count = 0
        for hop, (conv, post) in enumerate(zip(convs, self.posts), start=1):
            src, dst, w = edges[hop]
            edge_count += len(src)
            s, d = scratch[src], scratch[dst]
            keep = len(need[hop])
            if isinstance(conv, GCNConv) and fanout is None:  # s_u w s_v, self-loops
                fill = (2.0 if conv.improved else 1.0) if conv.add_self_loops else 0.0
                scale = (fill + in_w) ** -0.5
                loops = np.arange(keep)
                s, d = np.concatenate([s, loops]), np.concatenate([d, loops])
                w = np.concatenate([w * scale[s[:len(w)]] * scale[d[:len(w)]],
                                    fill * scale[loops] ** 2]).astype(np.float32)
            ei = torch.from_numpy(np.stack([s, d]))
            if isinstance(conv, (GCNConv, GraphConv)):
                x = conv(x, ei, torch.from_numpy(w))
            else:
                x = conv(x, ei)
            x = x[:keep]
            if post is not None:
                x = post(x)
        scratch[order] = -1
        return x.numpy(), {"vertices": len(order), "edges": edge_count}


def floyd(count: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """[len(count), k] distinct offsets in [0, count[i]) per row, uniform (Floyd's
    algorithm, vectorised over rows; every count > k)."""
    out = np.empty((len(count), k), np.int64)
    for i in range(k):
        j = count - k + i
        t = (rng.random(len(count)) * (j + 1)).astype(np.int64)
        taken = (out[:, :i] == t[:, None]).any(axis=1)
        out[:, i] = np.where(taken, j, t)
    return out


# ---------------------------------------------------------------- measurement
class Contention:
    """CPU time other processes took while a section ran (from /proc/stat, less this
    process's own): the machine is shared, and a busy neighbor shows up in the p99s."""

    def __init__(self) -> None:
        self.last = self._now()

    @staticmethod
    def _now() -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # not idle, iowait
        mine = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), mine.user + mine.system, time.perf_counter()

    def section(self, name: str) -> dict:
        now, last = self._now(), self.last
        self.last = now
        if now is None or last is None:
            return {"section": name}
        other = max(0.0, (now[0] - last[0]) - (now[1] - last[1]))
        return {"section": name, "seconds": round(now[2] - last[2], 1),
                "other_cpu_s": round(other, 1), "own_cpu_s": round(now[1] - last[1], 1),
                "loadavg_1min": os.getloadavg()[0]}


def frozen(objects: list) -> list:
    """``objects`` (request objects built ahead) moved out of the collector's view, as
    `Service.run` freezes its heap: a server does not hold a block of requests ahead, and
    full collections scanning them would add ~250 ms pauses at 1,024 vertices a request."""
    gc.collect()
    gc.freeze()
    return objects


def percentiles(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    if HdrHistogram is not None:
        hist = HdrHistogram(1, 3_600_000_000, 3)  # microseconds
        for v in ms:
            hist.record_value(max(1, int(v * 1e3)))
        p50, p99 = hist.get_value_at_percentile(50) / 1e3, hist.get_value_at_percentile(99) / 1e3
    else:
        p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_ms": float(ms.mean())}


@dataclass
class Method:
    key: str
    kind: str            # full, ns, exact, srpe
    gamma: float | None = None
    policy: str | None = None
    device: str | None = None  # where engine.query's dense work runs (None: its choice)


class Tally:
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.labels: list[np.ndarray] = []
        self.max_diff = 0.0
        self.extra: list[dict] = []


def methods(fanout: int, gammas: list[float], policies: list[str],
            devices: list[str] | None = None) -> list[Method]:
    """The baselines, then the engine's modes; with ``devices``, exact and SRPE once per
    device (the first device's keys are the plain ones, the others' end in @device)."""
    out = [Method("full k-hop", "full"), Method(f"NS fan-out {fanout}", "ns"),
           Method("exact", "exact", device=devices[0] if devices else None),
           Method("exact (objects)", "objects")]
    for i, device in enumerate(devices or [None]):
        at = f" @{device}" if i else ""
        if i:
            out.append(Method(f"exact{at}", "exact", device=device))
        out += [Method(f"SRPE {p} {g:g}{at}", "srpe", g, p, device)
                for p in policies for g in gammas]
    return out


def serve(method: Method, engine: sg.Engine, base: Baseline, req: Request,
          asked: tuple[sg.QueryColumns, sg.QueryRequest], fanout: int
          ) -> tuple[float, np.ndarray, dict]:
    t = time.perf_counter()
    if method.kind == "full":
        rows, info = base.run(req)
    elif method.kind == "ns":
        rows, info = base.run(req, fanout)
    else:
        kw = {} if method.kind != "srpe" else {"budget": method.gamma, "policy": method.policy}
        res = engine.query(asked[method.kind == "objects"], device=method.device, **kw)
        rows = res.embeddings
        info = {"recomputed": [len(r) for r in res.recomputed], "candidates": res.candidates,
                "work": getattr(res, "work", 0)}
    return time.perf_counter() - t, rows, info


def run_batch(size: int, reqs: list[Request], warm: list[Request], ms: list[Method],
              engine: sg.Engine, base: Baseline, wl: Workload, fanout: int,
              chunk: int) -> list[dict]:
    tallies = {m.key: Tally() for m in ms}
    for req in warm:  # untimed: JIT, caches
        asked = (req.columns(wl), req.pydantic(wl))
        for m in ms:
            serve(m, engine, base, req, asked, fanout)
    bar = tqdm(total=len(reqs) * len(ms), desc=f"batch {size}", leave=False)
    for lo in range(0, len(reqs), chunk):  # blocks of requests per method (warm caches)
        block = reqs[lo:lo + chunk]
        pyds = frozen([(r.columns(wl), r.pydantic(wl)) for r in block])
        exact_rows = [None] * len(block)
        full_rows = [None] * len(block)
        for m in ms:
            tally = tallies[m.key]
            for i, (req, pyd) in enumerate(zip(block, pyds)):
                seconds, rows, info = serve(m, engine, base, req, pyd, fanout)
                tally.seconds.append(seconds)
                tally.labels.append(rows.argmax(axis=1))
                tally.extra.append(info)
                if m.key == "exact":
                    exact_rows[i] = rows
                elif m.kind == "full":
                    full_rows[i] = rows
                bar.update()
        diff = max(float(np.abs(a - b).max()) for a, b in zip(exact_rows, full_rows))
        tallies["exact"].max_diff = max(tallies["exact"].max_diff, diff)
    bar.close()
    y = np.concatenate([wl.held_y[r.held] for r in reqs])
    exact = np.concatenate(tallies["exact"].labels)
    full_p50 = percentiles(tallies["full k-hop"].seconds)["p50_ms"]
    out = []
    for m in ms:
        tally = tallies[m.key]
        labels = np.concatenate(tally.labels)
        row = {"batch": size, "method": m.key, "kind": m.kind, "gamma": m.gamma,
               "policy": m.policy, "requests": len(reqs),
               **percentiles(tally.seconds)}
        row["queries_per_s"] = size * len(reqs) / float(np.sum(tally.seconds))
        row["accuracy"] = float((labels == y).mean())
        row["agreement"] = float((labels == exact).mean())
        row["speedup"] = full_p50 / row["p50_ms"]
        if m.device is not None and " @" in m.key:  # against the same mode on devices[0]
            first = percentiles(tallies[m.key.rsplit(" @", 1)[0]].seconds)["p50_ms"]
            row["vs_first_device"] = first / row["p50_ms"]
        if m.kind in ("full", "ns"):
            row["subgraph_vertices"] = float(np.mean([e["vertices"] for e in tally.extra]))
            row["subgraph_edges"] = float(np.mean([e["edges"] for e in tally.extra]))
        else:
            row["recomputed_per_layer"] = np.mean(
                [e["recomputed"] for e in tally.extra], axis=0).round(1).tolist()
            row["candidates"] = float(np.mean([e["candidates"] for e in tally.extra]))
            row["in_edges_aggregated"] = float(np.mean([e["work"] for e in tally.extra]))
        if m.kind == "exact":
            row["max_abs_vs_full"] = tally.max_diff
        out.append(row)
    return out


def print_batch(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    for col in ("method", "p50 ms", "p99 ms", "queries/s", "accuracy", "agree w/ exact",
                "speed-up vs full (p50)", "computation graph / recomputed"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in rows:
        if "subgraph_vertices" in r:
            work = f"{r['subgraph_vertices']:,.0f} v, {r['subgraph_edges']:,.0f} e"
        else:
            work = (f"{' / '.join(f'{v:,.0f}' for v in r['recomputed_per_layer'])} "
                    f"(cand {r['candidates']:,.0f})")
        speedup = f"{r['speedup']:.1f}x"
        if "vs_first_device" in r:
            speedup += f" ({r['vs_first_device']:.1f}x the first device)"
        table.add_row(r["method"], f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      f"{r['queries_per_s']:,.0f}", f"{r['accuracy']:.4f}",
                      f"{r['agreement']:.4f}", speedup, work)
    console.print(table)


# ---------------------------------------------------------------- CGP, Poisson, mixed
def cgp(model, wl: Workload, holder: list[sg.Engine], reqs: dict[int, list[Request]],
        count: int, parts: int, chunk: int, sequential: bool) -> list[dict]:
    """Exact mode on ``holder[0]`` (P=1) and on a ``parts``-partition engine, the same
    requests, one engine after the other; ``sequential``: the P=1 engine is dropped while
    the other exists and rebuilt after (into ``holder``), for graphs where two do not fit."""
    blocks = {size: all_reqs[:count] for size, all_reqs in reqs.items()}

    def measure(engine: sg.Engine, p: int) -> dict:
        out = {}
        for size, block in blocks.items():
            stats, answers, pyds = [], [], []
            for i in tqdm(range(len(block)), desc=f"CGP P={p} batch {size}", leave=False):
                if i % chunk == 0:
                    pyds = [r.columns(wl) for r in block[i:i + chunk]]
                t = time.perf_counter()
                res = engine.query(pyds[i % chunk])
                stats.append((time.perf_counter() - t,
                              sum(res.sent_bytes) + sum(res.received_bytes),
                              sum(res.pull_bytes)))
                answers.append(res.embeddings)
            out[size] = (np.array(stats), answers)
        return out

    def drop(engines: list) -> None:
        gc.unfreeze()  # frozen objects in cycles are never collected
        engines.clear()
        gc.collect()

    measured = {1: measure(holder[0], 1)}
    if sequential:
        drop(holder)
    other = [sg.Engine.from_pyg(model, wl.snapshot, partitions=parts)]
    measured[parts] = measure(other[0], parts)
    drop(other)
    if sequential:
        holder.append(sg.Engine.from_pyg(model, wl.snapshot))
    rows = []
    for size in blocks:
        diff = max(float(np.abs(a - b).max()) for a, b in
                   zip(measured[1][size][1], measured[parts][size][1]))
        for p in (1, parts):
            st = measured[p][size][0]
            rows.append({"batch": size, "partitions": p, "requests": len(st),
                         **percentiles(st[:, 0].tolist()),
                         "bytes_per_request": float(st[:, 1].mean()),
                         "pull_bytes_per_request": float(st[:, 2].mean()),
                         "max_abs_vs_p1": diff})
    table = Table(title=f"CGP: exact mode, P={parts} (in process, METIS) vs P=1, same requests")
    for col in ("batch", "P", "p50 ms", "p99 ms", "partials: sent+received / request",
                "pull rows instead / request", "pull / partials", "max |P - P1|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), str(r["partitions"]), f"{r['p50_ms']:.2f}",
                      f"{r['p99_ms']:.2f}", _kb(r["bytes_per_request"]),
                      _kb(r["pull_bytes_per_request"]),
                      f"{r['pull_bytes_per_request'] / max(r['bytes_per_request'], 1):.1f}x",
                      f"{r['max_abs_vs_p1']:.1e}")
    console.print(table)
    return rows


def arrivals(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrival times in [0, seconds)."""
    gaps = rng.exponential(1.0 / rate, int(rate * seconds * 1.5) + 10)
    times = np.cumsum(gaps)
    return times[times < seconds]


def _wait_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def poisson(engine: sg.Engine, pool: list[sg.QueryRequest], size: int, rates: list[float],
            seconds: float, seed: int) -> list[dict]:
    rows = []
    for k, rate in enumerate(rates):
        times = arrivals(rate, seconds, np.random.default_rng([seed, k]))
        latency, service = [], []
        start = time.perf_counter() + 0.05
        for i, t in enumerate(tqdm(times, desc=f"Poisson {rate:.1f}/s", leave=False)):
            _wait_until(start + t)
            began = time.perf_counter()
            engine.query(pool[i % len(pool)])
            done = time.perf_counter()
            latency.append(done - (start + t))
            service.append(done - began)
        elapsed = done - start
        rows.append({"batch": size, "offered_rps": rate, "requests": len(times),
                     "achieved_rps": len(times) / elapsed,
                     "achieved_queries_per_s": len(times) * size / elapsed,
                     **percentiles(latency),
                     "service_p50_ms": percentiles(service)["p50_ms"]})
    table = Table(title=f"Poisson arrivals, exact mode, {size} vertices a request, served one "
                        f"at a time, {seconds:g} s each; latency from intended arrival")
    for col in ("offered req/s", "achieved req/s", "achieved queries/s", "p50 ms", "p99 ms",
                "service p50 ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['offered_rps']:.1f}", f"{r['achieved_rps']:.1f}",
                      f"{r['achieved_queries_per_s']:,.0f}", f"{r['p50_ms']:.2f}",
                      f"{r['p99_ms']:.2f}", f"{r['service_p50_ms']:.2f}")
    console.print(table)
    return rows


def mixed(engine: sg.Engine, wl: Workload, pool: list[Request], size: int, qrate: float,
          update_rate: float, update_ms: float, seconds: float, seed: int) -> dict:
    """Updates arriving at ``update_rate`` in micro-batches every ``update_ms`` and Poisson
    queries at ``qrate``, served FIFO by arrival time, one at a time."""
    snap = wl.snapshot
    per = max(1, round(update_rate * update_ms / 1000))
    nb = int(seconds * 1000 / update_ms)
    graph = sg.DynamicGraph.from_data(snap)
    gen = LinkBenchWorkload(graph, seed=seed, unit_weights=True)
    gen.next_id = int(max(snap.ids.max(), wl.held_ids.max())) + 1  # never a held-out id
    batches, warm = [], 5
    for _ in tqdm(range(nb + warm), desc="LinkBench batches", leave=False):
        batch = sg.UpdateBatch.from_updates(gen.batch(per), snap.num_features)
        graph.apply(batch)
        batches.append(batch)
    del graph, gen
    for batch in batches[:warm]:  # untimed: the update path's JIT
        engine.apply(batch)
    batches = batches[warm:]
    n0 = snap.num_vertices
    queries = [(r, r.columns(wl)) for r in pool]
    q_times = arrivals(qrate, seconds, np.random.default_rng([seed, 99]))
    u_times = np.arange(nb) * update_ms / 1000
    events = sorted([(t, 0, i) for i, t in enumerate(u_times)]
                    + [(t, 1, i) for i, t in enumerate(q_times)])
    q_lat, u_lat, q_service, u_service, applied, dropped_edges = [], [], [], [], 0, 0
    frozen(batches)
    start = time.perf_counter() + 0.05
    last_update = start
    for t, kind, i in tqdm(events, desc="mixed", leave=False):
        _wait_until(start + t)
        began = time.perf_counter()
        if kind == 0:
            engine.apply(batches[i])
            last_update = time.perf_counter()
            applied += len(batches[i])
            u_lat.append(last_update - (start + t))
            u_service.append(last_update - began)
            continue
        req, pyd = queries[i % len(queries)]
        other = np.where(req.src >= n0, req.dst, req.src)  # the existing end (or a query)
        gone = (other < n0) & ~engine.contains(snap.ids[np.minimum(other, n0 - 1)])
        if gone.any():  # LinkBench deleted some of the request's neighbors since
            keep = ~gone
            pyd = sg.QueryColumns(pyd.ids, pyd.x, pyd.src[keep], pyd.dst[keep],
                                  pyd.weight[keep])
            dropped_edges += int(gone.sum())
        engine.query(pyd)
        done = time.perf_counter()
        q_lat.append(done - (start + t))
        q_service.append(done - began)
    row = {"batch": size, "query_rps": qrate, "queries": len(q_lat),
           "offered_updates_per_s": per * 1000 / update_ms, "update_batch": per,
           "achieved_updates_per_s": applied / (last_update - start),
           "query": percentiles(q_lat), "update_batch_latency": percentiles(u_lat),
           "query_service": percentiles(q_service), "update_service": percentiles(u_service),
           "busy_fraction": (sum(q_service) + sum(u_service)) / (time.perf_counter() - start),
           "query_edges_to_deleted_vertices_dropped": dropped_edges}
    table = Table(title=f"Mixed: LinkBench updates at {row['offered_updates_per_s']:,.0f}/s "
                        f"(batches of {per} every {update_ms:g} ms) + Poisson queries "
                        f"({size} vertices, {qrate:.1f}/s), FIFO, {seconds:g} s")
    for col in ("achieved updates/s", "update batch p50/p99 ms (apply p50)", "queries",
                "query p50 ms", "query p99 ms", "query service p50 ms", "server busy"):
        table.add_column(col, justify="right")
    table.add_row(f"{row['achieved_updates_per_s']:,.0f}",
                  f"{row['update_batch_latency']['p50_ms']:.2f} / "
                  f"{row['update_batch_latency']['p99_ms']:.2f} "
                  f"({row['update_service']['p50_ms']:.2f})", str(len(q_lat)),
                  f"{row['query']['p50_ms']:.2f}", f"{row['query']['p99_ms']:.2f}",
                  f"{row['query_service']['p50_ms']:.2f}", f"{row['busy_fraction']:.0%}")
    console.print(table)
    return row


def revision() -> dict:
    """The commit measured, and whether streamgnn/ had changes not in it."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"
    return {"commit": git("rev-parse", "HEAD"),
            "streamgnn_dirty": bool(git("status", "--porcelain", "streamgnn"))}


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f} KB"


# ---------------------------------------------------------------- goals, plots
def goals(rows: list[dict], big: int, policies: list[str]) -> dict:
    out: dict = {"srpe": {}, "exact": {}}
    at = [r for r in rows if r["batch"] == big]
    if at:
        exact = next(r for r in at if r["kind"] == "exact")
        for p in policies:
            ok = sorted((r for r in at if r["policy"] == p
                         and r["accuracy"] >= exact["accuracy"] - 0.01),
                        key=lambda r: r["gamma"])
            if ok:
                r = ok[0]
                out["srpe"][p] = {"gamma": r["gamma"], "accuracy": r["accuracy"],
                                  "speedup": r["speedup"], "met": r["speedup"] >= 10}
            else:
                out["srpe"][p] = {"gamma": None, "met": False}
    for size in sorted({r["batch"] for r in rows}):
        exact = next(r for r in rows if r["batch"] == size and r["kind"] == "exact")
        full = next(r for r in rows if r["batch"] == size and r["kind"] == "full")
        out["exact"][size] = {"speedup": exact["speedup"],
                              "max_abs_vs_full": exact["max_abs_vs_full"],
                              "labels_identical": full["agreement"] == 1.0,
                              "met": exact["speedup"] >= 3 and full["agreement"] == 1.0
                              and exact["max_abs_vs_full"] <= TOLERANCE}
    return out


def print_goals(g: dict, big: int) -> None:
    for p, r in g["srpe"].items():
        if r["gamma"] is None:
            console.print(f"SRPE {p}: no gamma within 1 point of exact at batch {big}: NOT MET")
        else:
            console.print(f"SRPE {p}: smallest gamma within 1 point of exact at batch {big} is "
                          f"{r['gamma']:g} (accuracy {r['accuracy']:.4f}), {r['speedup']:.1f}x "
                          f"faster than full k-hop (goal 10x): "
                          f"{'MET' if r['met'] else 'NOT MET'}")
    for size, r in g["exact"].items():
        console.print(f"exact, batch {size}: {r['speedup']:.1f}x faster than full k-hop (goal "
                      f"3x), max |full - exact| {r['max_abs_vs_full']:.1e}, labels "
                      f"{'identical' if r['labels_identical'] else 'DIFFER'}: "
                      f"{'MET' if r['met'] else 'NOT MET'}")


def plot(rows: list[dict], gammas: list[float], policies: list[str], out: Path,
         title: str) -> list[Path]:
    sizes = sorted({r["batch"] for r in rows})
    written = []
    for metric, label, name in (("accuracy", "accuracy (held-out y)", "accuracy"),
                                ("p50_ms", "p50 latency, ms per request", "latency")):
        fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
        for ax, size in zip(axes[0], sizes):
            at = [r for r in rows if r["batch"] == size]
            xs = np.arange(len(gammas))
            for i, p in enumerate(policies):
                ys = [next(r[metric] for r in at if r["policy"] == p and r["gamma"] == g)
                      for g in gammas]
                ax.plot(xs, ys, label=f"SRPE {p}", **series_style(i) | {"markevery": None})
            for kind, style in (("exact", "k-"), ("full", "r--"), ("ns", "g:")):
                if metric == "accuracy" and kind == "full":
                    continue  # identical to exact
                r = next(r for r in at if r["kind"] == kind)
                ax.axhline(r[metric], color=style[0], linestyle=style[1:], label=r["method"])
            if metric == "accuracy":  # the goal's band: within 1 point of exact mode
                exact = next(r[metric] for r in at if r["kind"] == "exact")
                ax.axhspan(exact - 0.01, exact, color="k", alpha=0.06,
                           label="within 1 point of exact")
                lo, hi = ax.get_ylim()
                ax.set_ylim(min(lo, exact - 0.015), max(hi, exact + 0.005))
            ax.set_xticks(xs, [f"{g:g}" for g in gammas])
            ax.set_xlabel("recomputation budget gamma")
            ax.set_ylabel(label)
            if metric == "p50_ms":
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
            ax.set_title(f"batch {size}")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        path = out / f"queries-{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", default="arxiv-like", choices=sorted(sg.datasets.PRESETS),
                        help="synthetic preset (streamgnn.datasets.PRESETS)")
    parser.add_argument("--model", default="sage",
                        help="architecture: gcn, sage (= sage-mean), gat, graphconv "
                             f"(= graphconv-mean) or any of {', '.join(MODELS)}")
    parser.add_argument("--hidden", type=int, default=128, help="hidden width")
    parser.add_argument("--layers", type=int, default=2, help="GNN layers")
    parser.add_argument("--epochs", type=int, default=30,
                        help="full-batch training epochs (best validation kept)")
    parser.add_argument("--holdout", type=float, default=0.25,
                        help="fraction of vertices held out as queries")
    parser.add_argument("--seed", type=int, default=0, help="split, request and sampler seed")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 1024],
                        help="query vertices per request")
    parser.add_argument("--requests", type=int, default=500,
                        help="requests per batch size (reused by every method)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed requests per batch size and method first")
    parser.add_argument("--chunk", type=int, default=20,
                        help="requests each method serves in a row before the next method")
    parser.add_argument("--gammas", type=float, nargs="+", default=GAMMAS,
                        help="SRPE recomputation budgets")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES,
                        help="SRPE candidate policies")
    parser.add_argument("--fanout", type=int, default=10,
                        help="neighbor sampling: in-edges sampled per vertex and layer")
    parser.add_argument("--undirected", action="store_true",
                        help="add every edge's reverse before the split (OMEGA's datasets "
                             "are undirected: every neighbor of a query is then an SRPE "
                             "candidate)")
    parser.add_argument("--query-to-query", action="store_true",
                        help="keep held-out -> held-out edges whose ends are in the same "
                             "request (default: dropped, as OMEGA)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="CGP: partitions compared with 1 (0: skip)")
    parser.add_argument("--cgp-requests", type=int, default=100,
                        help="CGP: requests per batch size (the first of the main ones)")
    parser.add_argument("--poisson-batch", type=int, default=64,
                        help="Poisson and mixed runs: vertices per request")
    parser.add_argument("--rates", type=float, nargs="+", default=None,
                        help="Poisson arrival rates, requests/s (default: 0.5, 0.8 and 1.1 x "
                             "exact mode's measured capacity at --poisson-batch)")
    parser.add_argument("--poisson-seconds", type=float, default=10.0,
                        help="length of each Poisson run")
    parser.add_argument("--update-rate", type=float, default=10_000,
                        help="mixed run: LinkBench updates per second (0: skip the run)")
    parser.add_argument("--update-ms", type=float, default=10.0,
                        help="mixed run: updates are applied in micro-batches this often")
    parser.add_argument("--mixed-rate", type=float, default=None,
                        help="mixed run: query requests/s (default: the first Poisson rate)")
    parser.add_argument("--mixed-seconds", type=float, default=10.0, help="mixed run length")
    parser.add_argument("--cgp-sequential", action="store_true",
                        help="CGP: drop the P=1 engine while the partitioned one exists "
                             "(products-like: two engines do not fit in 24 GiB)")
    parser.add_argument("--parts", nargs="+", default=["main", "cgp", "poisson", "mixed"],
                        choices=["main", "cgp", "poisson", "mixed"],
                        help="what to run: the methods table, CGP, Poisson, mixed")
    parser.add_argument("--devices", nargs="+", default=None,
                        help="answer exact and SRPE queries on each of these devices (e.g. "
                             "cpu cuda), compared with the first as a ratio (vs_first_device);"
                             " default: the device the engine's calibration picks")
    parser.add_argument("--merge", action="store_true",
                        help="start from the results file (--json) of an earlier run with "
                             "the same settings: the batch sizes and parts run now replace "
                             "theirs, the rest is kept")
    parser.add_argument("--quick", action="store_true",
                        help="40 requests per batch size, 20 for CGP, 3 s Poisson and mixed")
    parser.add_argument("--out", type=Path, default=Path("docs"),
                        help="folder for queries-accuracy.png and queries-latency.png")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default benchmarks/results/queries-<dataset>"
                             "[-undirected].json)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--plot-only", action="store_true",
                        help="only redraw the plots from the results file (--json)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.cgp_requests = min(args.requests, 40), min(args.cgp_requests, 20)
        args.poisson_seconds, args.mixed_seconds = 3.0, 3.0
    suffix = ("-undirected" if args.undirected else "") + (
        f"-{args.layers}l" if args.layers != 2 else "")
    args.json = args.json or Path(f"benchmarks/results/queries-{args.dataset}{suffix}.json")
    if args.plot_only:
        matplotlib.use("Agg")
        res = json.loads(args.json.read_text())
        gammas = sorted({r["gamma"] for r in res["rows"] if r["kind"] == "srpe"})
        policies = [p for p in POLICIES if any(r["policy"] == p for r in res["rows"])]
        for path in plot(res["rows"], gammas, policies, args.out,
                         f"{res['dataset']}{' (undirected)' if res.get('undirected') else ''}, "
                         f"{res['model']}: SRPE vs gamma ({res.get('requests', '?')} requests "
                         "per batch size)"):
            console.print(f"-> {path}")
        return
    name = ALIASES.get(args.model, args.model)
    if name not in MODELS:
        parser.error(f"--model {args.model}: choose gcn, sage, gat, graphconv or one of {MODELS}")
    matplotlib.use("Agg")
    torch.set_num_threads(args.threads)
    keep_freed_memory()

    t0 = time.perf_counter()
    contention = Contention()
    data = sg.datasets.synthetic(args.dataset, seed=0)
    data.weight[:] = 1.0
    if args.undirected:
        data = undirected(data)
    wl = split(data, args.holdout, args.seed)
    del data
    snap = wl.snapshot
    inner = "kept within a request" if args.query_to_query else "dropped"
    console.print(f"{args.dataset}: snapshot {snap.num_vertices:,} vertices, "
                  f"{snap.num_edges:,} edges; {len(wl.held_ids):,} held out with "
                  f"{len(wl.cross_pos):,} edges to the snapshot ({len(wl.inner_dst):,} "
                  f"held-out -> held-out, {inner}) "
                  f"[{time.perf_counter() - t0:.0f} s]")
    spec = ModelSpec(name, snap.num_features, snap.num_classes, hidden=args.hidden,
                     num_layers=args.layers)
    trained = train(snap, spec, epochs=args.epochs, seed=args.seed)
    model = trained.model_file.model()
    console.print(f"trained {name} ({args.epochs} epochs, {trained.seconds:.0f} s): snapshot "
                  f"test accuracy {trained.gnn.test:.4f} (MLP {trained.mlp.test:.4f})")
    engine = sg.Engine.from_pyg(model, snap)
    base = Baseline(model, wl, args.seed) if "main" in args.parts else None
    console.print(f"engine ready [{time.perf_counter() - t0:.0f} s]")

    ms = methods(args.fanout, args.gammas, args.policies, args.devices)
    requests = {size: make_requests(wl, size, args.requests + args.warmup, args.seed,
                                    args.query_to_query) for size in args.batch_sizes}
    frozen([])
    results: dict = {"dataset": args.dataset, "undirected": args.undirected,
                     "model": name, "hidden": args.hidden, "layers": args.layers,
                     "requests": args.requests,
                     "epochs": args.epochs, "holdout": args.holdout,
                     "query_to_query": args.query_to_query, "fanout": args.fanout,
                     "training": {"gnn_test": trained.gnn.test, "mlp_test": trained.mlp.test,
                                  "seconds": trained.seconds},
                     "percentiles": "hdrhistogram" if HdrHistogram else "numpy",
                     "code": revision(),
                     "rows": []}
    failures = []
    results["contention"] = [contention.section("setup")]
    if args.merge and args.json.exists():
        old = json.loads(args.json.read_text())
        same = ("dataset", "undirected", "model", "hidden", "layers", "epochs", "holdout",
                "query_to_query", "fanout")
        if any(old.get(k) != results[k] for k in same):
            parser.error(f"--merge: {args.json} was run with other settings")
        rerun = set(args.batch_sizes) if "main" in args.parts else set()
        results["rows"] = [r for r in old["rows"] if r["batch"] not in rerun]
        for key in ("cgp", "poisson", "mixed"):
            if key in old and key not in args.parts:
                results[key] = old[key]
        results["earlier"] = {"code": old.get("code"), "contention": old.get("contention"),
                              "requests": old.get("requests")}

    def save() -> None:
        results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))

    for size in args.batch_sizes if "main" in args.parts else []:
        reqs = requests[size]
        rows = run_batch(size, reqs[args.warmup:], reqs[:args.warmup], ms, engine, base, wl,
                         args.fanout, args.chunk)
        results["rows"] += rows
        diff = next(r for r in rows if r["kind"] == "exact")["max_abs_vs_full"]
        print_batch(rows, f"{args.dataset}, {name}, batch {size}: {len(reqs) - args.warmup} "
                          f"requests; max |full k-hop - exact| = {diff:.2e}")
        results["contention"].append(contention.section(f"batch {size}"))
        if diff > TOLERANCE:
            failures.append(f"batch {size}: max |full k-hop - exact| {diff:.2e} > {TOLERANCE}")
        save()
    results["rows"].sort(key=lambda r: r["batch"])
    big = max([r["batch"] for r in results["rows"]], default=0)
    results["goals"] = goals(results["rows"], big, args.policies)
    print_goals(results["goals"], big)
    results["plots"] = [] if not results["rows"] else [str(p) for p in plot(
        results["rows"], args.gammas, args.policies, args.out,
        f"{args.dataset}{' (undirected)' if args.undirected else ''}, {name}: SRPE vs gamma "
        f"({args.requests} requests per batch size)")]
    save()

    main_reqs = {s: requests[s][args.warmup:] for s in args.batch_sizes}
    if "cgp" in args.parts and args.partitions > 1:
        holder = [engine]
        del engine
        results["cgp"] = cgp(model, wl, holder, main_reqs, args.cgp_requests, args.partitions,
                             args.chunk, args.cgp_sequential)
        engine = holder[0]
        results["contention"].append(contention.section("cgp"))
        save()
    if "poisson" not in args.parts and "mixed" not in args.parts:
        args.update_rate = 0
    size = args.poisson_batch
    pool_reqs = (main_reqs[size] if size in main_reqs else
                 make_requests(wl, size, 100, args.seed + 1, args.query_to_query))[:100]
    exact_ms = next((r["mean_ms"] for r in results["rows"]
                     if r["batch"] == size and r["kind"] == "exact"), None)
    pool = [r.columns(wl) for r in pool_reqs]
    if exact_ms is None:
        seconds = [time.perf_counter()]
        for p in pool[:20]:
            engine.query(p)
            seconds.append(time.perf_counter())
        exact_ms = float(np.diff(seconds).mean() * 1e3)
    capacity = 1000 / exact_ms
    rates = args.rates or [round(f * capacity, 1) for f in (0.5, 0.8, 1.1)]
    if "poisson" in args.parts:
        results["poisson"] = poisson(engine, pool, size, rates, args.poisson_seconds,
                                     args.seed)
        results["contention"].append(contention.section("poisson"))
        save()
    if args.update_rate > 0 and "mixed" in args.parts:
        results["mixed"] = mixed(engine, wl, pool_reqs, size, args.mixed_rate or rates[0],
                                 args.update_rate, args.update_ms, args.mixed_seconds,
                                 args.seed)
        results["contention"].append(contention.section("mixed"))
    save()
    table = Table(title="Other processes' CPU time per section (2 cores shared)")
    for col in ("section", "wall s", "own CPU s", "other processes' CPU s",
                "load avg (1 min) at the end"):
        table.add_column(col, justify="right")
    for c in results["contention"]:
        table.add_row(c["section"], *(str(c.get(k, "?")) for k in
                                      ("seconds", "own_cpu_s", "other_cpu_s")),
                      f"{c.get('loadavg_1min', float('nan')):.2f}")
    console.print(table)
    console.print(f"peak RSS {results['peak_rss_mb']:,.0f} MB, {time.perf_counter() - t0:.0f} s"
                  f" -> {args.json}, {', '.join(results['plots'])}")
    assert not failures, "; ".join(failures)


if __name__ == "__main__":
    main()
