"""Full-batch training of a named architecture on a snapshot, next to an MLP on the same
features (how much the graph adds), with a seeded train/val/test split.

Owns training only; must not import kafka or mpi4py.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import MLP
from torch_geometric.utils import to_torch_csr_tensor

from streamgnn.datasets import GraphData
from streamgnn.models.gnn import takes_edge_weights
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.progress import track


@dataclass
class Accuracy:
    train: float
    val: float
    test: float


@dataclass
class TrainResult:
    model_file: ModelFile
    gnn: Accuracy
    mlp: Accuracy
    seconds: float


def split_masks(n: int, seed: int = 0, train: float = 0.6,
                val: float = 0.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    a, b = int(train * n), int((train + val) * n)
    masks = []
    for part in (perm[:a], perm[a:b], perm[b:]):
        m = torch.zeros(n, dtype=torch.bool)
        m[part] = True
        masks.append(m)
    return masks[0], masks[1], masks[2]


def train(data: GraphData, spec: ModelSpec, epochs: int = 100, lr: float = 0.01,
          seed: int = 0, progress: bool = True) -> TrainResult:
    """Train ``spec`` (and an MLP baseline) on ``data``; keeps the best-validation weights."""
    if data.y is None:
        raise ValueError(f"{data.name} has no labels to train on")
    torch.manual_seed(seed)
    g = data.to_pyg()
    masks = split_masks(data.num_vertices, seed)
    start = time.perf_counter()
    model = spec.build()
    # A sparse adjacency (rows = destinations): PyG's fused sparse-dense products, quicker
    # than edge-wise gather/scatter here and the same function.
    weight = g.edge_weight if takes_edge_weights(model) else None
    with warnings.catch_warnings():  # torch: "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        adj_t = to_torch_csr_tensor(g.edge_index.flip(0), weight,
                                    size=(data.num_vertices, data.num_vertices))
    gnn_acc, best = _fit(model, lambda m: m(g.x, adj_t), g.y, masks, epochs, lr, progress,
                         spec.name)
    seconds = time.perf_counter() - start
    mlp = MLP([data.num_features, spec.hidden, data.num_classes], dropout=0.5)
    mlp_acc, _ = _fit(mlp, lambda m: m(g.x), g.y, masks, epochs, lr, progress, "mlp")
    model_file = ModelFile(spec, best, dataset=data.name,
                      metrics={"gnn": vars(gnn_acc), "mlp": vars(mlp_acc), "epochs": epochs})
    return TrainResult(model_file, gnn_acc, mlp_acc, seconds)


def _fit(model, forward, y, masks, epochs, lr, progress, label) -> tuple[Accuracy, dict]:
    train_m = masks[0]
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    best_val, best_acc, best_state = -1.0, None, None
    for _ in track(range(epochs), f"train {label}", "epoch", enabled=progress):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(forward(model)[train_m], y[train_m])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = forward(model).argmax(-1)
        acc = Accuracy(*(float((pred[m] == y[m]).float().mean()) for m in masks))
        if acc.val > best_val:
            best_val, best_acc = acc.val, acc
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.eval()
    return best_acc, best_state
