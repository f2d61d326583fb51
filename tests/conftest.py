"""Shared test helpers: hypothesis profile, small graphs, and PyG reference forward passes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

import streamgnn as sg
from streamgnn.models.gnn import WEIGHTED_CONVS, takes_edge_weights

settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.load_profile("ci")
torch.set_num_threads(1)


def random_graph(rng: np.random.Generator, n: int, m: int, d: int, hubs: int = 2,
                 classes: int = 3) -> sg.GraphData:
    """A simple directed graph with a few hubs and some isolated vertices; sparse ids."""
    ids = rng.choice(10 * n + 10, size=n, replace=False).astype(np.int64)
    popular = np.ones(n)
    popular[rng.choice(n, size=min(hubs, n), replace=False)] = 20.0
    src = rng.integers(0, n, m)
    dst = rng.choice(n, size=m, p=popular / popular.sum())
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, classes, n)
    w = rng.uniform(0.2, 2.0, m).astype(np.float32)
    with warnings.catch_warnings():  # the random edges repeat some pairs: expected
        warnings.simplefilter("ignore", UserWarning)
        return sg.GraphData.cleaned(ids=ids, src=ids[src], dst=ids[dst], x=x, y=y, weight=w)


def pyg_layers(model: torch.nn.Module, data: sg.GraphData,
               dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Each layer's output of ``model`` on ``data`` computed by PyG's own modules (rows in
    ``data.ids`` order): the conv forward passes plus the model's inter-layer activation
    and norm; the last entry is checked against ``model(...)`` itself."""
    g = data.to_pyg()
    x, ei, w = g.x.to(dtype), g.edge_index, g.edge_weight.to(dtype)
    model = model.to(dtype).eval()
    outs = [x]
    with torch.no_grad():
        for i in range(len(model.convs)):
            outs.append(pyg_step(model, i, outs[-1], ei, w))
        full = model(x, ei, edge_weight=w if takes_edge_weights(model) else None)
    torch.testing.assert_close(full, outs[-1], rtol=0, atol=0)
    return outs

def pyg_step(model: torch.nn.Module, i: int, h: torch.Tensor, ei: torch.Tensor,
             w: torch.Tensor) -> torch.Tensor:
    """Layer ``i`` of ``model`` by PyG's own modules: the conv, then (but after the last)
    the model's activation and norm."""
    convs = list(model.convs)
    conv = convs[i]
    with torch.no_grad():
        h = conv(h, ei, w) if isinstance(conv, WEIGHTED_CONVS) else conv(h, ei)
        if i < len(convs) - 1:
            norm = list(getattr(model, "norms", [torch.nn.Identity()] * len(convs)))[i]
            act_first = getattr(model, "act_first", False)
            if model.act is not None and act_first:
                h = model.act(h)
            h = norm(h)
            if model.act is not None and not act_first:
                h = model.act(h)
    return h


@pytest.fixture
def device_kernels(monkeypatch):
    """`force_device_kernels` for the test."""
    force_device_kernels(monkeypatch)


def force_device_kernels(monkeypatch) -> None:
    """Every kernel a CUDA engine runs, on CPU: the torch twins instead of the numba loops,
    GAT pulls edge by edge, max/min pulls edge by edge instead of torch's CPU-only sparse
    reduce, a superstep's steps before its product one by one (`_one_kernel`), products
    by torch, never by the CPU's small-product loop, tables grown by a copy as on a
    device, and linear layers at one partition planned (`planned.on_cpu`). Left for a
    GPU: where tensors live, and the engine's one row reduction (`_argmax_rows`), which
    branches on the device inside."""
    from streamgnn.models import extremum_ops, inference, layers, rowops, softmax_ops
    from streamgnn.workers import fold, halo, planned, tables

    for module, names in ((rowops, ("combine_rows", "fold_rows", "store_rows", "compare_rows",
                                    "difference_table", "activated_rows", "merge_rows", "fill_rows",
                                    "take_rows")),
                          (halo, ("take_ghost_rows", "gather_rows")),
                          (softmax_ops, ("fold_softmax", "attend_with_self_loop")),
                          (extremum_ops, ("fold_max", "pull_max_columns"))):
        for name in names:
            monkeypatch.setattr(module, f"{name}_numba", getattr(module, f"{name}_torch"))
    monkeypatch.setattr(layers.GATLayer, "reduce_csr", lambda self, *args: None)
    spmm = inference.aggregate_spmm

    def sum_only(layer, t, ptr, src, w, scale):
        assert layer.aggr.spmm == "sum", "off CPU, only sums take the sparse product"
        return spmm(layer, t, ptr, src, w, scale)

    monkeypatch.setattr(inference, "aggregate_spmm", sum_only)
    monkeypatch.setattr(inference, "_reduces_on_cpu", lambda t: False)
    monkeypatch.setattr(fold, "_one_kernel", lambda device: False)
    monkeypatch.setattr(layers, "is_small", lambda multiply_adds: False)
    monkeypatch.setattr(tables, "_grown", _grown_as_on_a_device)
    monkeypatch.setattr(planned, "on_cpu", True)


def _grown_as_on_a_device(t: torch.Tensor, size: int) -> torch.Tensor:
    """`tables._grown` off the CPU: a copy with ``size`` rows, the new ones zero (the
    CPU's grows its mapping in place, through a host view the crossings count)."""
    out = t.new_zeros((size, *t.shape[1:]))
    out[:len(t)] = t
    return out


from tests.kafka_fixtures import (  # noqa: E402, F401  (fixtures for every test module)
    broker,
    kafka,
    topics,
    validating_broker,
)
