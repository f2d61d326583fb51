"""Fault injection: checkpointed offsets the broker no longer holds. A restarted embedded
broker starts with empty topics, as a recreated topic does on Apache Kafka: `serve`
resuming on its old --state-dir must refuse, naming the topic, the partition and the saved
and available offsets, instead of consuming nothing and exiting 0; --offset-reset
(STREAMGNN_OFFSET_RESET) says where to start instead. Through real brokers and the real
command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from streamgnn.stream import Topics
from streamgnn.stream.broker import EmbeddedBroker
from streamgnn.stream.kafka import KafkaTransport, OffsetsOutOfRange, producer
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import ensure_topics
from tests.kafka_fixtures import free_port

CONSUMED = re.compile(r"events consumed / applied\W+([\d,]+) / ([\d,]+)")


@pytest.fixture
def own_broker(tmp_path) -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, to restart."""
    b = EmbeddedBroker(tmp_path / "broker", port=free_port())
    b.start()
    yield b
    b.stop()


def streamgnn(*args: str, cwd, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamgnn.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env=os.environ | (env or {}))


def consumed(out: subprocess.CompletedProcess) -> int:
    """The events `serve` reports consumed (asserting it exited 0)."""
    assert out.returncode == 0, out.stdout + out.stderr
    return int(CONSUMED.search(out.stdout).group(1).replace(",", ""))


def test_serve_on_a_restarted_broker_refuses_to_resume_instead_of_consuming_nothing(
        tmp_path, own_broker):
    common = ("-b", own_broker.bootstrap)
    serve = ("serve", "-c", "m.pt", "--dataset", "tiny", "--bs", "50", "--until-idle", "2",
             "--state-dir", "state", "--http", "off", *common)
    assert streamgnn("train", "--dataset", "tiny", "--model", "sage-mean", "--epochs", "1",
                     "--hidden", "8", "--out", "m.pt", cwd=tmp_path).returncode == 0
    assert streamgnn("datasets", "holdout", "tiny", "-o", "u.jsonl",
                     cwd=tmp_path).returncode == 0
    lines = (tmp_path / "u.jsonl").read_text().splitlines()
    (tmp_path / "first.jsonl").write_text("\n".join(lines[:300]) + "\n")  # 12 messages
    (tmp_path / "then.jsonl").write_text("\n".join(lines[300:350]) + "\n")  # 2 messages
    assert streamgnn("produce", "first.jsonl", "--per-message", "25", *common,
                     cwd=tmp_path).returncode == 0
    assert consumed(streamgnn(*serve, cwd=tmp_path)) == 300

    own_broker.stop()
    own_broker.start()  # its topics start empty: offsets 0 and 1 after the next produce
    assert streamgnn("produce", "then.jsonl", "--per-message", "25", *common,
                     cwd=tmp_path).returncode == 0

    refused = streamgnn(*serve, cwd=tmp_path)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2, said
    assert ("the saved offsets of topic graph-updates are outside what the broker holds: "
            "partition 0 at offset 12, past its end (it holds offsets 0 to 1)") in said
    assert "--offset-reset earliest" in said and "Traceback" not in said

    resumed = streamgnn(*serve, cwd=tmp_path, env={"STREAMGNN_OFFSET_RESET": "earliest"})
    assert consumed(resumed) == 50
    assert "partition 0 at offset 12, past its end" in resumed.stderr  # the warning


@pytest.fixture
def three_records(kafka) -> str:
    """A fresh one-partition topic holding offsets 0 to 2."""
    topic = Topics.prefixed(f"t{time.monotonic_ns()}-").updates
    ensure_topics(kafka, [topic])
    sender = producer(kafka)
    for i in range(3):
        sender.send(topic, value=b"%d" % i).get(10)
    sender.close()
    return topic


@pytest.mark.parametrize(("reset", "values"), [("earliest", [b"0", b"1", b"2", b"3"]),
                                               ("latest", [b"3"])])
def test_offset_reset_starts_past_the_end_at_the_oldest_record_or_the_next(
        kafka, three_records, reset, values):
    transport = KafkaTransport(kafka, three_records, reset=reset)
    try:
        with pytest.warns(UserWarning, match=r"partition 0 at offset 7, past its end "
                          r"\(it holds offsets 0 to 2\); resuming from the " + reset):
            transport.seek({0: 7})
        transport.publish(three_records, None, b"3", partition=0)
        transport.flush()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(values) and time.monotonic() < deadline:
            got += transport.poll(10, 0.2)
        assert [r.value for r in got] == values
        assert transport.positions() == {0: 4}
    finally:
        transport.close()


@pytest.mark.parametrize("saved", [0, 2, 3])
def test_a_saved_offset_within_the_partition_or_at_its_end_resumes_there(kafka,
                                                                          three_records,
                                                                          saved):
    transport = KafkaTransport(kafka, three_records)
    try:
        transport.seek({0: saved})
        assert transport.positions() == {0: saved}
    finally:
        transport.close()


def test_a_refusal_names_each_partition_and_what_it_holds():
    error = OffsetsOutOfRange("graph-updates", {1: (40, 100, 250), 0: (5, 0, 0)},
                              "saved offsets")
    assert error.message == (
        "the saved offsets of topic graph-updates are outside what the broker holds: "
        "partition 0 at offset 5, past its end (it holds no records; the next is offset "
        "0); partition 1 at offset 40, before its start (it holds offsets 100 to 249)")
    assert "--offset-reset earliest" in error.hint and "--state-dir" in error.hint


def test_a_broker_restarted_under_a_running_transport_stops_it(own_broker):
    kafka = KafkaConfig(own_broker.bootstrap)
    ensure_topics(kafka, ["graph-updates"])
    sender = producer(kafka)
    for i in range(10):
        sender.send("graph-updates", value=b"%d" % i).get(10)
    sender.close()
    transport = KafkaTransport(kafka, "graph-updates")
    try:
        got = []
        while len(got) < 10:
            got += transport.poll(10, 1)
        own_broker.stop()
        own_broker.start()
        ensure_topics(kafka, ["graph-updates"])
        deadline = time.monotonic() + 30
        with pytest.raises(OffsetsOutOfRange, match=r"the offsets being consumed of topic "
                           r"graph-updates are outside what the broker holds: partition 0 "
                           r"at offset 10, past its end \(it holds no records; the next is "
                           r"offset 0\)"):
            while time.monotonic() < deadline:
                assert transport.poll(10, 0.2) == []
    finally:
        transport.close()


def test_a_journal_of_records_the_recreated_topic_lacks_is_dropped_on_offset_reset(tmp_path):
    """A service dies five batches past its last checkpoint; the topic is then recreated
    holding three new records. Resuming refuses by default; with ``earliest`` the journaled
    batches (whose records are gone) are not replayed: a warning says so, a checkpoint at
    once makes the new offsets the base, the new records are consumed, and the state is
    exact. Before, the replay waited 30 s for the records and failed."""
    import streamgnn as sg
    from streamgnn.router import Checkpoints, Service, ServiceConfig
    from streamgnn.stream import encode
    from streamgnn.stream.memory import MemoryBroker, MemoryTransport
    from tests.test_faults import assert_exact, setup

    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    topics = Topics()
    config = ServiceConfig(batch_size=20, checkpoint_batches=25, topics=topics)

    def open_service(broker: MemoryBroker, reset: str = "refuse") -> Service:
        return Service.open(lambda: model, lambda m: sg.Engine.from_pyg(m.model(), snapshot),
                            MemoryTransport(broker, topics.updates, reset), config,
                            Checkpoints(tmp_path))

    class Crash(BaseException):
        pass

    def dying(report) -> None:
        if report.seq == 30:
            raise Crash

    first = MemoryBroker()
    for update in events:
        first.produce(topics.updates, encode(update))
    dead = open_service(first)
    with pytest.raises(Crash):
        dead.run(idle_exit_s=0.5, on_batch=dying)
    dead.close()

    recreated = MemoryBroker()
    new = [sg.AddVertex(id=10**9 + i, x=[0.5] * data.num_features) for i in range(3)]
    for update in new:
        recreated.produce(topics.updates, encode(update))
    with pytest.raises(OffsetsOutOfRange, match="partition 0 at offset"):
        open_service(recreated)
    with pytest.warns(UserWarning, match="not replayed"):
        service = open_service(recreated, "earliest")
    assert Checkpoints(tmp_path).load().meta["positions"] == {"0": 0}
    started = time.monotonic()
    service.run(idle_exit_s=0.5)
    assert time.monotonic() - started < 20
    assert service.engine.contains([u.id for u in new]).all()
    assert service.transport.positions() == {0: 3}
    assert_exact(service.engine, model)
    service.close()
