"""Streams: the message schemas and topic names (`schemas`), the transport interface the
router uses (`transport`), its Kafka implementation (`kafka`) and an in-memory one
(`memory`), Kafka client settings (`kafka_config`), the command-line Kafka helpers
(`kafka_tools`) and the embedded Tansu broker (`broker`). Only `kafka`, `kafka_config`,
`kafka_tools` and `broker` import kafka-python, and only when used: importing this package
imports none of them.
"""

from streamgnn.stream.schemas import (
    Columns,
    DeadLetter,
    DecodedColumns,
    DecodeError,
    LabelChange,
    LabelChanges,
    QueryResult,
    SourceRange,
    Topics,
    decode_update,
    decode_updates,
    encode,
    encode_columns,
    label_changes_json,
)
from streamgnn.stream.transport import Record, Transport

__all__ = [
    "Columns",
    "DeadLetter",
    "DecodeError",
    "DecodedColumns",
    "LabelChange",
    "LabelChanges",
    "QueryResult",
    "Record",
    "SourceRange",
    "Topics",
    "Transport",
    "decode_update",
    "decode_updates",
    "encode",
    "encode_columns",
    "label_changes_json",
]
