"""Kafka client settings from a properties file and STREAMGNN_KAFKA_* variables: parsing,
precedence, errors that name the setting, and (against the real embedded broker) each
client getting the settings its class accepts."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from kafka.errors import MessageSizeTooLargeError

from streamgnn.errors import KafkaConfigError
from streamgnn.stream.kafka import KafkaTransport, producer
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.kafka_tools import ensure_topics


def load(tmp_path, text: str | None = None, **env: str) -> KafkaConfig:
    file = None
    if text is not None:
        file = tmp_path / "client.properties"
        file.write_text(text)
    return KafkaConfig.load("h:9092", file, {f"STREAMGNN_KAFKA_{k}": v for k, v in env.items()})


def test_a_properties_file_takes_kafka_and_kafka_python_names_parsed_to_their_types(tmp_path):
    config = load(tmp_path, """
        # a production client.properties
        security.protocol=SASL_SSL
        sasl.mechanism = SCRAM-SHA-512
        sasl_plain_username=svc
        sasl.plain.password=p=ss#word
        ! another comment
        ssl.cafile=/etc/ca.pem
        client.id=streamgnn-1
        api.version=2.8.0
        linger.ms=20
        compression.type=gzip
        ssl.check.hostname=false
        retries=5
        receive.buffer.bytes=65536
    """)
    assert config.settings == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc", "sasl_plain_password": "p=ss#word",
        "ssl_cafile": "/etc/ca.pem", "client_id": "streamgnn-1", "api_version": (2, 8, 0),
        "linger_ms": 20, "compression_type": "gzip", "ssl_check_hostname": False,
        "retries": 5.0, "receive_buffer_bytes": 65536}
    assert config.bootstrap_servers == "h:9092" and config.file.name == "client.properties"


def test_environment_variables_override_the_file(tmp_path):
    config = load(tmp_path, "client.id=from-file\nlinger.ms=20\n",
                  CLIENT_ID="from-env", REQUEST_TIMEOUT_MS="5000", CONFIG="ignored")
    assert config.settings == {"client_id": "from-env", "linger_ms": 20,
                               "request_timeout_ms": 5000}


@pytest.mark.parametrize(("text", "env", "match"), [
    ("linger.msec=5\n", {}, r"client.properties:1: unknown Kafka client setting "
                            r"'linger_msec'; did you mean linger_ms"),
    ("", {"SECURITY_PROTOCOLL": "SSL"}, r"STREAMGNN_KAFKA_SECURITY_PROTOCOLL: unknown Kafka "
                                       r"client setting 'security_protocoll'"),
    ("acks=1\n", {}, r"acks cannot be configured \(producers wait for every"),
    ("", {"BOOTSTRAP_SERVERS": "x:1"}, r"bootstrap_servers cannot be configured \(set by "
                                       r"--bootstrap-servers"),
    ("group.id=g\n", {}, r"group_id cannot be configured"),
    ("value.serializer=json\n", {}, r"value_serializer takes a Python object"),
    ("\n\nlinger.ms=soon\n", {}, r"client.properties:3: linger_ms='soon': expected an integer"),
    ("api.version=latest\n", {}, r"api_version='latest': expected a version such as 2.8.0"),
    ("ssl.check.hostname=maybe\n", {}, r"expected true or false"),
    ("", {"SECURITY_PROTOCOL": "TLS"}, r"STREAMGNN_KAFKA_SECURITY_PROTOCOL: "
                                       r"security_protocol='TLS': expected one of PLAINTEXT"),
    ("compression.type=brotli\n", {}, r"expected one of gzip, snappy, lz4, zstd"),
    ("client.id\n", {}, r"client.properties:1: expected key=value, got 'client.id'"),
])
def test_a_bad_setting_is_named_with_where_it_came_from(tmp_path, text, env, match):
    with pytest.raises(KafkaConfigError, match=match):
        load(tmp_path, text, **env)


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(KafkaConfigError, match=r"cannot read the Kafka config file .*nope"):
        KafkaConfig.load("h:9092", tmp_path / "nope.properties", {})


def test_each_client_gets_the_settings_its_class_accepts_from_the_real_broker(kafka):
    topic = f"cfg-{uuid.uuid4().hex[:8]}"
    config = KafkaConfig.load(kafka.bootstrap_servers, None, {
        "STREAMGNN_KAFKA_CLIENT_ID": "sg-test", "STREAMGNN_KAFKA_LINGER_MS": "7",
        "STREAMGNN_KAFKA_FETCH_MAX_WAIT_MS": "60", "STREAMGNN_KAFKA_MAX_REQUEST_SIZE": "2048"})
    ensure_topics(config, [topic])
    transport = KafkaTransport(config, topic)
    admin = config.admin()
    try:
        prod, cons = transport._producer.config, transport._consumer.config
        assert prod["client_id"] == cons["client_id"] == admin.config["client_id"] == "sg-test"
        assert prod["linger_ms"] == 7 and "linger_ms" not in cons  # producer-only setting
        assert cons["fetch_max_wait_ms"] == 60 and "fetch_max_wait_ms" not in prod
        assert prod["acks"] == -1 and cons["enable_auto_commit"] is False  # streamgnn's own
        transport.publish(topic, None, b"small")
        transport.flush()
        assert [r.value for r in transport.poll(10, 5.0)] == [b"small"]
        # the configured limit (not streamgnn's 16 MB default) is what the client enforces
        with pytest.raises(MessageSizeTooLargeError):
            producer(config).send(topic, value=b"x" * 4096).get(timeout=10)
    finally:
        admin.close()
        transport.close()


@pytest.mark.parametrize(("file_text", "env", "named"), [
    ("sasl.mechanizm=PLAIN\n", {}, "sasl_mechanizm"),
    (None, {"STREAMGNN_KAFKA_LINGER_MS": "soon"}, "STREAMGNN_KAFKA_LINGER_MS"),
])
def test_the_commands_refuse_a_bad_setting_by_name_without_a_traceback(tmp_path, file_text,
                                                                       env, named):
    import os

    args = ["--kafka-config", "k.properties"] if file_text is not None else []
    if file_text is not None:
        (tmp_path / "k.properties").write_text(file_text)
    for command in (["produce", "-"], ["watch", "labels"], ["query", "-"]):
        out = subprocess.run([sys.executable, "-m", "streamgnn.cli", *command,
                              "-b", "127.0.0.1:1", *args], cwd=tmp_path, input="{}",
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COLUMNS": "200", **env})
        assert out.returncode == 2, out.stdout + out.stderr
        assert named in out.stderr and "Traceback" not in out.stderr, out.stderr
