"""A real embedded broker (Tansu) for the tests that need Kafka: one broker process per
test session, fresh topic names per test."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid

import pytest

from streamgnn.stream import Topics
from streamgnn.stream.broker import EmbeddedBroker
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import ensure_topics


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
