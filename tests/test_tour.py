"""The README's Tour runs as written: its shell steps in one bash session on the `tiny`
preset (a real embedded broker and `streamgnn serve` on free ports), then its Python step."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import streamgnn as sg
from streamgnn.cli import app
from streamgnn.stream.broker import EmbeddedBroker
from tests.kafka_fixtures import free_port

README = Path(__file__).resolve().parents[1] / "README.md"
TOUR_COMMANDS = ("streamgnn datasets info", "streamgnn train", "streamgnn bootstrap",
                 "streamgnn broker start", "streamgnn serve", "streamgnn produce",
                 "streamgnn watch labels", "curl", "streamgnn query", "streamgnn replay run",
                 "streamgnn broker stop")


def tour_blocks(readme: str, dataset: str, http: str) -> tuple[str, list[str]]:
    """The Tour's bash blocks as one script and its Python blocks, with ``dataset`` for
    arxiv-like and ``http`` (host:port) for the REST API's localhost:8080."""
    section = readme.split("\n## Tour\n", 1)[1].split("\n## ", 1)[0]
    section = section.replace("arxiv-like", dataset).replace("localhost:8080", http)
    blocks = re.findall(r"^```(bash|python)\n(.*?)^```", section, re.S | re.M)
    return ("".join(code for lang, code in blocks if lang == "bash"),
            [code for lang, code in blocks if lang == "python"])


def run_tour_shell(script: str, cwd: Path, broker_port: int, http: str, timeout: float
                   ) -> str:
    """Run ``script`` under bash -e with the streamgnn commands of this interpreter and
    the broker and REST API on the given ports; its output (stderr too). Whatever it
    leaves running is stopped."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "STREAMGNN_BROKER_PORT": str(broker_port),
           "STREAMGNN_BROKER_DIR": str(cwd / "broker"),
           "STREAMGNN_BOOTSTRAP_SERVERS": f"127.0.0.1:{broker_port}",
           "STREAMGNN_HTTP": http, "STREAMGNN_HTTP_URL": f"http://{http}",
           "COLUMNS": "120"}
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        out += f"\n(timed out after {timeout:g} s)"
    finally:
        # a step that failed leaves bash's background `serve` running in its group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        EmbeddedBroker(cwd / "broker").stop()
    assert process.returncode == 0, out[-6000:]
    return out


def test_datasets_info_prints_the_label_balance():
    data = sg.datasets.synthetic("tiny", seed=0)
    counts = np.bincount(data.y)
    result = CliRunner().invoke(app, ["datasets", "info", "--dataset", "tiny"],
                                env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert re.search(rf"classes\s.*\s{len(counts)}\s", result.output)
    assert f"{counts.max() / counts.sum():.1%}" in result.output
    assert f"{counts.min() / counts.sum():.1%}" in result.output


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path, monkeypatch):
    http = f"127.0.0.1:{free_port()}"
    script, python_blocks = tour_blocks(README.read_text(), "tiny", http)
    for command in TOUR_COMMANDS:
        assert command in script, f"the Tour no longer runs {command}"
    assert len(python_blocks) == 1

    out = run_tour_shell(script, tmp_path, free_port(), http, timeout=600)
    assert "largest class" in out  # the label balance step 1 promises
    tour = tmp_path / "runs" / "tour"
    assert {p.name for p in (tour / "replay").iterdir()} >= {
        "report.json", "throughput.png", "latency_cdf.png", "label_changes.png",
        "backlog.png"}
    assert not [p for p in tmp_path.iterdir() if p.name not in ("runs", "broker")]

    monkeypatch.chdir(tmp_path)
    exec(compile(python_blocks[0], "README.md (Tour, Python)", "exec"), {})
