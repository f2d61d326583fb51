"""From a PyG model to the list of decomposed layers the engine and layer-wise inference
run: PyG ``GCN``, ``GraphSAGE``, ``GIN``, ``GAT`` (torch_geometric.nn.models) and
``sg.models.GNN``.

Owns the model -> layers mapping only; must not import kafka or mpi4py.
"""

from __future__ import annotations

import torch

from streamgnn.errors import UnsupportedModelError
from streamgnn.models.layers import Layer, layer_from_conv

SUPPORTED = ("torch_geometric.nn.models.GCN, GraphSAGE, GIN, GAT (default options) or "
             "streamgnn.models.GNN of GCNConv, SAGEConv, GraphConv, GINConv, GATConv")


def decompose(model: torch.nn.Module) -> list[Layer]:
    """The model's layers, in order; puts the model in eval mode. Raises
    UnsupportedModelError naming what is supported."""
    # PyG here, not with the module: a model to decompose has loaded it already, and
    # importing the engine does not
    from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE
    from torch_geometric.nn.norm import BatchNorm

    from streamgnn.models.gnn import GNN

    model.eval()
    if isinstance(model, GNN):
        act = model.act
        return [layer_from_conv(c, act if i < len(model.convs) - 1 else None)
                for i, c in enumerate(model.convs)]
    if isinstance(model, (GCN, GraphSAGE, GIN, GAT)):
        if model.jk_mode is not None or hasattr(model, "lin"):
            raise UnsupportedModelError(f"{type(model).__name__}(jk=...) is not supported")
        for norm in model.norms:
            if not isinstance(norm, (torch.nn.Identity, BatchNorm, torch.nn.BatchNorm1d)):
                raise UnsupportedModelError(
                    f"norm {type(norm).__name__} is not per-vertex; supported: None, batch_norm")
        layers = []
        for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
            last = i == model.num_layers - 1
            layers.append(layer_from_conv(conv, None if last else _post(model.act, norm,
                                                                        model.act_first)))
        return layers
    raise UnsupportedModelError(f"{type(model).__name__} is not supported; use {SUPPORTED}")


def _post(act, norm, act_first: bool):
    if isinstance(norm, torch.nn.Identity):
        return act  # the activation alone (None: nothing), as `Layer.elementwise` reads it

    def post(x: torch.Tensor) -> torch.Tensor:
        if act is not None and act_first:
            x = act(x)
        x = norm(x)
        if act is not None and not act_first:
            x = act(x)
        return x
    return post
