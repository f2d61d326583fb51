"""Torture: `streamgnn serve` processes killed with kill -9, SIGINT and SIGTERM at random
points of a paced stream, each followed by a restart; the last run drains the topic. The
final state must equal a clean run's (same graph; embeddings within the exactness
contract), nothing may be lost or applied twice (no dead letter from a valid stream), and
every label-change message published more than once must be identical to its first copy.
The clean run reads JSON arrays, the interrupted one columns messages.

`make test` runs a short version (3 interruptions); `make torture` a long one
(STREAMGNN_TORTURE_KILLS, STREAMGNN_TORTURE_BATCHES)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import numpy as np

import streamgnn as sg
from streamgnn.router import Checkpoints
from streamgnn.stream import LabelChanges, Topics, encode
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import UpdateSender, ensure_topics, follow
from tests.conftest import pyg_layers
from tests.test_stream import linkbench_stream, messages, tiny_setup

KILLS = int(os.environ.get("STREAMGNN_TORTURE_KILLS", "3"))
BATCHES = int(os.environ.get("STREAMGNN_TORTURE_BATCHES", "30"))
SIGNALS = (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)


def send(kafka: KafkaConfig, topic: str, events, seconds: float = 0.0,
         columns: bool = False) -> None:
    """All of ``events``, spread over ``seconds``."""
    out = UpdateSender(kafka, topic, per_message=7, columns=columns)
    for i, u in enumerate(events):
        out.send(encode(u))
        if seconds and i % 50 == 49:
            out.idle(seconds * 50 / len(events))
    out.close()


def _serving(log, victim: subprocess.Popen, seconds: float = 300.0) -> None:
    """Wait until ``victim`` says it serves (in ``log``: past its start-up, the kernels'
    warm-up included) or has exited."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and victim.poll() is None:
        if b"serving " in log.read_bytes():
            return
        time.sleep(0.1)
    assert victim.poll() is not None, f"serve did not start within {seconds} s"


def test_kill_9_sigint_and_sigterm_at_random_points_lose_nothing(broker, kafka, tmp_path):
    _, snapshot, held_out, model = tiny_setup()
    events = linkbench_stream(snapshot, held_out, BATCHES)
    model.save(tmp_path / "model.pt")
    clean, torn = (Topics.prefixed(f"{k}{uuid.uuid4().hex[:6]}-") for k in "ct")
    for t in (clean, torn):
        ensure_topics(kafka, t.all())

    def serve(state, topics, *extra):
        return [sys.executable, "-m", "streamgnn.cli", "serve", "-c", str(tmp_path / "model.pt"),
                "--dataset", "tiny", "--state-dir", str(state), "--bs", "10",
                "--checkpoint-every", "20", "-b", broker.bootstrap,
                "--topic-prefix", topics.updates.removesuffix("graph-updates"), "--http", "off",
                *extra]

    send(kafka, clean.updates, events)
    subprocess.run(serve(tmp_path / "clean", clean, "--until-idle", "2"), check=True,
                   capture_output=True, timeout=300)

    producer = threading.Thread(target=send, args=(kafka, torn.updates, events,
                                                   4.0 * KILLS, True))
    producer.start()
    rng = random.Random(KILLS)
    codes: Counter = Counter()
    for k in range(KILLS):
        log = tmp_path / f"victim-{k}.log"  # (a pipe nobody reads would block its writes)
        with open(log, "wb") as err:
            victim = subprocess.Popen(serve(tmp_path / "torn", torn), stdout=err,
                                      stderr=subprocess.STDOUT,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1",
                                           "PYTHONFAULTHANDLER": "1"})
        _serving(log, victim)  # then a random point of the stream
        time.sleep(rng.uniform(0.2, 3.0))
        sig = SIGNALS[k % 3]
        victim.send_signal(sig)
        try:
            code = victim.wait(timeout=120)
        except subprocess.TimeoutExpired:  # where it hangs: every thread's stack
            victim.send_signal(signal.SIGABRT)  # (faulthandler writes them to the log)
            try:
                victim.wait(timeout=10)
            except subprocess.TimeoutExpired:
                victim.kill()
                victim.wait()
            raise AssertionError(f"{sig.name} did not stop serve within 120 s; its output "
                                 f"ends:\n{log.read_text(errors='replace')[-6000:]}") from None
        codes[(sig.name, code)] += 1
        assert sig == signal.SIGKILL or code in (0, -sig, 130, 1), log.read_text()[-3000:]
    producer.join()
    subprocess.run(serve(tmp_path / "torn", torn, "--until-idle", "2"), check=True,
                   capture_output=True, timeout=300)
    print("interruptions (signal, exit code):", dict(codes))

    ends = [Checkpoints(tmp_path / d).load() for d in ("clean", "torn")]
    sent = sum(1 for _ in follow(kafka, torn.updates, True, idle_s=1.0))
    assert ends[1].meta["positions"] == {"0": sent}  # every record consumed
    engines = [sg.Engine.read(model.model(), e.folder) for e in ends]
    ids = engines[0].vertex_ids()
    assert np.array_equal(np.sort(engines[1].vertex_ids()), np.sort(ids))
    edges = [sorted(zip(*(a.tolist() for a in e.edges()))) for e in engines]
    assert edges[0] == edges[1]  # nothing lost, nothing applied twice
    current = engines[1].to_data()
    refs, torn_ids = pyg_layers(model.model(), current), current.ids
    for layer in range(engines[0].num_layers + 1):
        a, b = engines[0].lookup(ids, layer), engines[1].lookup(ids, layer)
        assert np.abs(a - b).max() < 1e-4
        assert np.abs(engines[1].lookup(torn_ids, layer) - refs[layer].numpy()).max() < 1e-4
    assert messages(kafka, torn.dead_letters) == []  # a valid stream: none lost or repeated

    first: dict[str, bytes] = {}
    repeats = 0
    last: dict[int, int] = {}
    for record in follow(kafka, torn.labels, True, idle_s=1.0):
        m = LabelChanges.model_validate_json(record.value)
        if m.event_id in first:
            repeats += 1
            assert first[m.event_id] == record.value, m.event_id  # a repeat is the same
            continue
        first[m.event_id] = record.value
        last.update((c.vertex, c.new) for c in m.changes)
    print(f"{len(first)} label-change messages, {repeats} repeated")
    labelled = np.fromiter(last, np.int64)
    alive = engines[1].contains(labelled)  # deletions publish no label change
    assert (engines[1].label(labelled[alive])
            == np.fromiter(last.values(), np.int64)[alive]).all()
