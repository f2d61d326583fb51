"""The `streamgnn` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.kafka_fixtures import STRICT_TOPIC, free_port, wait_until_ready


def run(*args: str, cwd) -> str:
    out = subprocess.run([sys.executable, "-m", "streamgnn.cli", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_help_explains_the_commands(tmp_path):
    text = run("--help", cwd=tmp_path)
    for word in ("train", "bootstrap", "demo", "datasets", "serve", "produce", "watch",
                 "broker"):
        assert word in text


def test_train_help_names_every_model(tmp_path):
    from streamgnn.models.zoo import MODELS

    text = " ".join(run("train", "--help", cwd=tmp_path).replace("│", " ").split())
    for name in MODELS:
        assert name in text


def test_train_then_bootstrap(tmp_path):
    text = run("train", "--dataset", "tiny", "--model", "gcn", "--epochs", "3", "--hidden",
               "8", "--out", "m.pt", cwd=tmp_path)
    assert "MLP" in text and (tmp_path / "m.pt").exists()
    text = run("bootstrap", "--dataset", "tiny", "--checkpoint", "m.pt", cwd=tmp_path)
    assert "max |ours - PyG|" in text


def test_generate_writes_a_loadable_file(tmp_path):
    run("datasets", "generate", "tiny", "--out", "t.npz", cwd=tmp_path)
    assert "tiny" in run("datasets", "info", "--dataset", "t.npz", cwd=tmp_path)


def test_demo_streams_the_held_out_updates_through_kafka_exactly(tmp_path):
    text = run("demo", "--dataset", "tiny", "--epochs", "2", "--batch-size", "100",
               "--port", str(free_port()), "--state-dir", str(tmp_path / "broker"),
               cwd=tmp_path)
    assert "embedded broker started" in text and "embedded broker stopped" in text
    published, read = re.search(
        r"label changes published / read back\s*│\s*([\d,]+) / ([\d,]+)", text).groups()
    assert published == read and int(published.replace(",", "")) > 0
    assert all(len(line) <= 80 for line in text.splitlines())
    err = float(text.split("max |engine - PyG forward|, final graph")[1].split("│")[1])
    assert err < 1e-4


def test_docker_compose_points_the_service_at_its_kafka_with_variables_serve_reads(tmp_path):
    """Parsed, not run (no Docker engine here): the service talks to the compose file's
    Kafka, every STREAMGNN_ variable it sets is one `serve` reads, and its REST port is
    published and health-checked through /healthz."""
    import typer
    import yaml

    from streamgnn.cli import app

    compose = yaml.safe_load(Path("docker-compose.yml").read_text())
    kafka, service = compose["services"]["kafka"], compose["services"]["streamgnn"]
    assert kafka["image"].startswith("apache/kafka")
    env = service["environment"]
    assert env["STREAMGNN_BOOTSTRAP_SERVERS"].split(":")[0] == "kafka"
    assert service["command"][:2] == ["streamgnn", "serve"]
    # every STREAMGNN_ variable it sets is one the CLI reads
    serve = typer.main.get_command(app).commands["serve"]
    known = {p.envvar for p in serve.params if p.envvar}
    assert {k for k in env if k.startswith("STREAMGNN_")} <= known
    # the REST port: a bind `serve` accepts with the token, published, health-checked
    from streamgnn.api.bind import parse_bind

    _, port = parse_bind(env["STREAMGNN_HTTP"], env["STREAMGNN_HTTP_TOKEN"])
    assert env["STREAMGNN_HTTP_TOKEN"].startswith("${STREAMGNN_HTTP_TOKEN:?")
    assert any(p.endswith(f":{port}") for p in service["ports"])
    assert f"127.0.0.1:{port}/healthz" in " ".join(service["healthcheck"]["test"])


def test_produce_serve_watch_round_trip(tmp_path, broker, topics):
    """A user's loop: produce a file (with a bad line) into Kafka, serve it until idle,
    watch the label changes and the dead letter."""
    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", broker.bootstrap, "--topic-prefix", prefix)
    run("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
        "8", "--out", "m.pt", cwd=tmp_path)
    run("datasets", "holdout", "tiny", "-o", "u.jsonl", cwd=tmp_path)
    lines = (tmp_path / "u.jsonl").read_text().splitlines()[:300]
    (tmp_path / "u.jsonl").write_text("\n".join([*lines[:150], "{oops", *lines[150:]]) + "\n")
    assert "301 updates" in run("produce", "u.jsonl", "--per-message", "25", *common,
                                cwd=tmp_path)
    run("serve", "-c", "m.pt", "--dataset", "tiny", "--bs", "50", "--until-idle", "2",
        "--state-dir", "state", "--http", "off", *common, cwd=tmp_path)
    labels = run("watch", "labels", "--from-beginning", "--idle", "2", *common,
                 cwd=tmp_path).splitlines()
    assert labels and all(line.split()[0] == "batch" and "->" in line for line in labels)
    letters = run("watch", "dead-letters", "--from-beginning", "--idle", "2", *common,
                  cwd=tmp_path)
    assert "malformed_json" in letters


def test_produce_exits_1_naming_updates_the_broker_refuses(tmp_path, validating_broker):
    """The validating broker refuses messages of more than two updates: `produce` stops,
    exits 1 and names the refused updates, the first one and the broker's reason."""
    lines = [f'{{"op": "add_edge", "src": 7, "dst": {d}}}' for d in range(1, 6)]
    (tmp_path / "u.jsonl").write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "streamgnn.cli", "produce", "u.jsonl",
                          "--per-message", "3", "-b", validating_broker.bootstrap_servers,
                          "--topic-prefix", STRICT_TOPIC.removesuffix("graph-updates")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1, text
    assert "the broker did not take" in text and "(the first: update #1)" in text
    assert "InvalidRecordError: This record has failed the validation" in text
    assert "Traceback" not in text and "updates -> " not in text


def test_query_asks_the_running_service_and_prints_its_answer(tmp_path, broker, topics):
    """`streamgnn query` against `streamgnn serve`: a good request prints each new
    vertex's label and the batch it read; a bad one prints the error and exits 1."""
    import json
    import os

    import streamgnn as sg

    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", broker.bootstrap, "--topic-prefix", prefix)
    run("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
        "8", "--out", "m.pt", cwd=tmp_path)
    snapshot, _ = sg.datasets.split_stream(sg.datasets.synthetic("tiny", 0), 0.2, 0)
    v, w = (int(i) for i in snapshot.ids[:2])
    x = [0.25] * snapshot.num_features
    (tmp_path / "good.json").write_text(json.dumps({
        "vertices": [{"id": -7, "x": x}, {"id": -8, "x": x}],
        "edges": [{"src": -7, "dst": v}, {"src": w, "dst": -7}, {"src": -7, "dst": -8}]}))
    (tmp_path / "bad.json").write_text(json.dumps({
        "vertices": [{"id": -7, "x": x}], "edges": [{"src": v, "dst": w}]}))
    serve = subprocess.Popen(
        [sys.executable, "-m", "streamgnn.cli", "serve", "-c", "m.pt", "--dataset", "tiny",
         "--until-idle", "20", "--state-dir", "state", "--http", "off", *common], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"})
    try:
        # (serve compiles its kernels first: over a minute where numba's cache is empty)
        out = run("query", "good.json", "--budget", "0.5", "--embeddings", "--timeout",
                  "400", *common, cwd=tmp_path)
        assert "SRPE gamma=0.5 (top-ratio), state after batch 0" in out
        assert "-7" in out and "-8" in out
        bad = subprocess.run([sys.executable, "-m", "streamgnn.cli", "query", "bad.json",
                              "--timeout", "60", *common], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 1 and "invalid_query" in bad.stdout, bad.stdout + bad.stderr
        assert "joins two existing vertices" in bad.stdout.replace("\n", " ")
    finally:
        serve.terminate()
        serve.wait(60)


def test_serve_answers_rest_reads_of_the_vertices_it_serves(tmp_path, broker, topics):
    """`serve --http` as a user runs it: /readyz once bootstrapped, then a vertex read
    names the batch it saw, and the held-out updates produced meanwhile advance it."""
    import os
    import time

    import httpx

    import streamgnn as sg

    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", broker.bootstrap, "--topic-prefix", prefix)
    run("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
        "8", "--out", "m.pt", cwd=tmp_path)
    run("datasets", "holdout", "tiny", "-o", "u.jsonl", cwd=tmp_path)
    snapshot, _ = sg.datasets.split_stream(sg.datasets.synthetic("tiny", 0), 0.2, 0)
    v = int(snapshot.ids[0])
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "streamgnn.cli", "serve", "-c", "m.pt", "--dataset", "tiny",
         "--bs", "50", "--state-dir", "state", "--http", f"127.0.0.1:{port}", *common],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until_ready(http, serve, 300)
            deadline = time.monotonic() + 300
            first = http.get(f"/v1/vertices/{v}").json()
            assert first["id"] == v and first["batch"] == 0 and first["layer"] == 2
            assert len(first["embedding"]) == 6 and 0 <= first["label"] < 6
            assert http.get("/v1/vertices/-5").json()["reason"].startswith("vertex -5 ")
            run("produce", "u.jsonl", *common, cwd=tmp_path)
            while http.get("/v1/status").json()["batch"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert http.get(f"/v1/vertices/{v}").json()["batch"] > 0
            assert "streamgnn_batches_total" in http.get("/metrics").text
    finally:
        serve.terminate()
        out = serve.communicate(timeout=60)[0]
    assert f"REST API on http://127.0.0.1:{port}" in out, out


def test_serve_refuses_to_listen_beyond_loopback_without_a_token(tmp_path):
    import os

    out = subprocess.run([sys.executable, "-m", "streamgnn.cli", "serve", "--http",
                          "0.0.0.0:8080"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 2
    assert "needs a bearer token" in out.stderr and "STREAMGNN_HTTP_TOKEN" in out.stderr
