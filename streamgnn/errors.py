"""Exceptions raised by streamgnn's Python API.

Owns the exception hierarchy only; imports nothing from the rest of the package.
Bad input raises an :class:`InvalidInputError` naming the offending id and the reason:
a bad update an :class:`InvalidUpdateError` subclass, which carries the update's position
in its batch; a query that cannot be answered an :class:`InvalidQueryError` (or, for an
unknown or duplicate vertex id, the same vertex error an update gets).
A mistake of the user (a missing file, an unknown name, no broker) raises a
:class:`UserError`, which the ``streamgnn`` command prints in a few lines.
"""

from __future__ import annotations


class StreamGNNError(Exception):
    """Base class of every error streamgnn raises on purpose."""


class InvalidInputError(StreamGNNError, ValueError):
    """Input that cannot be taken: an update, a query or a read request. ``kind`` names
    the problem in one word (a dead letter's or an error result's ``error``)."""

    kind = "invalid_input"

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        self.reason = reason
        self.index = index  # the item's position in its batch, query or read request
        self._where = ""
        super().__init__(reason)

    def __str__(self) -> str:
        return f"{self.reason}{self._where}"


class InvalidUpdateError(InvalidInputError):
    """An update that cannot be applied to the current graph; nothing was applied."""

    kind = "invalid_update"

    def at(self, index: int) -> InvalidUpdateError:
        """Return this error annotated with the update's position in its batch (which
        its message then names; a query's or a read's errors name the vertex instead)."""
        self.index = index
        self._where = f" (update #{index} of the batch)"
        return self


class UnknownVertexError(InvalidUpdateError, KeyError):
    """A vertex id that is not in the graph."""

    kind = "unknown_vertex"


class DuplicateVertexError(InvalidUpdateError):
    """Adding a vertex id that already exists."""

    kind = "duplicate_vertex"


class UnknownEdgeError(InvalidUpdateError, KeyError):
    """Deleting or updating an edge that does not exist."""

    kind = "unknown_edge"


class DuplicateEdgeError(InvalidUpdateError):
    """Adding an edge that already exists (the graph keeps no parallel edges)."""

    kind = "duplicate_edge"


class SelfLoopError(InvalidUpdateError):
    """An edge from a vertex to itself (the graph keeps no self-loops)."""

    kind = "self_loop"


class FeatureDimensionError(InvalidUpdateError):
    """A feature vector whose length differs from the graph's feature dimension."""

    kind = "wrong_dimension"


class NonFiniteValueError(InvalidUpdateError):
    """A NaN or infinite feature value or edge weight."""

    kind = "non_finite"


class OutOfRangeError(InvalidUpdateError):
    """A feature value or edge weight beyond the graph's `ValueLimits` (past them, float
    cancellation in long delta chains would break the exactness contract)."""

    kind = "out_of_range"


class InvalidQueryError(InvalidInputError):
    """A query request that cannot be answered: empty or over-size, an id of an existing
    vertex, an edge naming an unknown vertex or joining two existing vertices."""

    kind = "invalid_query"


class NonFiniteEmbeddingError(StreamGNNError, ArithmeticError):
    """A batch drove an embedding to NaN or inf. The engine's state is no longer exact:
    restore it from a snapshot (the service does, and isolates the update responsible)."""


class UnsupportedModelError(StreamGNNError, TypeError):
    """A model, layer or layer option streamgnn cannot decompose exactly."""


class KafkaConfigError(StreamGNNError, ValueError):
    """A Kafka client setting (from ``--kafka-config`` or a ``STREAMGNN_KAFKA_*`` variable)
    that is unknown, owned by streamgnn, or of the wrong type; the message names it and
    where it came from."""


class UserError(StreamGNNError):
    """A mistake the user can fix (a missing file, an unknown choice, no broker, a state
    directory that would lose data if used). The ``streamgnn`` command prints ``message``
    and ``hint`` in a few lines, without a traceback (unless ``--debug``), and exits 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message}\n{hint}")


class InputError(UserError, ValueError):
    """A name or a file given by the user that cannot be used: an unknown dataset or model,
    a missing or unreadable file, a file of another kind, a model that does not fit the
    dataset."""


class NoBrokerError(UserError, ConnectionError):
    """No Kafka broker answers at the configured address."""
