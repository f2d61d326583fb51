"""A dataset split into partition files (`streamgnn datasets partition`): the owners come
from `placement.initial_owners` over the dataset loaded as the engine loads it, so they are
the owners `Engine(..., partitions=P, placement=...)` starts from on the same graph.

A folder holds ``map.npz`` (``ids`` int64 and their ``part`` int32, ``parts`` and the
``strategy``), removed first and written last (a folder with a map is whole), and
``part-<p>.npz`` per partition: ``ids``, ``x`` and ``y`` (when the dataset has labels) of
the vertices it owns, and ``src``, ``dst`` (external ids) and ``weight`` of the edges
whose destination it owns, in the dataset's order; each also names ``part`` and
``parts``. Plain npz (`npz.write_arrays`), never a pickle.

`Engine.from_partitions` starts an engine from a folder: the coordinator reads the map
(and the feature width and edge count from the files' headers: `sizes`), and each
partition its own file (`bootstrap_files`).

Lives in `workers/` beside the placement it writes out (`datasets/` imports nothing
inside streamgnn but the top level). Must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import errno
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamgnn.datasets import GraphData
from streamgnn.errors import InputError, UserError
from streamgnn.graph import DynamicGraph
from streamgnn.npz import read_arrays, write_arrays
from streamgnn.progress import track
from streamgnn.workers.placement import STRATEGIES, Strategy, initial_owners

MAP = "map"  # map.npz


@dataclass(frozen=True)
class Summary:
    """Per partition: the vertices it owns, the edges it holds (those into them) and the
    ghosts those edges make it hold; overall: the share of edges whose ends two
    partitions own (``cut``) and the largest partition over the mean (``balance``)."""

    vertices: np.ndarray
    edges: np.ndarray
    ghosts: np.ndarray
    cut: float
    balance: float


@dataclass(frozen=True)
class PartitionMap:
    """The owner (``part``) of each vertex ``ids``, of ``parts`` partitions."""

    ids: np.ndarray
    part: np.ndarray
    parts: int
    strategy: str


@dataclass(frozen=True)
class Partition:
    """Partition ``index``'s file (of ``parts``): its vertices (``ids``, ``x``, ``y``) and
    the edges into them (``src``, ``dst``, ``weight``)."""

    index: int
    parts: int
    ids: np.ndarray
    x: np.ndarray
    y: np.ndarray | None
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray


def check_request(parts: int, strategy: str, vertices: int | None = None) -> None:
    """Raises `UserError` for a partition count (1 to 64, at most ``vertices``) or a
    placement the engine does not take."""
    if strategy not in STRATEGIES:
        raise UserError(f"unknown placement {strategy!r}",
                        f"--placement takes one of {', '.join(STRATEGIES)}")
    most = 64 if vertices is None else min(64, vertices)
    if not 1 <= parts <= most:
        count = "" if vertices is None else f" of a graph with {vertices:,} vertices"
        raise UserError(f"cannot make {parts} partitions{count}",
                        f"--parts takes 1 to {most}")


def owners(data: GraphData, parts: int, strategy: Strategy) -> np.ndarray:
    """The partition of each vertex of ``data`` (by position) by ``strategy``."""
    check_request(parts, strategy, data.num_vertices)
    graph = DynamicGraph.from_data(data)  # slot i holds data.ids[i]
    return initial_owners(graph, parts, strategy)[:data.num_vertices]


def summarize(src: np.ndarray, dst: np.ndarray, owner: np.ndarray, parts: int) -> Summary:
    """The `Summary` of the edges ``src -> dst`` (vertex positions) under ``owner`` (the
    partition of each position)."""
    at = owner[dst]
    crossing = owner[src] != at
    held = np.unique(src[crossing] * parts + at[crossing])  # (vertex, holder) pairs
    vertices = np.bincount(owner, minlength=parts)
    return Summary(vertices, np.bincount(at, minlength=parts),
                   np.bincount(held % parts, minlength=parts),
                   float(crossing.mean()) if len(src) else 0.0,
                   float(vertices.max() / vertices.mean()))


def write_partitions(data: GraphData, owner: np.ndarray, parts: int, strategy: Strategy,
                     directory: Path, progress: bool = True) -> Summary:
    """Write ``data`` split by ``owner`` (the partition of each vertex position) into
    ``directory`` (`make_folder`): the part files, then the map. Raises `UserError` when
    the folder cannot be written."""
    src, dst = data.positions(data.src), data.positions(data.dst)
    summary = summarize(src, dst, owner, parts)
    by_owner = np.argsort(owner, kind="stable")
    by_sink = np.argsort(owner[dst], kind="stable")  # each partition's edges in data order
    del src, dst
    vertex_at = np.concatenate([[0], np.cumsum(summary.vertices)])
    edge_at = np.concatenate([[0], np.cumsum(summary.edges)])
    make_folder(directory)
    try:
        (directory / f"{MAP}.npz").unlink(missing_ok=True)  # a folder with a map is whole
        for p in track(range(parts), "writing", "partition", enabled=progress):
            mine = by_owner[vertex_at[p]:vertex_at[p + 1]]
            into = by_sink[edge_at[p]:edge_at[p + 1]]
            arrays = {"part": np.array(p), "parts": np.array(parts), "ids": data.ids[mine],
                      "x": data.x[mine], "src": data.src[into], "dst": data.dst[into],
                      "weight": data.weight[into]}
            if data.y is not None:
                arrays["y"] = data.y[mine]
            write_arrays(directory, f"part-{p}", arrays)
        write_arrays(directory, MAP, {
            "ids": data.ids, "part": owner.astype(np.int32), "parts": np.array(parts),
            "strategy": np.array(strategy)})
    except OSError as e:
        raise _unwritable(directory, e) from None
    return summary


def make_folder(directory: Path) -> None:
    """Create ``directory`` if need be; raises `UserError` when it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(directory, e) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise _unwritable(directory, PermissionError(errno.EACCES, "Permission denied"))


def _unwritable(directory: Path, e: OSError) -> UserError:
    return UserError(f"cannot write the partitions to {directory}: {e.strerror or e}",
                     "give -o a folder you can write to")


def read_map(directory: Path) -> PartitionMap:
    """The map of the partition files in ``directory``."""
    arrays = read_arrays(_existing(Path(directory) / f"{MAP}.npz"))
    return PartitionMap(arrays["ids"], arrays["part"], int(arrays["parts"]),
                        str(arrays["strategy"]))


def partitions_in(directory: Path) -> int:
    """The number of partitions of the files in ``directory`` (read from the map alone)."""
    with np.load(_existing(Path(directory) / f"{MAP}.npz"), allow_pickle=False) as npz:
        return int(npz["parts"])


def read_partition(directory: Path, p: int) -> Partition:
    """Partition ``p``'s file in ``directory`` (one of the map's partitions)."""
    directory = Path(directory)
    parts = partitions_in(directory)
    if not 0 <= p < parts:
        raise InputError(f"{directory} holds partitions 0 to {parts - 1}, not {p}")
    arrays = read_arrays(_existing(directory / f"part-{p}.npz"))
    if int(arrays["part"]) != p or int(arrays["parts"]) != parts:
        raise InputError(f"{directory}/part-{p}.npz is not partition {p} of {parts}",
                         "write the folder again with `streamgnn datasets partition`")
    return Partition(p, parts, arrays["ids"], arrays["x"], arrays.get("y"), arrays["src"],
                     arrays["dst"], arrays["weight"])


def sizes(directory: Path, parts: int) -> tuple[int, int]:
    """The feature width and the number of edges of the ``parts`` partition files in
    ``directory``, from the arrays' headers alone (the coordinator reads no partition)."""
    directory = Path(directory)
    width = _shape(directory / "part-0.npz", "x")[1]
    return width, sum(_shape(directory / f"part-{p}.npz", "src")[0] for p in range(parts))


def _shape(path: Path, name: str) -> tuple[int, ...]:
    """The shape of array ``name`` in the npz file ``path``, read from its header."""
    with zipfile.ZipFile(_existing(path)) as npz, npz.open(f"{name}.npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if major == 1
                else np.lib.format.read_array_header_2_0)
        return read(f)[0]


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"no partition file {path}",
                         "write it with `streamgnn datasets partition ... -o FOLDER`")
    return path
