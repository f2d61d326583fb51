"""Named model architectures (what ``streamgnn train --model NAME`` builds) and
checkpoints that record the architecture next to the weights.

Owns names -> modules and the checkpoint format; must not import kafka or mpi4py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import torch
from torch_geometric.nn import GraphConv
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from streamgnn.models.gnn import GNN

MODELS = ("gcn", "sage-mean", "sage-sum", "sage-max", "sage-min", "graphconv-sum",
          "graphconv-mean", "graphconv-max", "graphconv-min", "gin", "gat")
CHECKPOINT_FORMAT = "streamgnn-checkpoint/1"


@dataclass
class ModelSpec:
    name: str
    in_dim: int
    out_dim: int
    hidden: int = 128
    num_layers: int = 2
    heads: int = 4

    def build(self) -> torch.nn.Module:
        """A freshly initialised module of this architecture."""
        n, i, h, o, L = self.name, self.in_dim, self.hidden, self.out_dim, self.num_layers
        if n == "gcn":
            return GCN(i, h, L, o)
        if n.startswith("sage-"):
            return GraphSAGE(i, h, L, o, aggr=n.removeprefix("sage-"))
        if n.startswith("graphconv-"):
            aggr = {"sum": "add"}.get(n.removeprefix("graphconv-"), n.removeprefix("graphconv-"))
            dims = [i] + [h] * (L - 1) + [o]
            return GNN([GraphConv(a, b, aggr=aggr) for a, b in pairwise(dims)])
        if n == "gin":
            return GIN(i, h, L, o)
        if n == "gat":
            return GAT(i, h, L, o, heads=self.heads)  # the last layer averages its heads
        raise ValueError(f"unknown model {n!r}; choose one of {', '.join(MODELS)}")


@dataclass
class Checkpoint:
    spec: ModelSpec
    state_dict: dict
    dataset: str = ""
    metrics: dict = field(default_factory=dict)

    def model(self) -> torch.nn.Module:
        """The trained module, in eval mode."""
        module = self.spec.build()
        module.load_state_dict(self.state_dict)
        return module.eval()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": CHECKPOINT_FORMAT, "spec": asdict(self.spec),
                    "state_dict": self.state_dict, "dataset": self.dataset,
                    "metrics": self.metrics}, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Checkpoint:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a streamgnn checkpoint ({CHECKPOINT_FORMAT})")
        return cls(ModelSpec(**raw["spec"]), raw["state_dict"], raw["dataset"], raw["metrics"])


