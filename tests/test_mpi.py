"""The engine with its shards on MPI ranks (mpiexec from the mpich wheel): rank 0 holds the
whole graph and routes, each other rank runs one shard, ghost rows go point to point. The
answers must equal PyG's forward pass and, bit for bit, the same partitions in one
process; a failing worker must stop the whole job, never hang it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
    "mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec (pip install mpich) missing")


def mpiexec(ranks: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("workers", [2, 3])
def test_mpi_workers_and_their_queries_match_pyg_and_one_process_bit_for_bit(tmp_path, workers):
    out = tmp_path / "result.json"
    run = mpiexec(workers + 1, "-m", "tests.mpi_program", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    for name, r in json.loads(out.read_text()).items():
        assert r["partitions"] == workers, name
        assert r["pyg"] < 1e-9, name
        assert r["alone"] == 0.0 and r["restored"] == 0.0, name
        assert r["query_pyg"] < 1e-9 and r["query_alone"] == 0.0, name
        assert r["rejected"] == 10, name  # per batch: one the directory, one a partition
        assert all(s["halo"] > 0 and s["sent_bytes"] for s in r["stats"]), name


def test_buffers_taken_in_arrival_order_give_the_one_process_result_bit_for_bit(tmp_path):
    """Each worker takes the ghost rows it is sent as they arrive (`mpi.Arrivals`); here
    every one comes last to first, so the kernels take them out of the ranks' order (the
    existing test at 3 workers meets whatever order the run brings): the answers are still
    the one-process ones, bit for bit."""
    out = tmp_path / "result.json"
    script = tmp_path / "backwards.py"
    script.write_text(
        "import runpy\n"
        "from pathlib import Path\n"
        "from mpi4py import MPI\n"
        "from streamgnn.workers import mpi\n"
        "out_of_order = 0\n"
        "def backwards(self):\n"
        "    global out_of_order\n"
        "    out_of_order += sum(n > 0 for n in self.sizes()) > 1\n"
        "    for q in reversed(range(len(self))):\n"
        "        yield q, self[q]\n"
        "    self.finish()\n"
        "mpi.Arrivals.as_they_arrive = backwards\n"
        "runpy.run_module('tests.mpi_program', run_name='__main__')\n"
        f"Path('{out}.' + str(MPI.COMM_WORLD.Get_rank())).write_text(str(out_of_order))\n")
    run = mpiexec(4, str(script), str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert sum(int((tmp_path / f"result.json.{r}").read_text()) for r in (1, 2, 3)) > 0
    for name, r in json.loads(out.read_text()).items():
        assert r["alone"] == 0.0 and r["restored"] == 0.0, name
        assert r["query_alone"] == 0.0, name


def test_a_service_with_workers_starts_batches_early_and_publishes_as_one_process(tmp_path):
    """A service on rank 0 with two worker ranks drains a backlog, starting each full batch
    before the one in flight is finished (counted: `Stats.started_early`, never in one
    process); its label changes, dead letters, embeddings and owners (the high in-degree
    set refreshed as it goes) equal the same backlog served in one process."""
    out = tmp_path / "result.json"
    run = mpiexec(3, "-m", "tests.mpi_service", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["early"] > 0 and r["early_alone"] == 0 and r["letters"] > 0
    assert r["same_outputs"] and r["same_owners"] and r["rows"] == 0.0


def test_a_failing_worker_stops_the_job_and_names_its_rank(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import numpy as np, torch\n"
        "from mpi4py import MPI\n"
        "import streamgnn as sg\n"
        "from streamgnn.workers import Engine\n"
        "from streamgnn.workers import shard as shard_module\n"
        "from streamgnn.workers.mpi import spmd\n"
        "from tests.archs import ARCHS, F_IN\n"
        "from tests.conftest import random_graph\n"
        "if MPI.COMM_WORLD.Get_rank() == 2:\n"
        "    def boom(self, hop):\n"
        "        raise RuntimeError('injected failure')\n"
        "    shard_module.Shard._step = boom\n"
        "data = random_graph(np.random.default_rng(0), n=100, m=400, d=F_IN)\n"
        "model = ARCHS['pyg-sage-mean'](2).eval()\n"
        "def main(workers):\n"
        "    engine = Engine.from_pyg(model, data, partitions=2, workers=workers)\n"
        "    engine.apply([sg.UpdateFeatures(id=int(data.ids[0]), x=[1.0] * F_IN)])\n"
        "spmd(model, main)\n")
    run = mpiexec(3, str(script), timeout=120)
    assert run.returncode != 0
    assert "worker rank 2 failed" in run.stderr and "injected failure" in run.stderr


def test_the_exchange_delivers_every_buffer_of_every_size_to_its_rank(tmp_path):
    """`mpi.alltoallv` (each buffer sent point to point as it lies): empty buffers, a
    rank's buffer to itself, and buffers large enough to go by rendezvous arrive whole and
    in their places, read by position and as they arrive (each rank once), in rounds on
    the same communicator."""
    script = tmp_path / "exchange.py"
    script.write_text(
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "from streamgnn.workers.mpi import alltoallv\n"
        "comm = MPI.COMM_WORLD\n"
        "me, n = comm.Get_rank(), comm.Get_size()\n"
        "def buffer(src, dst, round_):\n"
        "    size = [0, 1, 3_000_017][(src + 2 * dst + round_) % 3]\n"
        "    return (np.arange(size) * (src + 1) + 7 * dst + round_).astype(np.uint8)\n"
        "for round_ in range(4):\n"
        "    with alltoallv(comm, [buffer(me, q, round_) for q in range(n)]) as got:\n"
        "        assert len(got) == n and got.sizes() == [len(buffer(q, me, round_))\n"
        "                                                 for q in range(n)]\n"
        "        arrived = (got.as_they_arrive() if round_ % 2 else enumerate(got))\n"
        "        qs = [q for q, b in arrived if np.array_equal(b, buffer(q, me, round_))]\n"
        "        assert sorted(qs) == list(range(n)), (me, qs, round_)\n")
    run = mpiexec(3, str(script), timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


# ---------------------------------------------------------------- serve --workers
def serve_command(tmp_path, broker, topics, state, *extra) -> list[str]:
    return [sys.executable, "-m", "streamgnn.cli", "serve", "-c", str(tmp_path / "model.pt"),
            "--dataset", "tiny", "--state-dir", str(state), "--bs", "20",
            "--checkpoint-every", "10", "-b", broker.bootstrap, "--workers", "2",
            "--topic-prefix", topics.updates.removesuffix("graph-updates"), "--http", "off",
            *extra]


def rank_pids(state) -> dict[int, int]:
    """pid of each rank of the job serving ``state`` (from /proc: PMI_RANK in its env)."""
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if str(state).encode() not in cmdline or b"mpiexec" in cmdline:
                continue
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(
                b"\0") if b"=" in kv)
        except (OSError, ValueError):
            continue
        if b"PMI_RANK" in env:
            out[int(env[b"PMI_RANK"])] = int(proc.name)
    return out


def final_engine(state, model):
    from streamgnn.router import Checkpoints
    from streamgnn.workers import Engine

    saved = Checkpoints(state).load()
    return saved, Engine.read(model.model(), saved.folder)


def test_serve_with_workers_survives_a_killed_worker_and_a_killed_router(broker, kafka,
                                                                         tmp_path):
    """`serve --workers 2` (rank 0 + 2 worker ranks under mpiexec) on a paced LinkBench
    stream; kill -9 of worker rank 2, later of rank 0: the job stops, the supervisor
    restarts it from its last checkpoint; the final state equals a one-process run's,
    nothing is lost or applied twice, and repeated label-change messages are identical."""
    import signal
    import threading
    import time
    import uuid

    from streamgnn.stream import Topics
    from streamgnn.stream.kafka_tools import ensure_topics
    from tests.test_stream import linkbench_stream, tiny_setup
    from tests.test_torture import send

    _, snapshot, held_out, model = tiny_setup()
    events = linkbench_stream(snapshot, held_out, 30)
    model.save(tmp_path / "model.pt")
    topics = Topics.prefixed(f"w{uuid.uuid4().hex[:6]}-")
    ensure_topics(kafka, topics.all())
    producer = threading.Thread(target=send, args=(kafka, topics.updates, events,
                                                   20.0))
    producer.start()
    state = tmp_path / "state"
    job = subprocess.Popen(serve_command(tmp_path, broker, topics, state, "--until-idle", "4"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    old_job: set[int] = set()
    for victim in (2, 0):  # a worker, then the router
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a rank of the running job, registered
            pid = rank_pids(state).get(victim)
            if (pid is not None and pid not in old_job
                    and (state / "ranks" / f"{pid}.rank").exists()):
                break
            time.sleep(0.2)
        time.sleep(6)  # bootstrap done, batches flowing
        old_job = set(rank_pids(state).values())
        os.kill(pid, signal.SIGKILL)
    producer.join()
    log = job.communicate(timeout=300)[0]
    assert job.returncode == 0, log[-4000:]
    assert log.count("restart") >= 2, log[-4000:]
    assert "rank 2 (pid" in log and "rank 0 (pid" in log, log[-4000:]  # named, in order


    assert_served_exactly(state, model, kafka, topics, snapshot, events)


def assert_served_exactly(state, model, kafka, topics, snapshot, events) -> None:
    """The last checkpoint in ``state`` consumed the whole updates topic, holds two
    partitions and the graph after ``events``, with every layer equal to PyG's; nothing
    was dead-lettered, and a label change published twice is the same both times."""
    import numpy as np

    from streamgnn.stream import LabelChanges
    from streamgnn.stream.kafka_tools import follow
    from tests.conftest import pyg_layers
    from tests.test_stream import messages

    saved, engine = final_engine(state, model)
    assert saved.meta["positions"] == {"0": len(list(follow(
        kafka, topics.updates, True, idle_s=1.0)))}
    assert engine.num_partitions == 2
    current = engine.to_data()
    expected = sg_graph_after(snapshot, events)
    assert np.array_equal(np.sort(current.ids), np.sort(expected.ids))
    assert current.num_edges == expected.num_edges
    for layer, ref in enumerate(pyg_layers(model.model(), current)):
        assert np.abs(engine.lookup(current.ids, layer) - ref.numpy()).max() < 1e-4
    assert messages(kafka, topics.dead_letters) == []
    first: dict[str, bytes] = {}
    for record in follow(kafka, topics.labels, True, idle_s=1.0):
        event_id = LabelChanges.model_validate_json(record.value).event_id
        assert first.setdefault(event_id, record.value) == record.value, event_id


def sg_graph_after(snapshot, events):
    import streamgnn as sg

    graph = sg.DynamicGraph.from_data(snapshot)
    graph.apply(events)
    return graph.to_data()


def test_serve_with_workers_stops_at_once_on_a_configuration_error(broker, tmp_path):
    """A bad setting (an unknown placement) is named and not retried; nothing is written."""
    import uuid

    from streamgnn.stream import Topics
    from tests.test_stream import tiny_setup

    tiny_setup()[3].save(tmp_path / "model.pt")
    topics = Topics.prefixed(f"c{uuid.uuid4().hex[:6]}-")
    command = serve_command(tmp_path, broker, topics, tmp_path / "state", "--placement",
                            "bogus", "--until-idle", "1")
    command[command.index("--workers") + 1] = "1"
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    assert "unknown placement 'bogus'" in run.stdout + run.stderr
    assert "not restarting" in run.stdout and "restart 1 of" not in run.stdout
    assert not list((tmp_path / "state").glob("gen-*/manifest.json"))


def test_serve_with_workers_answers_rest_reads_with_rows_from_the_ranks(broker, kafka,
                                                                      tmp_path):
    """`serve --workers 2 --http`: the router holds no rows; a vertex read, a lookup and a
    query over REST fetch them from the worker ranks and equal a one-process engine."""
    import signal
    import uuid

    import httpx
    import numpy as np

    import streamgnn as sg
    from streamgnn.stream import Topics
    from streamgnn.stream.kafka_tools import ensure_topics
    from tests.kafka_fixtures import free_port, wait_until_ready
    from tests.test_stream import tiny_setup

    _, snapshot, _, model = tiny_setup()
    model.save(tmp_path / "model.pt")
    topics = Topics.prefixed(f"h{uuid.uuid4().hex[:6]}-")
    ensure_topics(kafka, topics.all())
    port = free_port()
    job = subprocess.Popen(serve_command(tmp_path, broker, topics, tmp_path / "state",
                                         "--http", f"127.0.0.1:{port}"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    local = sg.Engine.from_pyg(model.model(), snapshot)
    ids = [int(i) for i in snapshot.ids[[0, 5, 9]]]
    f = snapshot.num_features
    query = {"vertices": [{"id": -1, "x": [0.5] * f}], "embeddings": True,
             "edges": [{"src": -1, "dst": ids[0]}, {"src": ids[1], "dst": -1}]}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until_ready(http, job, 240)
            one = http.get(f"/v1/vertices/{ids[0]}", params={"layer": 1}).json()
            many = http.post("/v1/vertices/lookup", json={"ids": ids}).json()
            answer = http.post("/v1/queries", json=query).json()
    finally:
        job.send_signal(signal.SIGTERM)
        log = job.communicate(timeout=120)[0]
    assert job.returncode == 0, log[-4000:]
    assert np.abs(np.array(one["embedding"]) - local.lookup([ids[0]], 1)[0]).max() < 1e-5
    assert np.abs(np.array(many["embeddings"]) - local.lookup(ids)).max() < 1e-5
    assert many["labels"] == local.label(ids).tolist()
    want = local.query(sg.QueryRequest.model_validate(query))
    assert np.abs(np.array(answer["embeddings"]) - want.embeddings).max() < 1e-5


def mpmd_serve(tmp_path, broker, topics, router_state, worker_state
               ) -> subprocess.CompletedProcess:
    """`serve` as an MPI job of rank 0 with ``--state-dir router_state`` and two worker
    ranks with ``worker_state`` (mpiexec's MPMD form: an environment per rank group), as
    on hosts that share no filesystem; until the topic is idle for 3 s."""
    args = ["-m", "streamgnn.cli", "serve", "-c", str(tmp_path / "model.pt"), "--dataset",
            "tiny", "--bs", "20", "--checkpoint-every", "5", "-b", broker.bootstrap,
            "--topic-prefix", topics.updates.removesuffix("graph-updates"), "--http", "off",
            "--until-idle", "3"]
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "PYTHONPATH": str(ROOT)}
    env.pop("STREAMGNN_STATE_DIR", None)
    return subprocess.run(
        [MPIEXEC, "-n", "1", "-env", "STREAMGNN_STATE_DIR", str(router_state),
         sys.executable, *args, ":", "-n", "2", "-env", "STREAMGNN_STATE_DIR",
         str(worker_state), sys.executable, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_ranks_without_a_shared_state_directory_resume_and_fall_back(broker, kafka,
                                                                    tmp_path):
    """Rank 0 serves with --state-dir A, its two workers with B, so no rank sees another's
    files: A holds manifests, engine and model, B the workers' shard files, generation for
    generation. A restart resumes from the checkpoint (not a new state); a byte flipped in
    a worker's shard file in B makes the next restart move that generation aside in A and
    B and resume from the one before, replaying the journal; the state ends exact, with
    repeated label changes identical; with no generation left that verifies, it refuses."""
    import shutil
    import uuid

    from streamgnn.router import Checkpoints
    from streamgnn.stream import Topics
    from streamgnn.stream.kafka_tools import ensure_topics
    from tests.test_faults_state import flip
    from tests.test_stream import linkbench_stream, tiny_setup
    from tests.test_torture import send

    _, snapshot, held_out, model = tiny_setup()
    events = linkbench_stream(snapshot, held_out, 12)
    model.save(tmp_path / "model.pt")
    topics = Topics.prefixed(f"m{uuid.uuid4().hex[:6]}-")
    ensure_topics(kafka, topics.all())
    a, b = Checkpoints(tmp_path / "A"), Checkpoints(tmp_path / "B")

    def serve(part) -> tuple[str, dict]:
        send(kafka, topics.updates, part)
        run = mpmd_serve(tmp_path, broker, topics, a.directory, b.directory)
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-4000:]
        return log, manifest(a.generations()[-1])

    def manifest(generation) -> dict:
        return json.loads((a.folder(generation) / "manifest.json").read_text())["state"]

    third = len(events) // 3
    log, first = serve(events[:third])
    assert len(a.generations()) == 2 and a.generations() == b.generations(), log[-4000:]
    for g in a.generations():
        assert {f.name for f in a.folder(g).iterdir()} == {"manifest.json", "engine.npz",
                                                          "model.npz"}
        assert {f.name for f in b.folder(g).iterdir()} == {"shard0.npz", "shard1.npz"}
    log, second = serve(events[third:2 * third])  # resumes: the same state, batches on
    assert f"from batch {first['batch_seq'] + 1})" in log, log[-4000:]
    assert second["epoch"] == first["epoch"] and second["batch_seq"] > first["batch_seq"]
    newest, previous = a.generations()[-1], manifest(a.generations()[0])
    flip(b.folder(newest) / "shard1.npz")
    log, last = serve(events[2 * third:])
    assert "shard1.npz is missing or does not match" in log and "moved aside" in log, log
    assert f"from batch {previous['batch_seq'] + 1})" in log, log[-4000:]
    assert a.corrupt() == b.corrupt() == [newest], log[-4000:]
    assert last["epoch"] == first["epoch"]

    merged = tmp_path / "merged" / a.folder(a.generations()[-1]).name  # as if one folder
    shutil.copytree(a.folder(a.generations()[-1]), merged)
    for f in b.folder(a.generations()[-1]).iterdir():
        shutil.copy(f, merged)
    assert_served_exactly(merged.parent, model, kafka, topics, snapshot, events)

    for g in b.generations():
        flip(b.folder(g) / "shard0.npz")
    run = mpmd_serve(tmp_path, broker, topics, a.directory, b.directory)
    log = run.stdout + run.stderr
    assert run.returncode == 3, log[-4000:]
    # (the job's abort may cut rank 0's output short: its reason is in this file too)
    error = "".join(f.read_text() for f in (a.directory / "ranks").glob("*.error"))
    assert f"no checkpoint in {a.directory} verifies" in error, log[-4000:]
    assert a.generations() == b.generations() == [], log[-4000:]


def test_message_offsets_past_two_gib_do_not_wrap():
    """Payloads to several ranks add up past 2 GiB on products-like: the offsets of the
    later ones must not wrap as 32-bit integers did (mpi4py then uses MPI-4's large-count
    calls; a 2.2 GB Scatterv/Gatherv was checked by hand under mpiexec)."""
    import numpy as np

    from streamgnn.workers.mpi import _displacements

    counts = np.array([0, 2**31 - 1, 2**31 - 1, 5], np.int64)
    assert _displacements(counts).tolist() == [0, 0, 2**31 - 1, 2**32 - 2]


_DTYPES = st.sampled_from(["<f4", "<f8", "<i8", "<i4", "<u8", "|b1", "|u1", "<i2"])


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.tuples(
    _DTYPES, st.lists(st.integers(0, 5), max_size=3), st.booleans()), max_size=6),
       st.integers(0, 2**32))
def test_a_message_gives_back_every_array_as_a_writable_aligned_view(spec, seed):
    """Commands between ranks travel as `to_bytes` messages: every array comes back with
    its dtype, shape (0-d and empty included) and values, non-contiguous ones too, as a
    view into the message (no copy), aligned and writable; arrays of Python objects are
    refused on both ends."""
    import numpy as np

    from streamgnn.npz import from_bytes, to_bytes

    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (dtype, shape, strided) in spec.items():
        a = (rng.random(shape) * 100).astype(dtype)
        arrays[name] = a.T if strided and a.ndim > 1 else a
    message = to_bytes(arrays)
    back = from_bytes(message)
    assert list(back) == list(arrays)
    for name, a in arrays.items():
        got = back[name]
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
        assert got.flags.writeable and got.ctypes.data % 64 == message.ctypes.data % 64
        assert got.size == 0 or np.shares_memory(got, message)
    with pytest.raises(TypeError, match=r"'o'.*Python objects"):
        to_bytes({"o": np.array([object()])})
    one = to_bytes({"o": np.zeros(1, np.int64)})
    with pytest.raises(TypeError, match="Python objects"):
        from_bytes(_forged(one, b'"<i8"', b'"|O8"'))
    with pytest.raises(TypeError, match="fields"):
        to_bytes({"r": np.zeros(2, [("a", "<i4"), ("b", "<f8")])})
    for at in (b'"at": -64', b'"at": 4096'):  # before the arrays, past the message's end
        with pytest.raises(ValueError, match="outside the message"):
            from_bytes(_forged(one, b'"at": 0', at))


def _forged(message, old: bytes, new: bytes):
    """``message`` with ``old`` replaced by ``new`` in its layout."""
    import numpy as np

    n = int.from_bytes(message[:8].tobytes(), "little")
    head = message[8:8 + n].tobytes().replace(old, new)
    return np.concatenate([np.frombuffer(len(head).to_bytes(8, "little"), np.uint8),
                           np.frombuffer(head, np.uint8), message[8 + n:]])


def test_workers_on_a_host_with_several_gpus_take_one_each():
    """`worker_device`: ``cuda`` on a host with several GPUs becomes the worker's place
    among the workers on its host, modulo the GPUs (two faked: there is no GPU here);
    ``cpu`` and a device with an index stay as given."""
    program = ("import torch; from mpi4py import MPI; "
               "from streamgnn.workers.mpi import worker_device; "
               "torch.cuda.device_count = lambda: 2; w = MPI.COMM_WORLD; "
               "line = ' '.join([str(w.Get_rank())] + [str(worker_device(d, w)) "
               "for d in ('cuda', 'cpu', 'cuda:1')]); lines = w.gather(line); "
               "w.Get_rank() or print(*lines, sep='\\n', flush=True)")
    done = mpiexec(3, "-c", program)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        "0 cuda:0 cpu cuda:1", "1 cuda:1 cpu cuda:1", "2 cuda:0 cpu cuda:1"]
