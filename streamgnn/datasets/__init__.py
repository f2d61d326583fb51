"""Graph snapshots (`GraphData`), synthetic presets, loaders for files a user already has,
and the snapshot + stream split. Must not import kafka or mpi4py."""

from streamgnn.datasets.graph_data import GraphData
from streamgnn.datasets.io import (
    load,
    load_edge_list,
    load_ogb_node_dir,
    open_dataset,
    save,
)
from streamgnn.datasets.presets import PRESETS, synthetic
from streamgnn.datasets.stream_split import split_stream

__all__ = ["PRESETS", "GraphData", "load", "load_edge_list", "load_ogb_node_dir",
           "open_dataset", "save", "split_stream", "synthetic"]
