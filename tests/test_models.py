"""Layer-wise inference equals PyG's forward pass, layer by layer, for every supported
layer type and option; unsupported models fail naming what is supported."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch_geometric.nn import GATConv, GCNConv, GraphConv, SAGEConv
from torch_geometric.nn.models import GraphSAGE

import streamgnn as sg
from streamgnn.graph import DynamicGraph
from streamgnn.models import GNN, decompose, layerwise_inference, small_product
from streamgnn.models.inference import aggregate_edgewise, aggregate_spmm
from streamgnn.models.layers import GINLayer
from streamgnn.models.zoo import MODELS, ModelFile, ModelSpec
from tests.archs import ARCHS, F_IN, randomise
from tests.conftest import pyg_layers, random_graph


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
    _check(randomise(ARCHS[arch](num_layers), seed=num_layers), data)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_layerwise_equals_pyg_float32(arch):
    """The production dtype: within 1e-5 per unit of magnitude (float32 keeps ~7 digits)."""
    data = random_graph(np.random.default_rng(7), n=200, m=1500, d=F_IN, hubs=4)
    _check(randomise(ARCHS[arch](2), seed=3), data, max_edges=400, dtype=torch.float32)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), density=st.floats(0, 6),
       arch=st.sampled_from(sorted(ARCHS)), max_edges=st.integers(1, 200))
def test_layerwise_random_graphs(seed, n, density, arch, max_edges):
    """Random graphs: isolated vertices, hubs, a single vertex, no edges at all."""
    rng = np.random.default_rng(seed)
    data = random_graph(rng, n=n, m=int(density * n), d=F_IN, hubs=1)
    _check(randomise(ARCHS[arch](2), seed=seed), data, max_edges=max_edges)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), density=st.floats(0, 6),
       arch=st.sampled_from(["graphconv-add", "graphconv-mean", "graphconv-max",
                             "graphconv-min", "sage-max", "pyg-gcn"]))
def test_edgewise_aggregation_equals_the_sparse_product(seed, n, density, arch):
    """Off CPU, max and min go edge by edge (torch's sparse product reduces them on CPU
    only): that path gives the same states, empty neighborhoods included."""
    rng = np.random.default_rng(seed)
    graph = DynamicGraph.from_data(random_graph(rng, n=n, m=int(density * n), d=F_IN, hubs=1))
    layer = decompose(randomise(ARCHS[arch](1), seed).double())[0]
    t = layer.transform(torch.from_numpy(graph.x[:graph.num_slots]).double())
    scale = layer.source_scale(torch.from_numpy(graph.in_weight[:graph.num_slots]))
    dst = np.arange(graph.num_slots)
    ptr, src, w = graph.in_edges(dst)
    src, w = torch.from_numpy(src.astype(np.int64)), torch.from_numpy(w).double()
    spmm = aggregate_spmm(layer, t, ptr, src, w, scale)
    edgewise = aggregate_edgewise(layer, t, ptr, src, w, scale, torch.from_numpy(dst))
    torch.testing.assert_close(edgewise, spmm, rtol=1e-12, atol=1e-12)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), density=st.floats(0, 6),
       arch=st.sampled_from(["pyg-gat", "gat-mean-heads", "gat-residual"]))
def test_fused_attention_reduce_equals_the_edgewise_one(seed, n, density, arch):
    """Attention on CPU aggregates with a fused kernel (logits computed edge by edge from
    the kept scores); the edge-wise torch path, which other devices use, gives the same
    states, empty neighborhoods included."""
    rng = np.random.default_rng(seed)
    graph = DynamicGraph.from_data(random_graph(rng, n=n, m=int(density * n), d=F_IN, hubs=1))
    layer = decompose(randomise(ARCHS[arch](1), seed).double())[0]
    dst = np.arange(graph.num_slots)
    ptr, src, _ = graph.in_edges(dst)
    src, dst = torch.from_numpy(src.astype(np.int64)), torch.from_numpy(dst)
    with torch.inference_mode():
        t = layer.transform(torch.from_numpy(graph.x[:graph.num_slots]).double())
        fused = layer.reduce_csr(t, ptr, src, dst)
        edgewise = layer.aggr.pack(aggregate_edgewise(layer, t, ptr, src, None, None, dst))
    torch.testing.assert_close(fused, edgewise, rtol=1e-12, atol=1e-12)


def test_graph_with_deleted_vertices():
    """Slots of deleted vertices do not leak into live vertices' embeddings."""
    rng = np.random.default_rng(1)
    data = random_graph(rng, n=80, m=400, d=F_IN)
    graph = DynamicGraph.from_data(data)
    graph.apply([sg.DeleteVertex(id=int(i)) for i in data.ids[:10]])
    current = graph.to_data()
    model = randomise(ARCHS["pyg-gcn"](2), 0).double()
    hs = layerwise_inference(decompose(model), graph, progress=False, dtype=torch.float64)
    ref = pyg_layers(model, current, torch.float64)[-1]
    assert (hs[-1][graph.slots(current.ids)] - ref).abs().max() < 1e-9


@pytest.mark.parametrize("model, match", [
    (torch.nn.Linear(3, 3), "Linear is not supported"),
    (GNN([GraphConv(4, 4, aggr="std")]), "aggregation 'std' is not supported"),
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


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_model_decomposes_on_the_device_its_weights_are_on(arch):
    """Nothing in decomposition makes a CPU tensor beside the weights: on the meta device
    (shapes without data), as on cuda, a stray CPU tensor raises."""
    on_meta, on_cpu = decompose(ARCHS[arch](2).to("meta")), decompose(ARCHS[arch](2))
    assert [layer.out_dim for layer in on_meta] == [layer.out_dim for layer in on_cpu]


@pytest.mark.parametrize("name", MODELS)
def test_zoo_checkpoint_roundtrip(name, tmp_path):
    data = sg.datasets.synthetic("tiny", seed=1)
    spec = ModelSpec(name, data.num_features, data.num_classes, hidden=16)
    model = randomise(spec.build(), seed=2)
    path = ModelFile(spec, model.state_dict(), dataset="tiny").save(tmp_path / "m.pt")
    loaded = ModelFile.load(path)
    assert loaded.spec == spec
    for a, b in zip(model.state_dict().values(), loaded.model().state_dict().values()):
        assert torch.equal(a, b)
    _check(loaded.model(), data, max_edges=4096)


def test_checkpoint_rejects_foreign_files(tmp_path):
    torch.save({"weights": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a streamgnn checkpoint"):
        ModelFile.load(tmp_path / "x.pt")


def test_bootstrap_comparison_times_both_and_agrees_with_pyg():
    from streamgnn.models.bootstrap import compare_bootstrap

    data = sg.datasets.synthetic("tiny", 0)
    spec = ModelSpec("sage-mean", data.num_features, data.num_classes, 16, 2)
    torch.manual_seed(0)
    model = spec.build().eval()
    report = compare_bootstrap(data, model)
    assert report.max_error < 1e-4
    assert min(report.graph_s, report.layerwise_s, report.pyg_s) > 0
    expected = (pyg_layers(model, data)[-1].argmax(-1).numpy() == data.y).mean()
    assert report.accuracy == pytest.approx(expected)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("paired", [0, 3, 7])
@pytest.mark.parametrize("small", [True, False], ids=["numba-loop", "torch-mm"])
def test_rel_root_pairs_the_first_rows_and_gives_rel_alone_of_the_rest(arch, paired, small,
                                                                       monkeypatch):
    """`Layer.rel_root(h, paired)`: rows 2i, 2i+1 are rel and root of h[i] below
    ``paired``, row ``paired + i`` rel of h[i] from there, against the layer's weights;
    by the small product's loop and by torch's matmul (`small_product.SMALL`)."""
    monkeypatch.setattr(small_product, "SMALL", 1 << 40 if small else 0)
    layers = [layer for layer in decompose(randomise(ARCHS[arch](2), seed=3).double())
              if layer.keeps_preactivation]
    if not layers:
        pytest.skip(f"{arch} keeps no pre-activation")
    layer = layers[0]
    h = torch.randn(7, layer.in_dim, dtype=torch.float64)
    if isinstance(layer, GINLayer):
        rel, root = h, (1 + layer.conv.eps.detach()) * h
    else:
        rel, root = h @ layer.lin_nbr.weight.detach().t(), layer.lin_root(h).detach()
    got = layer.rel_root(h, paired)
    assert got.shape == (7 + paired, rel.shape[1])
    torch.testing.assert_close(got[0:2 * paired:2], rel[:paired])
    torch.testing.assert_close(got[1:2 * paired:2], root[:paired])
    torch.testing.assert_close(got[2 * paired:], rel[paired:])
