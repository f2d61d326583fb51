"""What the `streamgnn` commands print when their output is not a terminal (a pipe, a log
file): plain progress lines at a period, no escape sequences or carriage returns, counts
that end where the summary does; table titles on one line; `--help` paragraphs that reflow
to the width; plots whose series look different."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from itertools import pairwise

import httpx
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from streamgnn.cli import app
from tests.kafka_fixtures import free_port, wait_until_ready

PERIOD = {"STREAMGNN_PROGRESS_SECONDS": "0.05"}


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamgnn.cli", *args]


def run(*args: str, cwd, env: dict[str, str] | None = None) -> str:
    """stdout and stderr of the command, both to pipes; it must succeed."""
    out = subprocess.run(_command(*args), cwd=cwd, capture_output=True, text=True,
                         timeout=600, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def _plain(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text[-2000:])


def _progress(text: str, desc: str) -> list[re.Match]:
    """The progress lines of ``desc`` in ``text``."""
    return list(re.finditer(rf"^{desc}: ([\d,]+)(?:/([\d,]+) \(\d+%\))? \S+, [\d,]+ \S+/s, "
                            rf"[\d,.]+ s(.*)$", text, re.MULTILINE))


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_train_off_a_terminal_prints_progress_lines_not_a_bar(tmp_path):
    text = run("train", "--dataset", "tiny", "--model", "gcn", "--epochs", "20", "--hidden",
               "8", "--out", "m.pt", cwd=tmp_path, env=PERIOD)
    _plain(text)
    lines = _progress(text, "train gcn")
    assert lines and lines[-1].group(1) == lines[-1].group(2) == "20", text


def test_produce_off_a_terminal_prints_progress_lines_out_of_the_files_updates(
        tmp_path, broker, topics):
    updates = [f'{{"op": "add_edge", "src": {7 + i % 5}, "dst": {100 + i}}}'
               for i in range(200)]
    (tmp_path / "u.jsonl").write_text("\n".join([*updates[:100], "", *updates[100:]]) + "\n")
    text = run("produce", "u.jsonl", "--rate", "400", "--per-message", "10", "-b",
               broker.bootstrap, "--topic-prefix", topics.updates.removesuffix(
                   "graph-updates"), cwd=tmp_path, env=PERIOD)
    _plain(text)
    lines = _progress(text, "producing")
    assert len(lines) >= 3, text
    assert all(m.group(2) == "200" for m in lines)
    assert lines[-1].group(1) == "200" and "200 updates -> " in text


def test_serve_off_a_terminal_ends_its_progress_with_the_summarys_counts(
        tmp_path, broker, topics):
    """Records dead-lettered after the last batch (input that never makes one) count in
    the last progress line as in the summary."""
    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", broker.bootstrap, "--topic-prefix", prefix)
    run("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
        "8", "--out", "m.pt", cwd=tmp_path)
    run("datasets", "holdout", "tiny", "-o", "u.jsonl", cwd=tmp_path)
    good = (tmp_path / "u.jsonl").read_text().splitlines()[:300]
    (tmp_path / "u.jsonl").write_text("\n".join([*good[:150], "{oops", *good[150:]]) + "\n")
    (tmp_path / "bad.jsonl").write_text("{oops\n[1, 2\n")
    port = free_port()
    serve = subprocess.Popen(
        _command("serve", "-c", "m.pt", "--dataset", "tiny", "--bs", "50", "--state-dir",
                 "state", "--http", f"127.0.0.1:{port}", *common),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **PERIOD})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until_ready(http, serve, 300)
            run("produce", "u.jsonl", "--rate", "600", "--per-message", "10", *common,
                cwd=tmp_path)
            applied = _wait(http, lambda s: sum(s["applied"].values()) >= 300)
            run("produce", "bad.jsonl", *common, cwd=tmp_path)
            _wait(http, lambda s: s["dead_letters"] != applied["dead_letters"])
        serve.terminate()
        out = serve.communicate(timeout=120)[0]
    finally:
        serve.kill()
    _plain(out)
    last = _progress(out, "updates applied")[-1]
    applied = re.search(r"events consumed / applied\s*│\s*([\d,]+) / ([\d,]+)", out)
    by_reason = re.search(r"dead letters\s*│\s*([^│]*?)\s*│", out).group(1)
    dead = sum(int(n) for n in re.findall(r": (\d+)", by_reason))
    assert _number(last.group(1)) == _number(applied.group(2)) == 300, out
    assert dead >= 2 and f"dead={dead}" in last.group(3), out


def test_replay_run_off_a_terminal_prints_progress_lines_up_to_the_ops_sent(
        tmp_path, broker, topics):
    common = ("-b", broker.bootstrap, "--topic-prefix", topics.updates.removesuffix(
        "graph-updates"))
    run("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
        "8", "--out", "m.pt", cwd=tmp_path)
    run("replay", "generate", "--dataset", "tiny", "--ops", "300", "--rate", "150", "-o",
        "t.jsonl", cwd=tmp_path)
    port = free_port()
    serve = subprocess.Popen(
        _command("serve", "-c", "m.pt", "--dataset", "tiny", "--bs", "50", "--state-dir",
                 "state", "--http", f"127.0.0.1:{port}", *common),
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until_ready(http, serve, 300)
        text = run("replay", "run", "t.jsonl", "-o", "rep", "--drain", "5", "--http",
                   f"http://127.0.0.1:{port}", *common, cwd=tmp_path, env=PERIOD)
    finally:
        serve.terminate()
        serve.wait(60)
    _plain(text)
    lines = _progress(text, "replay")
    assert len(lines) >= 3 and all(m.group(2) == "300" for m in lines), text
    sent = json.loads((tmp_path / "rep" / "report.json").read_text())["counts"]["sent"]
    assert _number(lines[-1].group(1)) == sent == 300


def _wait(http, done) -> dict:
    """The service's /v1/status once ``done`` says yes to it."""
    deadline = time.monotonic() + 120
    while not done(status := http.get("/v1/status").json()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return status


def test_table_titles_stay_one_line_above_a_narrower_table(tmp_path):
    text = run("datasets", "info", "--dataset", "tiny", cwd=tmp_path)
    title = text.splitlines()[0]
    assert title.startswith("GraphData('tiny'") and title.endswith(")"), text
    assert len(title) > len(text.splitlines()[1])  # wider than the table


def _paths(command, path: tuple[str, ...] = ()):
    yield path
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield from _paths(sub, (*path, name))


def _paragraph_breaks(text: str) -> list[tuple[str, str]]:
    """(line, the next line) of each line break inside a paragraph of the description
    (between the usage line and the first panel)."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")),
               len(lines))
    body = lines[start:end]
    return [(a, b) for a, b in pairwise(body) if a.strip() and b.strip()]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("path", [" ".join(p) for p in _paths(get_command(app))])
def test_help_paragraphs_fill_the_width(path, columns):
    """A line of a --help paragraph ends only where its next word would not fit."""
    out = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) == columns
    for line, after in _paragraph_breaks(out.output):
        assert len(line) + 1 + len(after.split()[0]) > columns - 2, (line, after)


def test_latency_cdf_series_differ_in_colour_or_style():
    from hdrh.histogram import HdrHistogram
    from matplotlib import pyplot as plt

    from streamgnn.replay.report import figures

    histograms = {}
    for i in range(12):
        h = HdrHistogram(1, 60_000_000, 3)
        for v in range(1, 50):
            h.record_value(v * 1000 * (i + 1))
        histograms[f"measure {i}"] = h.encode().decode()
    report = {"series": {"interval_s": 1.0, "sent": [1, 2], "completed": [1, 2]},
              "rate": {"offered_ops_per_s": 2}, "histograms": histograms}
    plots = dict(figures(report))
    try:
        lines = plots["latency_cdf.png"].axes[0].get_lines()
        assert len(lines) == 12
        looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}
        assert len(looks) == 12
    finally:
        for fig in plots.values():
            plt.close(fig)
