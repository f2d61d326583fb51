"""LinkBench-style workload and trace replay: batches valid in order with the write mix;
traces generated and loaded; the open-loop sender; reports; a run against broker + serve."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.replay import WRITE_MIX, LinkBenchWorkload
from streamgnn.replay.generate import READ_MIX, generate_trace
from streamgnn.replay.matching import Visibility
from streamgnn.replay.openloop import Schedule, send_open_loop
from streamgnn.replay.recorder import Recorder
from streamgnn.replay.report import PLOTS, REPORT, build_report, write_report
from streamgnn.replay.rest import RestReader
from streamgnn.replay.trace import (
    QUERY_OP,
    READ_OPS,
    WRITE_OPS,
    TraceError,
    TraceOp,
    open_trace,
)
from streamgnn.stream import decode_update
from tests.kafka_fixtures import free_port


def test_batches_apply_cleanly_and_follow_the_mix():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("tiny", seed=4))
    workload = LinkBenchWorkload(graph, seed=5)
    seen = collections.Counter()
    for size in (1, 10, 100, 1000, 1000, 1000):
        batch = workload.batch(size)
        assert len(batch) == size
        graph.apply(batch)  # raises if any update is invalid in order
        seen.update(type(u) for u in batch)
    total = sum(seen.values())
    expected = np.array(list(WRITE_MIX.values())) / sum(WRITE_MIX.values())
    observed = np.array([seen[k] / total for k in WRITE_MIX])
    assert np.abs(observed - expected).max() < 0.03


def test_link_writes_are_skewed():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("small", seed=1))
    batch = LinkBenchWorkload(graph, seed=2).batch(3000)
    counts = collections.Counter(u.src for u in batch if isinstance(u, sg.AddEdge))
    top = sum(c for _, c in counts.most_common(len(counts) // 100 + 1))
    assert top / sum(counts.values()) > 0.05  # the top 1 % of sources get > 5 % of links


def test_held_out_arrivals_replay_in_order():
    data = sg.datasets.synthetic("tiny", seed=6)
    snapshot, events = sg.datasets.split_stream(data, frac=0.2, seed=2)
    graph = DynamicGraph.from_data(snapshot)
    workload = LinkBenchWorkload(graph, seed=3, arrivals=events)
    seen = []
    for _ in range(10):
        batch = workload.batch(200)
        graph.apply(batch)
        seen += [u for u in batch if isinstance(u, (sg.AddVertex, sg.AddEdge))]
    arrived = [u for u in seen if u in events]
    assert len(arrived) > 0.9 * len(seen)  # the adds come from the held-out stream...
    order = [events.index(u) for u in arrived[:200]]
    assert order == sorted(order)          # ...in its order


def test_unit_weights():
    graph = DynamicGraph.from_data(sg.datasets.synthetic("tiny", seed=1))
    batch = LinkBenchWorkload(graph, seed=2, unit_weights=True).batch(500)
    assert {u.weight for u in batch if isinstance(u, (sg.AddEdge, sg.UpdateEdge))} == {1.0}


# ---------------------------------------------------------------- traces
@pytest.fixture(scope="module")
def mixed_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "mixed.jsonl"
    generate_trace(path, "tiny", 4000, read_fraction=0.3, query_fraction=0.1,
                   arrivals="constant", rate=500.0, seed=0)
    return path


def test_generated_trace_has_the_fractions_mixes_and_constant_times(mixed_trace):
    trace = open_trace(mixed_trace)
    assert trace.header["ops"] == 4000 and trace.header["rate"] == 500.0
    ops = list(trace.ops())
    assert len(ops) == 4000
    kinds = collections.Counter(op.op for op in ops)
    reads = sum(kinds[k] for k in READ_OPS)
    writes = sum(kinds[k] for k in WRITE_OPS)
    assert abs(reads / 4000 - 0.3) < 0.03 and abs(kinds[QUERY_OP] / 4000 - 0.1) < 0.02
    # the adds replay the held-out stream (vertices with their edges, in its proportion)
    share = {k: WRITE_MIX[cls] / sum(WRITE_MIX.values()) for k, cls in (
        ("addlink", sg.AddEdge), ("addnode", sg.AddVertex), ("deletelink", sg.DeleteEdge),
        ("updatelink", sg.UpdateEdge), ("updatenode", sg.UpdateFeatures),
        ("deletenode", sg.DeleteVertex))}
    share["adds"] = share.pop("addlink") + share.pop("addnode")
    kinds["adds"] = kinds["addlink"] + kinds["addnode"]
    assert max(abs(kinds[k] / writes - p) for k, p in share.items()) < 0.03
    read_expected = np.array(list(READ_MIX.values())) / sum(READ_MIX.values())
    assert np.abs(np.array([kinds[k] / reads for k in READ_MIX]) - read_expected).max() < 0.05
    assert [op.t for op in ops] == [round(i / 500.0, 6) for i in range(4000)]


def test_generated_writes_apply_in_order_and_queries_are_valid(mixed_trace):
    data = sg.datasets.synthetic("tiny", seed=0)
    snapshot, _ = sg.datasets.split_stream(data, 0.2, 0)
    graph = DynamicGraph.from_data(snapshot)
    ops = list(open_trace(mixed_trace).ops())
    graph.apply([decode_update(orjson.dumps(op.body)) for op in ops if op.op in WRITE_OPS])
    for op in ops:
        if op.op == QUERY_OP:
            request = sg.QueryRequest.model_validate(op.body)
            assert not graph.contains([v.id for v in request.vertices]).any()
        elif op.op in READ_OPS:
            assert isinstance(op.body, int)


def test_poisson_times_have_exponential_gaps(tmp_path):
    generate_trace(tmp_path / "p.jsonl", "tiny", 3000, arrivals="poisson", rate=200.0)
    gaps = np.diff([op.t for op in open_trace(tmp_path / "p.jsonl").ops()])
    assert (gaps >= 0).all()
    assert abs(gaps.mean() * 200.0 - 1) < 0.1
    assert abs(gaps.std() / gaps.mean() - 1) < 0.15  # constant spacing would give 0


def test_generate_refuses_fractions_beyond_one(tmp_path):
    with pytest.raises(ValueError, match="add up to at most 1"):
        generate_trace(tmp_path / "x.jsonl", "tiny", 10, read_fraction=0.8, query_fraction=0.3)


def test_csv_and_tsv_edge_events_are_traces(tmp_path):
    csv = tmp_path / "events.csv"
    csv.write_text("time,op,src,dst,weight\n# a comment\n100.5,add,1,2,0.5\n101,update,1,2,2\n"
                   "\n103.5,delete,1,2\n")
    trace = open_trace(csv)
    assert trace.header["ops"] == 3 and trace.header["rate"] == pytest.approx(1.0)
    assert list(trace.ops()) == [
        TraceOp(0.0, "addlink", {"op": "add_edge", "src": 1, "dst": 2, "weight": 0.5}),
        TraceOp(0.5, "updatelink", {"op": "update_edge", "src": 1, "dst": 2, "weight": 2.0}),
        TraceOp(3.0, "deletelink", {"op": "delete_edge", "src": 1, "dst": 2})]
    tsv = tmp_path / "events.tsv"
    tsv.write_text("0\tadd\t5\t6\n0.25\tADD\t6\t5\n")
    assert [op.body["src"] for op in open_trace(tsv).ops()] == [5, 6]


@pytest.mark.parametrize(("line", "problem"), [
    ("1,add,1", "expected time, op, src, dst"),
    ("soon,add,1,2", "time 'soon' is not a number"),
    ("nan,add,1,2", "not finite"),
    ("1,link,1,2", "op 'link' is not add, delete or update"),
    ("1,add,a,2", "src and dst must be integer"),
    ("1,update,1,2", "an update needs a weight"),
    ("1,add,1,2,heavy", "weight 'heavy' is not a number"),
    ("1,add,1,2,inf", "weight 'inf' is not finite"),
    ("0.5,add,1,2", "before the previous line's"),
])
def test_bad_csv_lines_are_named(tmp_path, line, problem):
    path = tmp_path / "bad.csv"
    path.write_text(f"time,op,src,dst,weight\n1,add,3,4\n{line}\n")
    with pytest.raises(TraceError, match=problem) as e:
        open_trace(path)
    assert f"{path}:3:" in str(e.value)


def test_bad_jsonl_traces_are_named(tmp_path):
    plain = tmp_path / "updates.jsonl"
    plain.write_text('{"op": "add_edge", "src": 1, "dst": 2}\n')
    with pytest.raises(TraceError, match=r"updates.jsonl:1: not a streamgnn trace"):
        open_trace(plain)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"streamgnn_trace": 1, "ops": 2, "rate": 10}\n{"t": 0, "op": "getnode", '
                   '"id": 1}\n{"t": 1, "op": "jump", "id": 1}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:3: unknown op 'jump'"):
        list(open_trace(bad).ops())
    with pytest.raises(TraceError, match="no such trace file"):
        open_trace(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------- open loop
class _Sink:
    """Records when each op arrived; writes take ``write_s`` (a slow system)."""

    def __init__(self, recorder: Recorder, write_s: float = 0.0) -> None:
        self.recorder, self.write_s = recorder, write_s
        self.early: list[float] = []

    def write(self, op, intended):
        self.early.append(intended - time.time())
        time.sleep(self.write_s)
        self.recorder.latency("write", time.time() - intended)

    read = query = write

    def outstanding(self):
        return {}


def _writes(n: int) -> list[TraceOp]:
    return [TraceOp(i / 1000, "addlink", {}) for i in range(n)]


def test_schedule_scales_trace_times_to_the_rate_or_spaces_evenly():
    assert Schedule(200.0, 100.0, "trace").offset(7, 1.0) == 0.5
    assert Schedule(200.0, 100.0, "constant").offset(7, 1.0) == 7 / 200
    recorder = Recorder(time.time())
    stats = send_open_loop(_writes(100), Schedule(1000.0, 1000.0, duration=0.0495),
                           _Sink(recorder), recorder)
    assert stats.sent == 50


def test_open_loop_never_sends_early():
    recorder = Recorder(time.time())
    sink = _Sink(recorder)
    stats = send_open_loop(_writes(40), Schedule(200.0, 1000.0), sink, recorder)
    assert stats.sent == 40 and max(sink.early) <= 0.0


def test_a_slow_system_shows_as_growing_latency_not_a_slower_sender():
    """Each write takes 10 ms while one is due every 1 ms: latencies from the intended
    times grow to about 1 s (a closed loop would report 10 ms each)."""
    recorder = Recorder(time.time())
    stats = send_open_loop(_writes(100), Schedule(1000.0, 1000.0), _Sink(recorder, 0.01),
                           recorder)
    write = recorder.histograms["write"]
    assert write.get_value_at_percentile(10) < write.get_max_value() / 3
    assert write.get_max_value() >= 0.89e6            # microseconds: the last op's wait
    assert stats.max_late_s >= 0.88
    report = build_report({"lag_limit_s": 0.5}, {}, Schedule(1000.0, 1000.0), stats, recorder,
                          {}, {}, time.time())
    assert not report["rate"]["held"]
    assert "the sender fell up to" in report["rate"]["not_held_because"][0]


def test_visibility_matches_offsets_in_either_order():
    recorder = Recorder(time.time())
    seen = Visibility(recorder)
    t = time.time()
    seen.produced(0, 10, t - 1.0)
    seen.produced(0, 11, t - 1.0)
    seen.produced(0, 12, t - 1.0)
    seen.published([(0, 11, 11)], t)      # batch [11, 11]: 10 was in a batch without changes
    seen.published([(0, 13, 14)], t + 0.5)
    seen.produced(0, 14, t - 1.0)         # acknowledged after its batch was seen
    seen.produced(0, 15, t)
    assert recorder.histograms["write-to-visible"].get_total_count() == 2
    assert recorder.counts["writes_without_label_change"] == 2  # 10 and 12
    assert seen.outstanding() == 1


def test_reads_that_cannot_connect_are_counted_errors():
    recorder = Recorder(time.time())
    reader = RestReader(f"http://127.0.0.1:{free_port()}", recorder, token="secret")
    for i in range(5):
        reader.read(TraceOp(0.0, "getnode", i), time.time())
    deadline = time.time() + 30
    while reader.outstanding() and time.time() < deadline:
        time.sleep(0.05)
    reader.close()
    assert recorder.errors == {"read:connection_refused": 5}
    with pytest.raises(ValueError, match="not an http"):
        RestReader("127.0.0.1:8080", recorder)


# ---------------------------------------------------------------- reports
def _cli(*args: str, cwd) -> str:
    out = subprocess.run([sys.executable, "-m", "streamgnn.cli", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_report_round_trip_rerenders_the_plots(tmp_path):
    recorder = Recorder(time.time() - 3)
    for i in range(300):
        recorder.latency("getnode", 0.001 * (1 + i % 50), at=recorder.start + i / 100)
        recorder.op_sent("getnode", recorder.start + i / 100)
    recorder.add("label_changes", recorder.start + 1.5, 7)
    recorder.error("read:http_404")
    stats = send_open_loop([], Schedule(100.0, 100.0), _Sink(recorder), recorder)
    report = build_report({"lag_limit_s": 1.0}, {"ops": 300}, Schedule(100.0, 100.0), stats,
                          recorder, {}, {}, time.time())
    written = write_report(tmp_path, report)
    assert sorted(p.name for p in written) == sorted([REPORT, *PLOTS])
    for name in PLOTS:
        (tmp_path / name).unlink()
    text = _cli("replay", "report", str(tmp_path), cwd=tmp_path)
    assert all((tmp_path / name).stat().st_size > 0 for name in PLOTS)
    assert "getnode" in text and "read:http_404 1" in text
    bad = subprocess.run([sys.executable, "-m", "streamgnn.cli", "replay", "report",
                          str(tmp_path / "nothing")], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert bad.returncode == 2 and "no report.json" in bad.stdout


# ---------------------------------------------------------------- start-up
def test_replay_run_modules_import_neither_torch_nor_the_graph_store():
    """What `replay run` loads (its runner, REST reader, Kafka side, report), in a fresh
    interpreter: none of torch, PyG, numba, mpi4py."""
    code = ("import sys, streamgnn.cli, streamgnn.replay.runner, streamgnn.stream.loadgen\n"
            "heavy = ('torch', 'torch_geometric', 'numba', 'mpi4py', 'streamgnn.graph')\n"
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------- end to end
def test_replay_run_against_broker_and_serve_end_to_end(tmp_path, broker, topics):
    """`replay generate` then `replay run` against the embedded broker and a real
    `streamgnn serve` with its REST API: every op sent, every write acknowledged, writes
    seen visible through label changes, reads and queries answered, the report written."""
    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", broker.bootstrap, "--topic-prefix", prefix)
    _cli("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "2", "--hidden",
         "8", "--out", "m.pt", cwd=tmp_path)
    _cli("replay", "generate", "--dataset", "tiny", "--ops", "300", "--read-fraction", "0.2",
         "--query-fraction", "0.1", "--arrivals", "poisson", "--rate", "150", "-o",
         "t.jsonl", cwd=tmp_path)
    ops = collections.Counter(op.op for op in open_trace(tmp_path / "t.jsonl").ops())
    queries, reads = ops[QUERY_OP], sum(ops[k] for k in READ_OPS)
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "streamgnn.cli", "serve", "-c", "m.pt", "--dataset", "tiny",
         "--bs", "50", "--until-idle", "60", "--state-dir", "state", "--http",
         f"127.0.0.1:{port}", *common], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in serve.stdout:  # serving once it says so
            if line.startswith("serving"):
                break
        threading.Thread(target=serve.stdout.read, daemon=True).start()
        text = _cli("replay", "run", "t.jsonl", "--rate", "150", "-o", "rep",
                    "--http", f"http://127.0.0.1:{port}", *common, cwd=tmp_path)
    finally:
        serve.terminate()
        serve.wait(60)
    report = orjson.loads((tmp_path / "rep" / REPORT).read_bytes())
    counts, latency = report["counts"], report["latency_ms"]
    assert counts["sent"] == 300 and report["rate"]["offered_ops_per_s"] == 150
    writes = 300 - queries - reads
    assert sum(latency[k]["count"] for k in WRITE_OPS if k in latency) == writes
    assert not [k for k in report["errors"] if k.startswith("write")]
    assert latency["query"]["count"] + sum(
        n for k, n in report["errors"].items() if k.startswith("query")) == queries
    assert latency["query"]["count"] > 0 and counts["label_changes"] > 0
    assert sum(latency[k]["count"] for k in READ_OPS if k in latency) + sum(
        n for k, n in report["errors"].items() if k.startswith("read")) == reads
    assert latency["getlinklist"]["count"] > 0
    assert counts["writes_visible"] + counts.get("writes_without_label_change", 0) + counts[
        "writes_unresolved"] == writes
    assert counts["writes_visible"] > 0
    assert {"p50", "p90", "p99", "p99.9", "max"} <= set(latency["write-to-visible"])
    assert "write-to-visible" in text and "report: rep/report.json" in text
    assert all((tmp_path / "rep" / name).exists() for name in PLOTS)
