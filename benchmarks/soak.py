"""Soak: memory of a long-running service. Pushes N updates (default 1M) through `Service`
with the in-memory transport on a small preset and prints, at intervals, the process RSS,
Python's traced heap (tracemalloc) and the service's latency figures, as a table.

    python benchmarks/soak.py [--updates 1000000] [--preset small] [--every 100000]

The workload keeps the graph's size steady, so what grows is the service's own memory:
feature updates (40 %), weight updates of existing edges (30 %), and new edges (15 %)
deleted again in the next chunk (15 %), 100 updates per message, stamped with their
event time. A producer thread keeps at most ``--backlog`` updates queued; consumed
records and published outputs are dropped from the in-memory broker as the service goes
(Kafka's log is not the service's memory), leaving its list of offsets: 8 bytes a record.
"""

from __future__ import annotations

import argparse
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import torch
from rich.console import Console
from rich.table import Table

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.router import Service, ServiceConfig
from streamgnn.stream.memory import MemoryBroker, MemoryTransport

console = Console(width=140)


def chunks(data: sg.GraphData, size: int, seed: int):
    """Endless chunks of ``size`` update dicts that leave the graph as large as it was."""
    rng = np.random.default_rng(seed)
    ids = data.ids
    src, dst = data.src, data.dst
    added: list[tuple[int, int]] = []
    n_feat, n_weight, n_add = int(0.4 * size), int(0.3 * size), int(0.15 * size)
    existing = set(zip(src.tolist(), dst.tolist(), strict=True))
    while True:
        out: list[dict] = []
        for v in rng.choice(ids, n_feat).tolist():
            out.append({"op": "update_features", "id": v,
                        "x": rng.standard_normal(data.num_features).round(3).tolist()})
        for e in rng.integers(0, len(src), n_weight).tolist():
            out.append({"op": "update_edge", "src": int(src[e]), "dst": int(dst[e]),
                        "weight": round(float(rng.uniform(0.5, 1.5)), 3)})
        for u, v in added:
            out.append({"op": "delete_edge", "src": u, "dst": v})
        added = []
        while len(added) < n_add:
            u, v = (int(i) for i in rng.choice(ids, 2))
            if u != v and (u, v) not in existing and (u, v) not in added:
                added.append((u, v))
        out += [{"op": "add_edge", "src": u, "dst": v} for u, v in added]
        yield out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=1_000_000)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--every", type=int, default=100_000, help="a table row every N updates")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--no-tracemalloc", action="store_true",
                    help="RSS only (tracemalloc slows Python's allocations down)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()

    data = sg.datasets.synthetic(args.preset, seed=0)
    spec = ModelSpec("sage-mean", data.num_features, data.num_classes, 64, 2)
    torch.manual_seed(0)
    model = ModelFile(spec, spec.build().state_dict())
    broker, config = MemoryBroker(), ServiceConfig(batch_size=args.batch_size)
    topic = config.topics.updates
    service = Service(sg.Engine.from_pyg(model.model(), data), model,
                      MemoryTransport(broker, topic), config)
    done = threading.Event()

    def produce() -> None:
        made = 0
        source = chunks(data, 1000, seed=1)
        while made < args.updates and not done.is_set():
            if made - service.stats.events > args.backlog:
                time.sleep(0.005)
                continue
            updates = next(source)[:args.updates - made]
            now = time.time()
            for i in range(0, len(updates), 100):
                part = updates[i:i + 100]
                for u in part:
                    u["event_time"] = now
                broker.produce(topic, orjson.dumps(part))
            made += len(updates)

    def drop_consumed() -> None:
        """Forget what the service consumed and published (as Kafka's retention would)."""
        with broker.lock:
            log = broker.topics[topic][0]
            for i in range(service.transport.positions()[0] - 1, -1, -1):
                if log[i] is None:
                    break
                log[i] = None
            for name, parts in broker.topics.items():
                if name != topic:
                    for p in parts:
                        p.clear()

    table = Table(title=f"soak: {args.updates:,} updates, {args.preset}, batches of "
                        f"{args.batch_size}")
    for col in ("updates", "seconds", "updates/s", "RSS MB", "traced MB", "traced peak MB",
                "batches", "latency p50 ms", "latency p99 ms", "batch p99 ms"):
        table.add_column(col, justify="right")
    rows: list[tuple] = []
    next_row = [args.every]
    start = time.perf_counter()

    def on_batch(_) -> None:
        s = service.stats
        if s.events < next_row[0]:
            return
        drop_consumed()
        traced = tracemalloc.get_traced_memory() if tracemalloc.is_tracing() else (0, 0)
        rows.append((f"{s.events:,}", f"{time.perf_counter() - start:.0f}",
                     f"{s.events / (time.perf_counter() - start):,.0f}", f"{rss_mb():.0f}",
                     f"{traced[0] / 2**20:.1f}", f"{traced[1] / 2**20:.1f}",
                     f"{s.batches:,}", f"{s.latency.percentile(50):.0f}",
                     f"{s.latency.percentile(99):.0f}", f"{s.batch_time.percentile(99):.1f}"))
        console.print("  ".join(rows[-1]))
        next_row[0] += args.every

    if not args.no_tracemalloc:
        tracemalloc.start()
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    console.print(f"bootstrapped {data.num_vertices:,} vertices; RSS {rss_mb():.0f} MB; "
                  "producing ...")
    service.run(stop=lambda: service.stats.events >= args.updates, on_batch=on_batch)
    done.set()
    for row in rows:
        table.add_row(*row)
    console.print(table)
    s = service.stats
    console.print(f"applied {s.applied:,}, dead letters {dict(s.dead_letters)}, "
                  f"label changes {s.label_changes:,}")


if __name__ == "__main__":
    main()
