"""`generate_trace`: a LinkBench-style trace for a dataset, as `streamgnn replay generate`
writes it.

Writes follow `LinkBenchWorkload` (LinkBench's write mix; under the RIPPLE++ protocol the
held-out part of the dataset streams in as the adds), generated against the snapshot
`streamgnn serve` starts from (same dataset, holdout and seed) and kept valid in order.
Reads follow LinkBench's read mix (``FBWorkload``: getlinklist 50.71, getnode 12.93,
countlink 4.89) on live vertices, skewed like link writes. Queries are one new vertex
(features near an existing vertex's) with 1-4 edges to existing vertices, either
direction. Intended times are constant (``i / rate``) or Poisson (exponential gaps with
mean ``1 / rate``).

Owns trace generation; may import the graph store, not kafka or mpi4py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from streamgnn.datasets import open_dataset, split_stream
from streamgnn.graph import DynamicGraph
from streamgnn.replay.linkbench import LINK_SKEW, LinkBenchWorkload
from streamgnn.replay.trace import QUERY_OP, WRITE_OPS, TraceOp, TraceWriter
from streamgnn.updates import DeleteVertex, Update

READ_MIX = {"getlinklist": 50.71, "getnode": 12.93, "countlink": 4.89}
QUERY_ID_BASE = 1 << 50  # query vertices' ids: far above any id the writes add
QUERY_MAX_EDGES = 4
_CHUNK = 1000
_LINKBENCH_NAME = {update_op: name for name, update_op in WRITE_OPS.items()}


def generate_trace(out: Path, dataset: str, ops: int, read_fraction: float = 0.0,
                   query_fraction: float = 0.0, arrivals: str = "constant",
                   rate: float = 1000.0, holdout: float = 0.2, seed: int = 0,
                   progress: bool = False) -> dict[str, Any]:
    """Write a trace of ``ops`` ops to ``out`` (``arrivals``: constant or poisson);
    returns the counts by op."""
    if min(read_fraction, query_fraction) < 0 or read_fraction + query_fraction > 1:
        raise ValueError("read and query fractions must be >= 0 and add up to at most 1, "
                         f"got {read_fraction} and {query_fraction}")
    if rate <= 0 or ops <= 0:
        raise ValueError(f"rate and ops must be positive, got {rate} and {ops}")
    if arrivals not in ("constant", "poisson"):
        raise ValueError(f"arrivals must be constant or poisson, got {arrivals!r}")
    from streamgnn.progress import Progress

    full = open_dataset(dataset, seed)
    snapshot, events = split_stream(full, holdout, seed) if holdout > 0 else (full, [])
    graph = DynamicGraph.from_data(snapshot)
    rng = np.random.default_rng(seed + 1)
    workload = LinkBenchWorkload(graph, seed=seed + 2, arrivals=events)
    header = {"dataset": dataset, "holdout": holdout, "seed": seed, "ops": ops,
              "read_fraction": read_fraction, "query_fraction": query_fraction,
              "arrivals": arrivals, "rate": rate, "generated_at": time.time()}
    counts: dict[str, int] = {}
    clock = _Clock(arrivals, rate, rng)
    with open(out, "wb") as f, Progress("generating", "op", ops, enabled=progress) as bar:
        writer = TraceWriter(f, header)
        done = 0
        while done < ops:
            chunk = _chunk(graph, workload, rng, min(_CHUNK, ops - done), read_fraction,
                           query_fraction, done)
            for op, body in chunk:
                writer.write(TraceOp(clock.next(), op, body))
                counts[op] = counts.get(op, 0) + 1
            done += len(chunk)
            bar.update(len(chunk))
    return counts


class _Clock:
    """Intended send times: constant spacing or Poisson arrivals at ``rate``."""

    def __init__(self, arrivals: str, rate: float, rng: np.random.Generator) -> None:
        self.arrivals, self.rate, self.rng = arrivals, rate, rng
        self.i, self.t = 0, 0.0

    def next(self) -> float:
        if self.arrivals == "constant":
            t = self.i / self.rate
        else:
            t, self.t = self.t, self.t + float(self.rng.exponential(1.0 / self.rate))
        self.i += 1
        return t


def _chunk(graph: DynamicGraph, workload: LinkBenchWorkload, rng: np.random.Generator,
           size: int, read_fraction: float, query_fraction: float, first: int
           ) -> list[tuple[str, Any]]:
    """``size`` ops (op name, body) in send order; the writes among them are applied to
    ``graph`` so the next chunk's ops are valid after them. Reads and queries name
    vertices live before the chunk that its writes do not delete."""
    kinds = rng.choice(3, size=size, p=[1 - read_fraction - query_fraction, read_fraction,
                                        query_fraction])
    writes: list[Update] = workload.batch(int((kinds == 0).sum()))
    ids = graph.vertex_ids()
    deleted = [u.id for u in writes if isinstance(u, DeleteVertex)]
    stable = ids[~np.isin(ids, deleted)]
    popularity = rng.permutation(len(stable))
    read_ops = list(READ_MIX)
    read_p = np.array(list(READ_MIX.values())) / sum(READ_MIX.values())
    out: list[tuple[str, Any]] = []
    next_write = iter(writes)
    for k, kind in enumerate(kinds.tolist()):
        if kind == 0:
            u = next(next_write, None)
            if u is not None:
                out.append((_LINKBENCH_NAME[u.op], u.model_dump(exclude_none=True)))
        elif kind == 1:
            op = read_ops[rng.choice(len(read_ops), p=read_p)]
            out.append((op, _pick(stable, popularity, rng)))
        else:
            out.append((QUERY_OP, _query(graph, stable, popularity, rng, first + k)))
    graph.apply(writes)
    return out


def _pick(ids: np.ndarray, popularity: np.ndarray, rng: np.random.Generator,
          skew: float = LINK_SKEW) -> int:
    """An id by Zipf-like popularity (the shape `LinkBenchWorkload` uses)."""
    k = int(len(ids) * rng.random() ** (1.0 / (1.0 - skew)))
    return int(ids[popularity[min(k, len(ids) - 1)]])


def _query(graph: DynamicGraph, ids: np.ndarray, popularity: np.ndarray,
           rng: np.random.Generator, k: int) -> dict[str, Any]:
    v = QUERY_ID_BASE + k
    like = graph.x[graph.slots([_pick(ids, popularity, rng)])[0]]
    x = (like + 0.1 * rng.standard_normal(len(like))).astype(np.float32)
    targets = {_pick(ids, popularity, rng) for _ in range(rng.integers(1, QUERY_MAX_EDGES + 1))}
    edges = [{"src": v, "dst": t} if rng.random() < 0.5 else {"src": t, "dst": v}
             for t in sorted(targets)]
    return {"vertices": [{"id": v, "x": x.tolist()}], "edges": edges}
