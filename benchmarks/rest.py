"""REST benchmark: read latency while ingesting, and ingest throughput while reading.

    python benchmarks/rest.py [--preset small] [--rate 2000] [--seconds 20]

One process serves (`Service` on the in-memory transport, the REST API on a uvicorn
thread, reads answered by the loop between two batches, as `streamgnn serve --http`
runs); a client process reads over HTTP, one request at a time (closed loop, httpx):
single vertices (``GET /v1/vertices/{id}``) or 1,000-id lookups. Ingest is the soak
benchmark's steady-size workload (100 updates per message, event time stamped).

Rows: reads alone; reads while ingesting at ``--rate`` updates/s (paced); ingest of a
backlog for ``--seconds`` with no reads, and with a steady single-vertex read load.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import torch
from rich.console import Console
from rich.table import Table
from soak import chunks

import streamgnn as sg
from streamgnn.allocator import keep_freed_memory
from streamgnn.api.server import HttpServer
from streamgnn.models.zoo import Checkpoint, ModelSpec
from streamgnn.router import Service, ServiceConfig
from streamgnn.router.reads import Reads
from streamgnn.stream.memory import MemoryBroker, MemoryTransport

console = Console(width=140)


def client(url: str, kind: str, seconds: float, ids_file: str) -> None:
    """Read for ``seconds``, one request at a time; print latencies' percentiles (JSON)."""
    ids = np.load(ids_file)
    rng = np.random.default_rng(0)
    latencies, batches = [], set()
    no_delay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(base_url=url, timeout=60, transport=no_delay) as http:
        end = time.perf_counter() + seconds
        while (t := time.perf_counter()) < end:
            if kind == "vertex":
                got = http.get(f"/v1/vertices/{int(rng.choice(ids))}")
            else:
                got = http.post("/v1/vertices/lookup",
                                json={"ids": rng.choice(ids, 1000).tolist()})
            got.raise_for_status()
            latencies.append(time.perf_counter() - t)
            batches.add(got.json()["batch"])
    ms = np.array(latencies) * 1000
    print(json.dumps({"reads": len(ms), "reads_per_s": len(ms) / seconds,
                      "p50_ms": float(np.percentile(ms, 50)),
                      "p99_ms": float(np.percentile(ms, 99)),
                      "max_ms": float(ms.max()), "batches_seen": len(batches)}))


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        data = sg.datasets.synthetic(args.preset, seed=0)
        spec = ModelSpec("sage-mean", data.num_features, data.num_classes, 64, 2)
        torch.manual_seed(0)
        model = Checkpoint(spec, spec.build().state_dict())
        self.broker, self.config = MemoryBroker(), ServiceConfig(batch_size=args.batch_size)
        self.reads = Reads()
        self.service = Service(sg.Engine.from_pyg(model.model(), data), model,
                               MemoryTransport(self.broker, self.config.topics.updates),
                               self.config, reads=self.reads)
        self.server = HttpServer(self.reads, "127.0.0.1", 0).start()
        self.updates = chunks(data, 1000, seed=1)
        self.ids_file = Path(tempfile.mkdtemp()) / "ids.npy"
        np.save(self.ids_file, data.ids)

    def produce(self, n: int) -> None:
        made = 0
        while made < n:
            chunk = next(self.updates)[:n - made]
            now = time.time()
            for i in range(0, len(chunk), 100):
                part = chunk[i:i + 100]
                for u in part:
                    u["event_time"] = now
                self.broker.produce(self.config.topics.updates, orjson.dumps(part))
            made += len(chunk)

    def reader(self, kind: str, seconds: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, __file__, "--client", self.server.url, kind,
                                 str(seconds), str(self.ids_file)], stdout=subprocess.PIPE,
                                text=True)

    def reads_while(self, kind: str, rate: float) -> dict:
        """A reader for ``--seconds`` while updates are produced at ``rate``/s (0: none)."""
        stop = threading.Event()

        def paced() -> None:
            start, sent = time.perf_counter(), 0
            while not stop.is_set():
                due = int((time.perf_counter() - start) * rate)
                if due - sent >= 100:
                    self.produce(due - sent)
                    sent = due
                time.sleep(0.005)

        reader = self.reader(kind, self.args.seconds)
        if rate:
            threading.Thread(target=paced, daemon=True).start()
        before = self.service.stats.applied
        t = time.perf_counter()
        self.service.run(stop=lambda: reader.poll() is not None)
        stop.set()
        out = json.loads(reader.stdout.read())
        out["ingest_per_s"] = (self.service.stats.applied - before) / (time.perf_counter() - t)
        self.drain()
        return out

    def ingest(self, with_reads: bool) -> dict:
        """Updates/s draining a backlog larger than ``--seconds`` can take (for as long as
        the reader reads, if ``with_reads``)."""
        self.produce(self.args.backlog)
        reader = self.reader("vertex", self.args.seconds) if with_reads else None
        before = self.service.stats.applied
        t = time.perf_counter()
        end = t + self.args.seconds
        self.service.run(stop=lambda: reader.poll() is not None if reader
                         else time.perf_counter() >= end)
        out = {"ingest_per_s": (self.service.stats.applied - before) /
               (time.perf_counter() - t)}
        if reader is not None:
            out.update(json.loads(reader.stdout.read()))
        self.drain()
        return out

    def drain(self) -> None:
        """Apply what is left, so the next row starts from an empty topic."""
        self.service.run(stop=lambda: self.service.transport.lag() == 0
                         and not self.service.pending)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rate", type=float, default=2000, help="paced ingest, updates/s")
    ap.add_argument("--seconds", type=float, default=20, help="per row")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=200_000,
                    help="updates queued for the ingest rows (more than they can take)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/rest.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()
    bench = Bench(args)
    bench.produce(5000)  # numba's first compilations, outside every row
    bench.drain()

    rows = [("vertex", "none", bench.reads_while("vertex", 0)),
            ("lookup 1000", "none", bench.reads_while("lookup", 0)),
            ("vertex", f"{args.rate:,.0f}/s paced", bench.reads_while("vertex", args.rate)),
            ("lookup 1000", f"{args.rate:,.0f}/s paced",
             bench.reads_while("lookup", args.rate)),
            ("none", "backlog", bench.ingest(False)),
            ("vertex", "backlog", bench.ingest(True))]
    bench.server.stop()
    table = Table(title=f"REST on {args.preset}, batches of {args.batch_size}, one closed-loop "
                        f"reader, {args.seconds:g} s per row")
    for col in ("reads", "ingest", "reads/s", "p50 ms", "p99 ms", "max ms",
                "batches seen", "updates/s applied"):
        table.add_column(col, justify="right")
    for kind, ingest, r in rows:
        reads = [f"{r[k]:,.1f}" for k in ("reads_per_s", "p50_ms", "p99_ms", "max_ms")
                 ] if "reads" in r else ["-"] * 4
        table.add_row(kind, ingest, *reads, str(r.get("batches_seen", "-")),
                      f"{r['ingest_per_s']:,.0f}")
    console.print(table)
    without, with_reads = rows[-2][2]["ingest_per_s"], rows[-1][2]["ingest_per_s"]
    console.print(f"ingest with a steady read load / without: {with_reads / without:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"preset": args.preset, "rate": args.rate,
                                    "seconds": args.seconds, "batch_size": args.batch_size,
                                    "rows": [{"reads": k, "ingest": i, **r}
                                             for k, i, r in rows]}, indent=1))
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
