"""Layer-wise inference equals PyG's forward pass, layer by layer, for every supported
layer type and option; unsupported models fail naming what is supported."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv
from torch_geometric.nn.models import GAT, GCN, GIN, MLP, GraphSAGE

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.models import GNN, decompose, layerwise_inference
from streamgnn.models.zoo import MODELS, Checkpoint, ModelSpec
from tests.conftest import pyg_layers, random_graph

F_IN = 12


def _stack(conv, dims, **kw):
    return GNN([conv(a, b, **kw) for a, b in pairwise(dims)])


# name -> builder(num_layers); each covers one layer type / option of the supported set.
ARCHS = {
    "pyg-gcn": lambda L: GCN(F_IN, 16, L, 5),
    "pyg-sage-mean": lambda L: GraphSAGE(F_IN, 16, L, 5),
    "pyg-sage-bn": lambda L: GraphSAGE(F_IN, 16, L, 5, norm="batch_norm"),
    "pyg-gin": lambda L: GIN(F_IN, 16, L, 5),
    "pyg-gat": lambda L: GAT(F_IN, 16, L, 8, heads=4),
    "gcn-improved": lambda L: _stack(GCNConv, [F_IN] + [16] * (L - 1) + [5], improved=True),
    "gcn-no-loops": lambda L: _stack(GCNConv, [F_IN] + [16] * (L - 1) + [5],
                                     add_self_loops=False),
    "sage-sum": lambda L: _stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5], aggr="sum"),
    "sage-max": lambda L: _stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5], aggr="max"),
    "sage-wide": lambda L: _stack(SAGEConv, [F_IN] + [32] * (L - 1) + [5], aggr="mean"),
    "sage-normalize": lambda L: _stack(SAGEConv, [F_IN] + [16] * (L - 1) + [5],
                                       normalize=True, root_weight=False),
    "graphconv-add": lambda L: _stack(GraphConv, [F_IN] + [16] * (L - 1) + [5]),
    "graphconv-mean": lambda L: _stack(GraphConv, [F_IN] + [16] * (L - 1) + [5], aggr="mean"),
    "graphconv-max": lambda L: _stack(GraphConv, [F_IN] + [16] * (L - 1) + [5], aggr="max"),
    "gin-eps": lambda L: GNN([GINConv(MLP([a, 16, b]), eps=0.3, train_eps=True)
                              for a, b in zip([F_IN] + [16] * (L - 1), [16] * (L - 1) + [5])]),
    "gat-mean-heads": lambda L: GNN([GATConv(F_IN, 8, heads=3, concat=False)]
                                    + [GATConv(8, 8, heads=2, concat=False)] * (L - 2)
                                    + ([GATConv(8, 5, heads=2)] if L > 1 else [])),
    "gat-residual": lambda L: _stack(GATConv, [F_IN] + [16] * (L - 1) + [5], residual=True),
}


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
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


def _check(model, data, max_edges=50, dtype=torch.float64, tol=1e-5):
    graph = DynamicGraph.from_data(data)
    hs = layerwise_inference(decompose(model.to(dtype)), graph, max_edges=max_edges,
                             progress=False, dtype=dtype)
    refs = pyg_layers(model, data, dtype)
    assert len(hs) == len(refs)
    rows = graph.slots(data.ids)
    for layer, (ours, ref) in enumerate(zip(hs, refs)):
        err = (ours[rows] - ref).abs().max().item()
        assert err <= tol * max(1.0, ref.abs().max().item() if dtype == torch.float32 else 1.0), (
            f"layer {layer}: max error {err}")


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_layerwise_equals_pyg_float64(arch, num_layers):
    data = random_graph(np.random.default_rng(num_layers), n=60, m=300, d=F_IN)
    _check(_randomise(ARCHS[arch](num_layers), seed=num_layers), data)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_layerwise_equals_pyg_float32(arch):
    """The production dtype: within 1e-5 per unit of magnitude (float32 keeps ~7 digits)."""
    data = random_graph(np.random.default_rng(7), n=200, m=1500, d=F_IN, hubs=4)
    _check(_randomise(ARCHS[arch](2), seed=3), data, max_edges=400, dtype=torch.float32)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), density=st.floats(0, 6),
       arch=st.sampled_from(sorted(ARCHS)), max_edges=st.integers(1, 200))
def test_layerwise_random_graphs(seed, n, density, arch, max_edges):
    """Random graphs: isolated vertices, hubs, a single vertex, no edges at all."""
    rng = np.random.default_rng(seed)
    data = random_graph(rng, n=n, m=int(density * n), d=F_IN, hubs=1)
    _check(_randomise(ARCHS[arch](2), seed=seed), data, max_edges=max_edges)


def test_graph_with_deleted_vertices():
    """Slots of deleted vertices do not leak into live vertices' embeddings."""
    rng = np.random.default_rng(1)
    data = random_graph(rng, n=80, m=400, d=F_IN)
    graph = DynamicGraph.from_data(data)
    graph.apply([sg.DeleteVertex(id=int(i)) for i in data.ids[:10]])
    current = graph.to_data()
    model = _randomise(ARCHS["pyg-gcn"](2), 0).double()
    hs = layerwise_inference(decompose(model), graph, progress=False, dtype=torch.float64)
    ref = pyg_layers(model, current, torch.float64)[-1]
    assert (hs[-1][graph.slots(current.ids)] - ref).abs().max() < 1e-9


@pytest.mark.parametrize("model, match", [
    (torch.nn.Linear(3, 3), "Linear is not supported"),
    (GNN([GraphConv(4, 4, aggr="min")]), "aggregation 'min' is not supported"),
    (GNN([SAGEConv(4, 4, project=True)]), "project=True"),
    (GNN([GCNConv(4, 4, normalize=False)]), "normalize=False"),
    (GNN([GATConv(4, 4, edge_dim=2)]), "edge_dim"),
    (GraphSAGE(4, 8, 2, 3, jk="cat"), "jk"),
    (GraphSAGE(4, 8, 2, 3, norm="layer_norm"), "not per-vertex"),
])
def test_unsupported_models_name_the_problem(model, match):
    with pytest.raises(sg.UnsupportedModelError, match=match):
        decompose(model)


def test_unsupported_conv_lists_supported_layers():
    from torch_geometric.nn import ChebConv

    with pytest.raises(sg.UnsupportedModelError, match="GCNConv, SAGEConv, GraphConv"):
        decompose(GNN([ChebConv(4, 4, K=2)]))


@pytest.mark.parametrize("name", MODELS)
def test_zoo_checkpoint_roundtrip(name, tmp_path):
    data = sg.datasets.synthetic("tiny", seed=1)
    spec = ModelSpec(name, data.num_features, data.num_classes, hidden=16)
    model = _randomise(spec.build(), seed=2)
    path = Checkpoint(spec, model.state_dict(), dataset="tiny").save(tmp_path / "m.pt")
    loaded = Checkpoint.load(path)
    assert loaded.spec == spec
    for a, b in zip(model.state_dict().values(), loaded.model().state_dict().values()):
        assert torch.equal(a, b)
    _check(loaded.model(), data, max_edges=4096)


def test_checkpoint_rejects_foreign_files(tmp_path):
    torch.save({"weights": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a streamgnn checkpoint"):
        Checkpoint.load(tmp_path / "x.pt")
