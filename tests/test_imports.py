"""What importing streamgnn costs: the update and query schemas and the CLI's Kafka
commands (produce, watch, query) start without torch, PyG or mpi4py (each in a fresh
interpreter), while every public name of the package still resolves."""

from __future__ import annotations

import subprocess
import sys

import streamgnn as sg

HEAVY = ("torch", "torch_geometric", "mpi4py")


def heavy_imports(importtime_log: str) -> set[str]:
    """The heavy packages a ``python -X importtime`` log shows imported."""
    names = {line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines()
             if line.startswith("import time:")}
    return {n for n in names if n.split(".")[0] in HEAVY}


def test_the_schema_and_kafka_modules_import_without_torch():
    modules = ("streamgnn.updates", "streamgnn.queries", "streamgnn.stream.schemas",
               "streamgnn.cli", "streamgnn.stream.kafka", "streamgnn.stream.kafka_tools",
               "streamgnn.stream.kafka_config", "streamgnn.graph", "streamgnn.datasets")
    code = "".join(f"import {m}\n" for m in modules)
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                         capture_output=True, text=True, check=True)
    assert heavy_imports(out.stderr) == set()


def test_produce_watch_and_query_run_without_importing_torch(tmp_path, kafka, topics):
    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", kafka.bootstrap_servers, "--topic-prefix", prefix)
    (tmp_path / "u.jsonl").write_text('{"op": "add_edge", "src": 1, "dst": 2}\n')
    (tmp_path / "q.json").write_text('{"vertices": [{"id": 9, "x": [1.0]}], "edges": []}')
    for args, code in ((("produce", "u.jsonl"), 0),
                       (("watch", "labels", "--from-beginning", "--idle", "0.5"), 0),
                       (("query", "q.json", "--timeout", "0.5"), 2)):  # 2: no service
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamgnn.cli",
                              *args, *common], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        log = out.stdout + out.stderr
        assert out.returncode == code, log[-3000:]
        assert heavy_imports(out.stderr) == set(), args


def test_every_public_name_resolves_on_first_use():
    for name in sg.__all__:
        assert getattr(sg, name) is not None
        assert name in dir(sg)
    assert sg.Engine.__module__ == "streamgnn.workers.engine"
    assert sg.datasets.synthetic("tiny", 0).num_vertices > 0
