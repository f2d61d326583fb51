"""Named model architectures (what ``streamgnn train --model NAME`` builds) and
checkpoints that record the architecture next to the weights.

Owns names -> modules and the checkpoint format; must not import kafka or mpi4py.
"""

from __future__ import annotations

import pickle
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch_geometric.nn import GraphConv
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from streamgnn.errors import InputError
from streamgnn.models.gnn import GNN

if TYPE_CHECKING:
    from streamgnn.datasets import GraphData

MODELS = ("gcn", "sage-mean", "sage-sum", "sage-max", "sage-min", "graphconv-sum",
          "graphconv-mean", "graphconv-max", "graphconv-min", "gin", "gat")
CHECKPOINT_FORMAT = "streamgnn-checkpoint/1"


def check_model_name(name: str) -> None:
    """Raise `InputError` listing the choices unless ``name`` is one of `MODELS`."""
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}", f"choose one of {', '.join(MODELS)} "
                         "(--model)")


@dataclass
class ModelSpec:
    name: str
    in_dim: int
    out_dim: int
    hidden: int = 128
    num_layers: int = 2
    heads: int = 4

    def __post_init__(self) -> None:
        check_model_name(self.name)

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
        # gat: `check_model_name` let no other name in
        return GAT(i, h, L, o, heads=self.heads)  # the last layer averages its heads


@dataclass
class ModelFile:
    spec: ModelSpec
    state_dict: dict
    dataset: str = ""
    metrics: dict = field(default_factory=dict)

    def model(self) -> torch.nn.Module:
        """The trained module, in eval mode."""
        module = self.spec.build()
        module.load_state_dict(self.state_dict)
        return module.eval()

    def model_for(self, data: GraphData, dataset: str) -> torch.nn.Module:
        """The trained module, once checked to fit ``data`` (the user's ``--dataset``):
        its feature width, and classes enough for the labels of ``data``; else
        `InputError` naming both numbers."""
        spec, trained = self.spec, f" (trained on {self.dataset})" if self.dataset else ""
        hint = ("use the --dataset it was trained on, or train a model on this one: "
                f"`streamgnn train --dataset {dataset}`")
        if spec.in_dim != data.num_features:
            raise InputError(f"the model{trained} takes {spec.in_dim} features per vertex, "
                             f"--dataset {dataset} has {data.num_features}", hint)
        if spec.out_dim < data.num_classes:
            raise InputError(f"the model{trained} predicts {spec.out_dim} classes, "
                             f"--dataset {dataset} has {data.num_classes}", hint)
        return self.model()

    def same_model(self, other: ModelFile) -> bool:
        """Whether ``other`` is this model: the same architecture and the same weights."""
        return self.spec == other.spec and self.state_dict.keys() == other.state_dict.keys() \
            and all(torch.equal(t, other.state_dict[k]) for k, t in self.state_dict.items())

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": CHECKPOINT_FORMAT, "spec": asdict(self.spec),
                    "state_dict": self.state_dict, "dataset": self.dataset,
                    "metrics": self.metrics}, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ModelFile:
        """A model file written by `save`; raises `InputError` for a missing file or one
        of another kind (a PyTorch model or state dict of its own, not a model file)."""
        make = f"`streamgnn train --dataset DATASET --out {path}` writes a model file"
        other = InputError(f"{path} is not a streamgnn checkpoint ({CHECKPOINT_FORMAT}, "
                           "the model file `streamgnn train` writes)", make)
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise InputError(f"model file {path} does not exist", make) from None
        except OSError as e:
            raise InputError(f"cannot read model file {path}: {e.strerror}", make) from None
        except (EOFError, RuntimeError, ValueError, pickle.UnpicklingError):
            raise other from None
        if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
            raise other
        return cls(ModelSpec(**raw["spec"]), raw["state_dict"], raw["dataset"], raw["metrics"])


