"""Rank 0's own memory when it starts from partition files: `Engine.from_partitions` with
workers that bootstrap elsewhere (here: nowhere), so the process holds what rank 0 holds
(the model, the directory read from map.npz) and nothing of the workers'. Prints the
vertices, the directory's bytes and the peak RSS before and after.

    python benchmarks/rank0.py DIR     # DIR from `streamgnn datasets partition ... -o DIR`
"""
from __future__ import annotations

import argparse
import resource
from pathlib import Path

from torch_geometric.nn import GraphConv

from streamgnn.models import GNN
from streamgnn.workers.engine import Engine
from streamgnn.workers.partition_files import read_map, sizes


class Elsewhere:
    """Workers that bootstrap from the files where they live: not in this process."""

    max_in_flight = 2

    def __init__(self, size: int) -> None:
        self.size = size

    def bootstrap_files(self, folder: Path, recompute: bool) -> None:
        pass


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    folder = parser.parse_args().folder
    parts = read_map(folder).parts
    features, _ = sizes(folder, parts)
    model = GNN([GraphConv(features, 128), GraphConv(128, 47)])  # GraphConv sum, 2 layers
    before = peak_mb()
    engine = Engine.from_partitions(model, folder, workers=Elsewhere(parts))
    print(f"{engine.num_vertices:,} vertices in {parts} partitions; directory "
          f"{engine.directory.nbytes / 1e6:.1f} MB; rank 0 peak RSS {before:.0f} MB before, "
          f"{peak_mb():.0f} MB after")


if __name__ == "__main__":
    main()
