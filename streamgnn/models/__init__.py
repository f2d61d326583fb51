"""GNN layer specs (message / aggregate / update), PyG model import, the model zoo and
checkpoints, training, layer-wise full inference and its comparison with PyG
(`bootstrap`). Must not import kafka or mpi4py."""

from streamgnn.models.convert import SUPPORTED, decompose
from streamgnn.models.gnn import GNN
from streamgnn.models.inference import layerwise_inference
from streamgnn.models.layers import Layer, layer_from_conv

__all__ = ["GNN", "SUPPORTED", "Layer", "decompose", "layer_from_conv", "layerwise_inference"]
