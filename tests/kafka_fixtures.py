"""A real embedded broker (Tansu) for the tests that need Kafka: one broker process per
test session, fresh topic names per test."""

from __future__ import annotations

import socket
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
