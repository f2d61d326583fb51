"""The bootstrap measured: every layer's embedding of every vertex by layer-wise full
inference, timed and checked against PyG's own forward pass (what `streamgnn bootstrap`
and the demo report).

Owns that comparison only; must not import kafka or mpi4py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from streamgnn.datasets import GraphData
from streamgnn.graph import DynamicGraph
from streamgnn.models.convert import decompose
from streamgnn.models.gnn import pyg_forward
from streamgnn.models.inference import layerwise_inference


@dataclass(frozen=True)
class BootstrapReport:
    """Seconds of each step, the largest difference to PyG, and the accuracy of the
    bootstrapped labels over all vertices (None without labels)."""

    graph_s: float
    layerwise_s: float
    pyg_s: float
    max_error: float
    accuracy: float | None


def compare_bootstrap(data: GraphData, model: torch.nn.Module,
                      device: str = "cpu") -> BootstrapReport:
    """Load ``data`` into the graph store, run layer-wise inference of ``model`` over it,
    and PyG's forward pass of the same model, timing each."""
    t = time.perf_counter()
    graph = DynamicGraph.from_data(data)
    graph_s = time.perf_counter() - t
    model = model.to(device)
    t = time.perf_counter()
    hs = layerwise_inference(decompose(model), graph, device=device)
    layerwise_s = time.perf_counter() - t
    t = time.perf_counter()
    ref = pyg_forward(model, data, device)
    pyg_s = time.perf_counter() - t
    accuracy = None
    if data.y is not None:
        y = torch.from_numpy(data.y).to(device)
        accuracy = (hs[-1].argmax(-1) == y).float().mean().item()
    return BootstrapReport(graph_s, layerwise_s, pyg_s, (hs[-1] - ref).abs().max().item(),
                           accuracy)
