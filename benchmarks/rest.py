"""REST benchmark: read latency while ingesting, and ingest throughput while reading.

    python benchmarks/rest.py [--preset arxiv-like] [--rate 10000] [--seconds 20]

One process serves (`Service` on the in-memory transport, the REST API on a uvicorn
thread, vertex reads from the service's `ReadView`, as `streamgnn serve --http` runs); a
client process reads over HTTP, one request at a time (closed loop, httpx): single
vertices (``GET /v1/vertices/{id}``) or 1,000-id lookups (``POST /v1/vertices/lookup``).
Ingest is the soak benchmark's steady-size workload (100 updates per message), encoded
before each row starts so that producing costs the serving process next to nothing.

Rows: reads alone; reads while ingesting at ``--rate`` updates/s (paced); ingest of a
backlog for ``--seconds`` with no reads, with a steady read load of each kind, and with
the REST API off (no view to refresh). Updates/s are counted from the end of a row's
first batch to the end of its last. Prints a table and writes JSON.
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
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.router import BatchReport, Service, ServiceConfig
from streamgnn.router.reads import Reads
from streamgnn.stream.memory import MemoryBroker, MemoryTransport

console = Console(width=160)


def client(url: str, kind: str, seconds: float, ids_file: str) -> None:
    """Read for ``seconds``, one request at a time; print latencies' percentiles (JSON)."""
    ids = np.load(ids_file)
    rng = np.random.default_rng(0)
    latencies, batches = [], set()
    no_delay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(base_url=url, timeout=60, transport=no_delay) as http:
        while http.get("/readyz").status_code != 200:  # the service builds its view
            time.sleep(0.05)
        end = time.perf_counter() + seconds
        cpu = time.process_time()
        while (t := time.perf_counter()) < end:
            if kind == "vertex":
                got = http.get(f"/v1/vertices/{int(rng.choice(ids))}")
            else:
                got = http.post("/v1/vertices/lookup",
                                json={"ids": rng.choice(ids, 1000).tolist()})
            got.raise_for_status()
            latencies.append(time.perf_counter() - t)
            batches.add(got.json()["batch"])
    cpu = time.process_time() - cpu
    ms = np.array(latencies) * 1000
    print(json.dumps({"reads": len(ms), "reads_per_s": len(ms) / seconds,
                      "client_cpu_share": cpu / seconds,
                      "p50_ms": float(np.percentile(ms, 50)),
                      "p99_ms": float(np.percentile(ms, 99)),
                      "max_ms": float(ms.max()), "batches_seen": len(batches)}))


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        data = sg.datasets.synthetic(args.preset, seed=0)
        spec = ModelSpec("sage-mean", data.num_features, data.num_classes, 64, 2)
        torch.manual_seed(0)
        model = ModelFile(spec, spec.build().state_dict())
        self.broker, self.config = MemoryBroker(), ServiceConfig(batch_size=args.batch_size)
        self.topic = self.config.topics.updates
        self.reads = Reads()
        self.service = Service(sg.Engine.from_pyg(model.model(), data), model,
                               MemoryTransport(self.broker, self.topic), self.config,
                               reads=self.reads)
        self.server = HttpServer(self.reads, "127.0.0.1", 0).start()
        self.updates = chunks(data, 1000, seed=1)
        self.ids_file = Path(tempfile.mkdtemp()) / "ids.npy"
        np.save(self.ids_file, data.ids)
        self.batch_ms: list[float] = []
        self.batch_ends: list[tuple[float, int]] = []
        self.view_bytes = 0

    def encoded(self, n: int) -> list[bytes]:
        """The next ``n`` updates as messages of 100."""
        out: list[bytes] = []
        while len(out) * 100 < n:
            chunk = next(self.updates)
            out += [orjson.dumps(chunk[i:i + 100]) for i in range(0, len(chunk), 100)]
        return out

    def reader(self, kind: str, seconds: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, __file__, "--client", self.server.url, kind,
                                 str(seconds), str(self.ids_file)], stdout=subprocess.PIPE,
                                text=True)

    def on_batch(self, report: BatchReport) -> None:
        self.batch_ms.append(report.seconds * 1000)
        self.batch_ends.append((time.perf_counter(), report.size))
        if self.reads.view is not None:
            self.view_bytes = self.reads.view.nbytes

    def serve(self, stop, reads: bool = True) -> dict:
        """Run the service until ``stop()``; updates/s applied and batch times meanwhile.
        ``reads=False``: without the read view (the REST API off)."""
        self.service.reads = self.reads if reads else None
        self.batch_ms, self.batch_ends = [], []
        self.service.run(stop=stop, on_batch=self.on_batch)
        ms = np.array(self.batch_ms or [0.0])
        ends = self.batch_ends  # updates/s from the end of the first batch to the last
        rate = (sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0])
                if len(ends) > 1 else 0.0)
        return {"ingest_per_s": rate, "batch_p50_ms": float(np.percentile(ms, 50)),
                "batch_p99_ms": float(np.percentile(ms, 99))}

    def reads_while(self, kind: str, rate: float) -> dict:
        """A reader for ``--seconds`` while updates are produced at ``rate``/s (0: none)."""
        messages = self.encoded(int(rate * (self.args.seconds + 5)))
        stop = threading.Event()

        def paced() -> None:
            start, sent = time.perf_counter(), 0
            while not stop.is_set() and sent < len(messages):
                due = min(len(messages), int((time.perf_counter() - start) * rate / 100))
                for message in messages[sent:due]:
                    self.broker.produce(self.topic, message)
                sent = max(sent, due)
                time.sleep(0.005)

        reader = self.reader(kind, self.args.seconds)
        if rate:
            threading.Thread(target=paced, daemon=True).start()
        out = self.serve(lambda: reader.poll() is not None)
        stop.set()
        out.update(json.loads(reader.stdout.read()))
        self.drain()
        return out

    def ingest(self, kind: str | None, reads: bool = True) -> dict:
        """Updates/s draining a backlog larger than ``--seconds`` can take, while a reader
        of ``kind`` reads (None: no reader)."""
        for message in self.encoded(self.args.backlog):
            self.broker.produce(self.topic, message)
        reader = self.reader(kind, self.args.seconds) if kind else None
        end = time.perf_counter() + self.args.seconds
        out = self.serve(lambda: reader.poll() is not None if reader
                         else time.perf_counter() >= end, reads)
        if reader is not None:
            out.update(json.loads(reader.stdout.read()))
        self.drain()
        return out

    def drain(self) -> None:
        """Apply what is left, so the next row starts from an empty topic; forget the
        consumed records and the outputs (as Kafka's retention would)."""
        self.service.reads = None
        self.service.run(stop=lambda: self.service.transport.lag() == 0
                         and not self.service.pending)
        with self.broker.lock:
            for name, parts in self.broker.topics.items():
                for log in parts:
                    log[:] = [None] * len(log) if name == self.topic else []


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="arxiv-like")
    ap.add_argument("--rate", type=float, default=10_000, help="paced ingest, updates/s")
    ap.add_argument("--seconds", type=float, default=20, help="per row")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=400_000,
                    help="updates queued for the ingest rows (more than they can take)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch's intra-op threads (default: torch's own, as serve runs)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/rest.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    bench = Bench(args)
    for message in bench.encoded(5000):  # numba's first compilations, outside every row
        bench.broker.produce(bench.topic, message)
    bench.drain()

    paced = f"{args.rate:,.0f}/s paced"
    rows = [("vertex", "none", bench.reads_while("vertex", 0)),
            ("lookup 1000", "none", bench.reads_while("lookup", 0)),
            ("vertex", paced, bench.reads_while("vertex", args.rate)),
            ("lookup 1000", paced, bench.reads_while("lookup", args.rate)),
            ("none (REST off)", "backlog", bench.ingest(None, reads=False)),
            ("none", "backlog", bench.ingest(None)),
            ("vertex", "backlog", bench.ingest("vertex")),
            ("lookup 1000", "backlog", bench.ingest("lookup"))]
    bench.server.stop()
    table = Table(title=f"REST on {args.preset}, batches of {args.batch_size}, one closed-loop "
                        f"reader, {args.seconds:g} s per row, {args.threads} torch threads")
    for col in ("reads", "ingest", "reads/s", "p50 ms", "p99 ms", "max ms", "reader CPU",
                "batches seen", "updates/s applied", "batch p50 ms", "batch p99 ms"):
        table.add_column(col, justify="right")
    for kind, ingest, r in rows:
        reads = [*(f"{r[k]:,.1f}" for k in ("reads_per_s", "p50_ms", "p99_ms", "max_ms")),
                 f"{r['client_cpu_share']:.0%}"] if "reads" in r else ["-"] * 5
        table.add_row(kind, ingest, *reads, str(r.get("batches_seen", "-")),
                      f"{r['ingest_per_s']:,.0f}", f"{r['batch_p50_ms']:.1f}",
                      f"{r['batch_p99_ms']:.1f}")
    console.print(table)
    alone = rows[5][2]["ingest_per_s"]
    for i in (4, 6, 7):
        console.print(f"ingest, {rows[i][0]} / no reads: {rows[i][2]['ingest_per_s'] / alone:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"preset": args.preset, "rate": args.rate,
                                    "seconds": args.seconds, "batch_size": args.batch_size,
                                    "threads": args.threads,
                                    "view_bytes": bench.view_bytes,
                                    "rows": [{"read": k, "ingest": i, **r}
                                             for k, i, r in rows]}, indent=1))
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
