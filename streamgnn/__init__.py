"""streamgnn: exact, incremental GNN inference over a changing graph.

The public API: ``sg.Engine``, ``sg.datasets``, ``sg.GraphData``, ``sg.models``,
``sg.DynamicGraph``, the six update types, ``sg.UpdateBatch``, queries
(``sg.QueryRequest``, ``sg.QueryVertex``, ``sg.QueryEdge``, ``sg.QueryColumns``,
``sg.QueryAnswer``), ``sg.warm_up`` (compile the kernels before the first batch) and
the errors. Each name is imported on first use (PEP 562), so
``import streamgnn.updates`` or the CLI's Kafka commands never pay for torch. Importing
streamgnn must not import torch, kafka or mpi4py, and no public name imports PyG (only
building, training or converting a PyG model does: `streamgnn.models`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_ERRORS = ("DuplicateEdgeError", "DuplicateVertexError", "FeatureDimensionError",
           "InvalidInputError", "InvalidQueryError", "InvalidUpdateError",
           "NonFiniteEmbeddingError", "NonFiniteValueError", "OutOfRangeError",
           "SelfLoopError", "StreamGNNError", "UnknownEdgeError", "UnknownVertexError",
           "UnsupportedModelError")
_UPDATES = ("AddEdge", "AddVertex", "DeleteEdge", "DeleteVertex", "Update", "UpdateBatch",
            "UpdateEdge", "UpdateFeatures", "ValueLimits")
# public name -> the module that defines it (None: the name is a subpackage)
_WHERE: dict[str, str | None] = {
    **dict.fromkeys(_ERRORS, "streamgnn.errors"),
    **dict.fromkeys(_UPDATES, "streamgnn.updates"),
    **dict.fromkeys(("QueryColumns", "QueryEdge", "QueryRequest", "QueryVertex"),
                   "streamgnn.queries"),
    **dict.fromkeys(("DynamicGraph", "GraphDiff"), "streamgnn.graph"),
    **dict.fromkeys(("ApplyResult", "ChangedLabels", "Engine", "QueryAnswer"),
                   "streamgnn.workers"),
    "GraphData": "streamgnn.datasets",
    "warm_up": "streamgnn.workers.warm_up",
    "datasets": None,
    "models": None,
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'streamgnn' has no attribute {name!r}")
    module = _WHERE[name]
    value = (importlib.import_module(f"streamgnn.{name}") if module is None
             else getattr(importlib.import_module(module), name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
