"""Every supported layer type and option as a small model builder, for tests."""

from __future__ import annotations

from itertools import pairwise

import torch
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv
from torch_geometric.nn.models import GAT, GCN, GIN, MLP, GraphSAGE

from streamgnn.models import GNN

F_IN = 12


def stack(conv, dims, **kw):
    return GNN([conv(a, b, **kw) for a, b in pairwise(dims)])


# name -> builder(num_layers); each covers one layer type / option of the supported set.
ARCHS = {
    "pyg-gcn": lambda L: GCN(F_IN, 16, L, 5),
    "pyg-sage-mean": lambda L: GraphSAGE(F_IN, 16, L, 5),
    "pyg-sage-bn": lambda L: GraphSAGE(F_IN, 16, L, 5, norm="batch_norm"),
    "pyg-sage-sum-bn": lambda L: GraphSAGE(F_IN, 16, L, 5, aggr="sum", norm="batch_norm"),
    "pyg-gin": lambda L: GIN(F_IN, 16, L, 5),
    "pyg-gin-bn": lambda L: GIN(F_IN, 16, L, 5, norm="batch_norm"),
    "pyg-gat": lambda L: GAT(F_IN, 16, L, 8, heads=4),
    "gcn-improved": lambda L: stack(GCNConv, [F_IN] + [16] * (L - 1) + [5], improved=True),
    "gcn-no-loops": lambda L: stack(GCNConv, [F_IN] + [16] * (L - 1) + [5],
                                     add_self_loops=False),
    "sage-sum": lambda L: stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5], aggr="sum"),
    "sage-max": lambda L: stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5], aggr="max"),
    "sage-wide": lambda L: stack(SAGEConv, [F_IN] + [32] * (L - 1) + [5], aggr="mean"),
    "sage-narrowing-normalize": lambda L: stack(SAGEConv, [*[F_IN, 10, 8][:L], 5],
                                                 normalize=True),
    "sage-normalize": lambda L: stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5],
                                       normalize=True, root_weight=False),
    "graphconv-add": lambda L: stack(GraphConv, [F_IN] + [16] * (L - 1) + [5]),
    "graphconv-mean": lambda L: stack(GraphConv, [F_IN] + [16] * (L - 1) + [5], aggr="mean"),
    "graphconv-narrowing": lambda L: stack(GraphConv, [*[F_IN, 10, 8][:L], 5]),
    "graphconv-max": lambda L: stack(GraphConv, [F_IN] + [16] * (L - 1) + [5], aggr="max"),
    "graphconv-min": lambda L: stack(GraphConv, [F_IN] + [16] * (L - 1) + [5], aggr="min"),
    "gin-eps": lambda L: GNN([GINConv(MLP([a, 16, b]), eps=0.3, train_eps=True)
                              for a, b in zip([F_IN] + [16] * (L - 1), [16] * (L - 1) + [5])]),
    "gat-mean-heads": lambda L: GNN([GATConv(F_IN, 8, heads=3, concat=False)]
                                    + [GATConv(8, 8, heads=2, concat=False)] * (L - 2)
                                    + ([GATConv(8, 5, heads=2)] if L > 1 else [])),
    "gat-residual": lambda L: stack(GATConv, [F_IN] + [16] * (L - 1) + [5], residual=True),
}


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-trivial parameters everywhere (biases, eps, batch-norm statistics)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    return model.eval()


