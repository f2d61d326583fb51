"""GNN layer specs (message / aggregate / update), PyG model import, the model zoo and
checkpoints, training, layer-wise full inference and its comparison with PyG
(`bootstrap`). Must not import kafka or mpi4py.

Each name below loads its module on first use (PEP 562): PyG (torch_geometric) is
imported only by what builds, trains or converts a PyG model (`GNN`, `zoo`, `train`,
and `decompose` or `layer_from_conv` when handed one), never by the engine's import.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_WHERE = {
    "GNN": "streamgnn.models.gnn",
    "SUPPORTED": "streamgnn.models.convert",
    "decompose": "streamgnn.models.convert",
    "Layer": "streamgnn.models.layers",
    "layer_from_conv": "streamgnn.models.layers",
    "layerwise_inference": "streamgnn.models.inference",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'streamgnn.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
