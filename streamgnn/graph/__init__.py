"""The dynamic graph store: external <-> internal ids, in/out adjacency with weights,
features, and atomic batches of updates. Must not import torch, kafka or mpi4py."""

from streamgnn.graph.adjacency import pair_keys
from streamgnn.graph.store import DynamicGraph, EdgeLog, GraphDiff

__all__ = ["DynamicGraph", "EdgeLog", "GraphDiff", "pair_keys"]
