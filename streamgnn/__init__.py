"""streamgnn: exact, incremental GNN inference over a changing graph.

The public API: ``sg.Engine``, ``sg.datasets``, ``sg.GraphData``, ``sg.models``,
``sg.DynamicGraph``, the six update types, ``sg.UpdateBatch``, queries
(``sg.QueryRequest``, ``sg.QueryVertex``, ``sg.QueryEdge``, ``sg.QueryColumns``,
``sg.QueryAnswer``) and the errors. Importing streamgnn must not import kafka or mpi4py.
"""

from streamgnn import datasets, models
from streamgnn.datasets import GraphData
from streamgnn.errors import (
    DuplicateEdgeError,
    DuplicateVertexError,
    FeatureDimensionError,
    InvalidQueryError,
    InvalidUpdateError,
    NonFiniteEmbeddingError,
    NonFiniteValueError,
    OutOfRangeError,
    SelfLoopError,
    StreamGNNError,
    UnknownEdgeError,
    UnknownVertexError,
    UnsupportedModelError,
)
from streamgnn.graph import DynamicGraph, GraphDiff
from streamgnn.queries import QueryColumns, QueryEdge, QueryRequest, QueryVertex
from streamgnn.updates import (
    AddEdge,
    AddVertex,
    DeleteEdge,
    DeleteVertex,
    Update,
    UpdateBatch,
    UpdateEdge,
    UpdateFeatures,
    ValueLimits,
)
from streamgnn.workers import ApplyResult, Engine, QueryAnswer

__version__ = "0.1.0"

__all__ = [
    "AddEdge",
    "AddVertex",
    "ApplyResult",
    "DeleteEdge",
    "DeleteVertex",
    "DuplicateEdgeError",
    "DuplicateVertexError",
    "DynamicGraph",
    "Engine",
    "FeatureDimensionError",
    "GraphData",
    "GraphDiff",
    "InvalidQueryError",
    "InvalidUpdateError",
    "NonFiniteEmbeddingError",
    "NonFiniteValueError",
    "OutOfRangeError",
    "QueryAnswer",
    "QueryColumns",
    "QueryEdge",
    "QueryRequest",
    "QueryVertex",
    "SelfLoopError",
    "StreamGNNError",
    "UnknownEdgeError",
    "UnknownVertexError",
    "UnsupportedModelError",
    "Update",
    "UpdateBatch",
    "UpdateEdge",
    "UpdateFeatures",
    "ValueLimits",
    "datasets",
    "models",
]
