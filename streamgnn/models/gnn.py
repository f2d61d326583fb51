"""`sg.models.GNN`: a stack of PyG convs with one activation between layers, for layer
mixes the PyG model classes do not offer (GraphConv, SAGE sum/max, mixed stacks).

Owns this model class only; must not import kafka or mpi4py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch_geometric.nn import GCNConv, GraphConv
from torch_geometric.nn.resolver import activation_resolver

WEIGHTED_CONVS = (GCNConv, GraphConv)


class GNN(torch.nn.Module):
    """``convs[0] -> act -> convs[1] -> act -> ... -> convs[-1]`` (no activation after
    the last). GCNConv and GraphConv receive the edge weights."""

    def __init__(self, convs: Sequence[torch.nn.Module], act: str | None = "relu") -> None:
        super().__init__()
        if not convs:
            raise ValueError("GNN needs at least one conv")
        self.convs = torch.nn.ModuleList(convs)
        self.act = activation_resolver(act) if act is not None else None

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        for i, conv in enumerate(self.convs):
            if isinstance(conv, WEIGHTED_CONVS):
                x = conv(x, edge_index, edge_weight)
            else:
                x = conv(x, edge_index)
            if i < len(self.convs) - 1 and self.act is not None:
                x = self.act(x)
        return x


def takes_edge_weights(model: torch.nn.Module) -> bool:
    """Whether some conv of ``model`` takes edge weights (GCNConv, GraphConv)."""
    return any(isinstance(m, WEIGHTED_CONVS) for m in model.modules())


@torch.inference_mode()
def pyg_forward(model: torch.nn.Module, data, device: str = "cpu") -> Tensor:
    """PyG's own forward pass of ``model`` over a `GraphData` (rows in ``data.ids`` order),
    with edge weights for the convs that take them: the reference the engine must equal."""
    g = data.to_pyg().to(device)
    return model(g.x, g.edge_index,
                 edge_weight=g.edge_weight if takes_edge_weights(model) else None)
