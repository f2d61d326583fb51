"""Rank 0's own memory when it starts from partition files: `Engine.from_partitions` with
workers that bootstrap elsewhere (here: nowhere), so the process holds what rank 0 holds
(the model, the directory read from map.npz) and nothing of the workers'. Prints the
vertices, the directory's bytes and the peak RSS before and after. With ``--sizes``, the
directory alone at each size (millions of vertices, random ids and owners, P = 4): its
bytes a vertex as built, then the most and the least after any of the batches of 10,000
new vertices that add a quarter more (its arrays growing on the way).

    python benchmarks/rank0.py DIR     # DIR from `streamgnn datasets partition ... -o DIR`
    python benchmarks/rank0.py --sizes 0.17 0.3 0.5 1 2 3 5 10
"""
from __future__ import annotations

import argparse
import resource
from pathlib import Path

import numpy as np
from torch_geometric.nn import GraphConv

from streamgnn.graph.directory import Directory
from streamgnn.models import GNN
from streamgnn.updates import ADD_VERTEX, UpdateBatch
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


def directory_bytes(millions: float) -> tuple[int, float, list[float]]:
    """Vertices, the directory's bytes a vertex as built and after each batch adding new
    ones, a quarter more in all."""
    rng = np.random.default_rng(0)
    n = int(millions * 1e6)
    ids = rng.permutation(n + n // 4).astype(np.int64) * 7 + 3  # the last quarter: added
    directory = Directory(ids[:n], rng.integers(0, 4, n), 4, 0, strategy="hash")
    built, grown = directory.nbytes / n, []
    for at in range(n, len(ids), 10_000):
        new = ids[at:at + 10_000]
        k = len(new)
        batch = UpdateBatch(np.full(k, ADD_VERTEX), new, np.zeros(k, np.int64),
                            np.zeros(k, np.float32), np.zeros(k, np.int64),
                            np.zeros((1, 0), np.float32))
        directory.commit(directory.decide(batch))
        grown.append(directory.nbytes / directory.num_vertices)
    return n, built, grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--sizes", type=float, nargs="+", metavar="MILLIONS",
                        help="the directory alone at these sizes, in millions of vertices")
    args = parser.parse_args()
    if args.sizes:
        for millions in args.sizes:
            n, built, grown = directory_bytes(millions)
            print(f"{n:>11,} vertices: {built:.2f} bytes a vertex built; adding {n // 4:,} "
                  f"more, {min(grown):.2f}-{max(grown):.2f}", flush=True)
        return
    if args.folder is None:
        parser.error("a folder of partition files, or --sizes")
    folder = args.folder
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
