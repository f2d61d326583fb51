"""`KafkaConfig`: where the Kafka brokers are and the kafka-python client settings to reach
them with (security protocol, SASL, SSL files, client id, api_version, linger,
compression, timeouts ...), and the producers, consumers and admin clients built from it.

Settings come from a properties file (``--kafka-config FILE``: ``key=value`` lines, ``#``
comments, Kafka's dotted names or kafka-python's: ``security.protocol=SASL_SSL`` is
``security_protocol``) and from ``STREAMGNN_KAFKA_<SETTING>`` environment variables, which
win over the file. Each is checked against what kafka-python's clients accept, parsed to
its type, and given to every client class that accepts it.

Owns reading and checking client settings and constructing kafka-python clients; imports
kafka-python, must not import torch or mpi4py.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from streamgnn.errors import KafkaConfigError

ENV_PREFIX = "STREAMGNN_KAFKA_"
FILE_ENV = "STREAMGNN_KAFKA_CONFIG"  # names the file; not a setting

_CLIENTS = (KafkaProducer, KafkaConsumer, KafkaAdminClient)

# What streamgnn sets itself: the service's exactly-once replay depends on these.
_OWNED = {
    "bootstrap_servers": "set by --bootstrap-servers / STREAMGNN_BOOTSTRAP_SERVERS",
    "acks": "producers wait for every in-sync replica (acks=all)",
    "enable_idempotence": "producers are idempotent (no duplicates on retry)",
    "transactional_id": "streamgnn does not use Kafka transactions",
    "enable_auto_commit": "consumer positions come from the service's checkpoints",
    "auto_offset_reset": "set by serve's --offset-reset / STREAMGNN_OFFSET_RESET (a saved "
                         "offset the broker no longer holds is never skipped silently)",
    "group_id": "consumers are assigned partitions explicitly, never through a group",
    "group_instance_id": "consumers are assigned partitions explicitly, never through a group",
}
# Settings whose value is a Python object (serializers, SSL context, token provider ...).
_OBJECTS = {"key_serializer", "value_serializer", "key_deserializer", "value_deserializer",
            "ssl_context", "sasl_oauth_token_provider"}
_INTS = {"receive_buffer_bytes", "send_buffer_bytes"}  # default None, an int when set
_CHOICES = {
    "security_protocol": ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    "sasl_mechanism": ("PLAIN", "GSSAPI", "OAUTHBEARER", "SCRAM-SHA-256", "SCRAM-SHA-512",
                       "AWS_MSK_IAM"),
    "compression_type": ("gzip", "snappy", "lz4", "zstd"),
    "isolation_level": ("read_uncommitted", "read_committed"),
}


def _defaults() -> dict[str, object]:
    """Every setting some client accepts -> its default (a non-None one where any has)."""
    out: dict[str, object] = {}
    for cls in _CLIENTS:
        for key, value in cls.DEFAULT_CONFIG.items():
            if out.get(key) is None:
                out[key] = value
    return out


_DEFAULTS = _defaults()
SETTABLE = sorted(k for k, v in _DEFAULTS.items() if k not in _OWNED and k not in _OBJECTS
                  and (v is None or isinstance(v, bool | int | float | str)))


def parse_setting(key: str, text: str, source: str) -> object:
    """``text`` as the value of setting ``key`` (found at ``source``, named in errors)."""
    if key in _OWNED:
        raise KafkaConfigError(f"{source}: {key} cannot be configured ({_OWNED[key]})")
    if key not in SETTABLE:
        if key in _DEFAULTS:
            raise KafkaConfigError(f"{source}: {key} takes a Python object; it cannot be "
                                   "set from a file or the environment")
        close = difflib.get_close_matches(key, SETTABLE, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise KafkaConfigError(f"{source}: unknown Kafka client setting {key!r}{hint}")
    default = _DEFAULTS[key]
    if key in _CHOICES and text not in _CHOICES[key]:
        raise KafkaConfigError(f"{source}: {key}={text!r}: expected one of "
                               f"{', '.join(_CHOICES[key])}")
    try:
        if key == "api_version":  # "2.8.0" -> (2, 8, 0)
            return tuple(int(part) for part in text.split("."))
        if isinstance(default, bool):
            return {"true": True, "false": False}[text.lower()]
        if isinstance(default, int) or key in _INTS:
            return int(text)
        if isinstance(default, float):
            return float(text)
    except (ValueError, KeyError):
        kind = {"api_version": "a version such as 2.8.0"}.get(key) or (
            "true or false" if isinstance(default, bool) else
            "an integer" if isinstance(default, int) or key in _INTS else "a number")
        raise KafkaConfigError(f"{source}: {key}={text!r}: expected {kind}") from None
    return text


def setting_name(name: str) -> str:
    """kafka-python's name of a setting: ``security.protocol`` -> ``security_protocol``."""
    return name.strip().lower().replace(".", "_").replace("-", "_")


def read_properties(path: Path) -> dict[str, tuple[str, str]]:
    """``key=value`` lines of ``path`` -> {setting: (value, "path:line")}; blank lines and
    lines starting with ``#`` or ``!`` are skipped; a value runs to the end of its line."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise KafkaConfigError(f"cannot read the Kafka config file {path}: "
                               f"{e.strerror}") from None
    out = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise KafkaConfigError(f"{path}:{n}: expected key=value, got {line!r}")
        out[setting_name(key)] = (value.strip(), f"{path}:{n}")
    return out


@dataclass(frozen=True)
class KafkaConfig:
    """The brokers (``host:port,...``) and the kafka-python settings of every client made
    for them; ``file`` is where the settings were read from (child processes get it)."""

    bootstrap_servers: str
    settings: Mapping[str, object] = field(default_factory=dict)
    file: Path | None = None

    @classmethod
    def load(cls, bootstrap_servers: str, file: Path | None = None,
             environ: Mapping[str, str] = os.environ) -> KafkaConfig:
        """Settings from ``file`` (if given), overridden by ``STREAMGNN_KAFKA_*``
        variables of ``environ``; raises `KafkaConfigError` naming a bad one."""
        raw = read_properties(file) if file is not None else {}
        raw |= {setting_name(k.removeprefix(ENV_PREFIX)): (v, k) for k, v in environ.items()
                if k.startswith(ENV_PREFIX) and k != FILE_ENV}
        settings = {key: parse_setting(key, text, source) for key, (text, source) in
                    sorted(raw.items())}
        return cls(bootstrap_servers, settings, file)

    def producer(self, **ours: object) -> KafkaProducer:
        """A producer with streamgnn's settings ``ours`` and the configured ones on top."""
        return self._client(KafkaProducer, ours)

    def consumer(self, **ours: object) -> KafkaConsumer:
        return self._client(KafkaConsumer, ours)

    def admin(self, **ours: object) -> KafkaAdminClient:
        return self._client(KafkaAdminClient, ours)

    def _client(self, cls: type, ours: dict[str, object]):
        accepted = cls.DEFAULT_CONFIG
        mine = {k: v for k, v in self.settings.items() if k in accepted}
        try:
            return cls(bootstrap_servers=self.bootstrap_servers, **(ours | mine))
        except (AssertionError, ValueError) as e:  # kafka-python's checks of its settings
            raise KafkaConfigError(f"kafka-python's {cls.__name__} refused the settings "
                                   f"{mine}: {e}") from e
