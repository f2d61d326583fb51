"""A user's mistakes, as the installed `streamgnn` command answers them (a real
subprocess): exit code 2 and at most four lines, `error:` naming the mistake in the user's
terms and `hint:` saying what to do, no traceback unless --debug or STREAMGNN_DEBUG=1 asks
for it; without a broker, within seconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import streamgnn as sg
from streamgnn.models.zoo import ModelFile, ModelSpec
from tests.kafka_fixtures import free_port

STREAMGNN = str(Path(sys.executable).with_name("streamgnn"))  # the [project.scripts] entry
NO_BROKER_S = 15.0  # startup plus the command's wait for a broker that is not there


def mistake(*args: str, cwd: Path, error: str, hint: str,
            env: dict[str, str] | None = None) -> float:
    """Run ``streamgnn ARGS``; check it failed as a mistake should (exit 2, at most four
    lines, no traceback, ``error`` in its error line, ``hint`` in its hint line) and
    return the seconds it took."""
    start = time.monotonic()
    out = subprocess.run([STREAMGNN, *args], cwd=cwd, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": "200", **(env or {})})
    took = time.monotonic() - start
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert len(text.splitlines()) <= 4 and "Traceback" not in text, text
    lines = out.stderr.splitlines()
    assert lines[-2].startswith("error: ") and error in lines[-2], text
    assert lines[-1].startswith("hint: ") and hint in lines[-1], text
    return took


def model_file(path: Path, in_dim: int, out_dim: int) -> Path:
    spec = ModelSpec("gcn", in_dim, out_dim, hidden=8)
    return ModelFile(spec, spec.build().state_dict(), dataset="tiny-snapshot").save(path)


@pytest.mark.parametrize(("args", "error", "hint"), [
    (("datasets", "info", "--dataset", "nope"), "unknown dataset 'nope'",
     "tiny, small, arxiv-like, products-like"),
    (("datasets", "generate", "nope"), "unknown preset 'nope'",
     "tiny, small, arxiv-like, products-like"),
    (("train", "--dataset", "tiny", "--model", "nope"), "unknown model 'nope'",
     "gcn, sage-mean, sage-sum"),
    (("datasets", "info", "--dataset", "missing.npz"), "missing.npz does not exist",
     "streamgnn datasets generate tiny --out missing.npz"),
    (("bootstrap", "-c", "missing.pt", "--dataset", "tiny"), "missing.pt does not exist",
     "streamgnn train --dataset DATASET --out missing.pt"),
    (("produce", "missing.jsonl", "-b", "127.0.0.1:9"),
     "cannot read the updates file missing.jsonl: No such file",
     "streamgnn datasets holdout DATASET -o missing.jsonl"),
    (("replay", "run", "missing.jsonl", "-b", "127.0.0.1:9"), "missing.jsonl: no such trace",
     "streamgnn replay generate --out FILE"),
    (("query", "missing.json", "-b", "127.0.0.1:9"),
     "cannot read the query request file missing.json: No such file",
     '{"vertices": [{"id": 900001, "x": [...]}]'),
    (("serve", "--bs", "0", "--http", "off"),
     "--batch-size: input should be greater than or equal to 1 (got 0)",
     "streamgnn serve --help"),
])
def test_an_unknown_name_or_a_missing_file_names_the_choices_or_how_to_make_one(
        tmp_path, args, error, hint):
    mistake(*args, cwd=tmp_path, error=error, hint=hint)


def test_a_file_of_another_kind_is_named_with_how_to_make_the_right_one(tmp_path):
    (tmp_path / "garbage.npz").write_bytes(b"not a zip")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    for name in ("garbage.npz", "other.npz"):
        mistake("datasets", "info", "--dataset", name, cwd=tmp_path,
                error=f"{name} is not a streamgnn dataset file",
                hint=f"streamgnn datasets generate tiny --out {name}")
    torch.save(ModelSpec("gcn", 32, 6).build().state_dict(), tmp_path / "weights.pt")
    (tmp_path / "text.pt").write_text("not a model")
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("weights.pt", "text.pt", "empty.pt"):
        mistake("bootstrap", "-c", name, "--dataset", "tiny", cwd=tmp_path,
                error=f"{name} is not a streamgnn checkpoint",
                hint=f"streamgnn train --dataset DATASET --out {name}")


def test_a_model_that_does_not_fit_the_dataset_is_refused_naming_both_numbers(tmp_path):
    model_file(tmp_path / "m32.pt", 32, 6)  # tiny's widths; small has 64 features
    mistake("bootstrap", "-c", "m32.pt", "--dataset", "small", cwd=tmp_path,
            error="the model (trained on tiny-snapshot) takes 32 features per vertex, "
                  "--dataset small has 64", hint="streamgnn train --dataset small")
    model_file(tmp_path / "m5.pt", 32, 5)
    mistake("bootstrap", "-c", "m5.pt", "--dataset", "tiny", cwd=tmp_path,
            error="predicts 5 classes, --dataset tiny has 6",
            hint="streamgnn train --dataset tiny")


def test_serve_refuses_a_model_that_does_not_fit_or_is_not_there(tmp_path, broker, topics):
    common = ("--http", "off", "-b", broker.bootstrap, "--topic-prefix",
              topics.updates.removesuffix("graph-updates"))
    model_file(tmp_path / "m32.pt", 32, 6)
    mistake("serve", "-c", "m32.pt", "--dataset", "small", "--state-dir", "a", *common,
            cwd=tmp_path, error="takes 32 features per vertex, --dataset small has 64",
            hint="streamgnn train --dataset small")
    mistake("serve", "-c", "missing.pt", "--dataset", "tiny", "--state-dir", "b", *common,
            cwd=tmp_path, error="model file missing.pt does not exist",
            hint="streamgnn train --dataset DATASET --out missing.pt")


def test_serve_refuses_another_model_than_the_one_its_state_serves(tmp_path, broker, topics):
    common = ("--dataset", "tiny", "--state-dir", "state", "--http", "off", "-b",
              broker.bootstrap, "--topic-prefix", topics.updates.removesuffix("graph-updates"))
    model_file(tmp_path / "first.pt", 32, 6)
    first = subprocess.run([STREAMGNN, "serve", "-c", "first.pt", "--until-idle", "1", *common],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    model_file(tmp_path / "other.pt", 32, 6)  # the same architecture, other weights
    mistake("serve", "-c", "other.pt", "--until-idle", "1", *common, cwd=tmp_path,
            error="the state in state serves another model than --checkpoint other.pt "
                  "(the same architecture, other weights)",
            hint="a fresh --state-dir")


def test_a_bad_query_file_is_named_with_its_problem(tmp_path):
    good = {"vertices": [{"id": 900001, "x": [1.0]}], "edges": []}
    (tmp_path / "cut.json").write_text(json.dumps(good)[:20])
    (tmp_path / "list.json").write_text(json.dumps([good]))
    (tmp_path / "no-id.json").write_text(json.dumps(
        {"vertices": [{"vertex": 900001, "x": [1.0]}], "edges": []}))
    for name, problem in (("cut.json", "unexpected end of data"),
                          ("list.json", "not a JSON object"),
                          ("no-id.json", "Field required (at vertices.0.id)")):
        mistake("query", name, "-b", "127.0.0.1:9", cwd=tmp_path,
                error=f"{name} is not a query request: {problem}",
                hint='{"vertices": [{"id": 900001, "x": [...]}]')


@pytest.mark.parametrize("args", [
    ("serve", "-c", "m.pt", "--dataset", "tiny", "--http", "off"),
    ("produce", "u.jsonl"),
    ("watch", "labels"),
    ("query", "q.json"),
    ("replay", "run", "t.csv"),
])
def test_every_kafka_command_without_a_broker_says_how_to_start_one_within_seconds(
        tmp_path, args):
    (tmp_path / "u.jsonl").write_text('{"op": "add_edge", "src": 1, "dst": 2}\n')
    (tmp_path / "q.json").write_text('{"vertices": [{"id": 9, "x": [1.0]}], "edges": []}')
    (tmp_path / "t.csv").write_text("0.0,add,1,2\n1.0,add,2,3\n")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    took = mistake(*args, "-b", address, cwd=tmp_path,
                   error=f"no Kafka broker answers at {address}",
                   hint="`streamgnn broker start`, or point --bootstrap-servers")
    assert took < NO_BROKER_S


def test_a_port_in_use_is_named_with_the_flag_to_change(tmp_path, broker, topics):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        mistake("broker", "start", "--port", str(port), "--state-dir", "b", cwd=tmp_path,
                error=f"port {port} is in use", hint="choose another --port")
        mistake("serve", "-c", "m.pt", "--dataset", "tiny", "--state-dir", "s",
                "--http", f"127.0.0.1:{port}", "-b", broker.bootstrap, "--topic-prefix",
                topics.updates.removesuffix("graph-updates"), cwd=tmp_path,
                error=f"cannot listen on 127.0.0.1:{port} for --http: Address already in use",
                hint="choose another --http HOST:PORT")


def test_debug_adds_the_traceback_and_keeps_the_error_lines(tmp_path):
    for args, env in (((STREAMGNN, "--debug"), {}), ((STREAMGNN,), {"STREAMGNN_DEBUG": "1"})):
        out = subprocess.run([*args, "datasets", "info", "--dataset", "nope"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, **env})
        assert out.returncode == 2
        assert "Traceback" in out.stderr and "InputError" in out.stderr
        assert out.stderr.splitlines()[-2].startswith("error: unknown dataset 'nope'")


def test_a_query_error_names_the_query_vertex_not_a_position_in_a_batch():
    with pytest.raises(sg.DuplicateVertexError) as e:
        sg.QueryColumns(np.array([900001, 900001]), np.zeros((2, 3))).checked(3)
    assert str(e.value) == "query vertex 900001 appears twice"
    graph = sg.DynamicGraph(1)
    with pytest.raises(sg.SelfLoopError) as e:  # an update's position in its batch stays
        graph.apply([sg.AddVertex(id=1, x=[0.0]), sg.AddEdge(src=1, dst=1)])
    assert str(e.value).endswith("(update #1 of the batch)")
