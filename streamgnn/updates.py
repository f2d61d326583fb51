"""The six graph-update types: the vocabulary shared by the graph store, the engine,
the router and the Kafka streams (which carry them as JSON).

Pure pydantic; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Update(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str | None = None
    """Set by producers on the stream (dead letters and label changes name it)."""
    event_time: float | None = None
    """When the event happened, seconds since the epoch (end-to-end latency starts here)."""


class AddEdge(_Update):
    op: Literal["add_edge"] = "add_edge"
    src: int
    dst: int
    weight: float = 1.0


class DeleteEdge(_Update):
    op: Literal["delete_edge"] = "delete_edge"
    src: int
    dst: int


class UpdateEdge(_Update):
    op: Literal["update_edge"] = "update_edge"
    src: int
    dst: int
    weight: float


class AddVertex(_Update):
    op: Literal["add_vertex"] = "add_vertex"
    id: int
    x: list[float]


class DeleteVertex(_Update):
    op: Literal["delete_vertex"] = "delete_vertex"
    id: int


class UpdateFeatures(_Update):
    op: Literal["update_features"] = "update_features"
    id: int
    x: list[float]


Update = Annotated[
    AddEdge | DeleteEdge | UpdateEdge | AddVertex | DeleteVertex | UpdateFeatures,
    Field(discriminator="op"),
]
"""Any one of the six update types, discriminated by ``op``."""

UPDATE_ADAPTER: TypeAdapter[Update] = TypeAdapter(Update)
EDGE_UPDATES = (AddEdge, DeleteEdge, UpdateEdge)
VERTEX_UPDATES = (AddVertex, DeleteVertex, UpdateFeatures)
