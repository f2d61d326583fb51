"""Reading and writing graphs a user already has: streamgnn's own npz files, an edge-list
CSV with a features .npy, and an OGB node-property directory.

Owns file formats only; must not import kafka or mpi4py.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from streamgnn.datasets.graph_data import GraphData
from streamgnn.errors import InputError


def save(data: GraphData, path: str | Path) -> Path:
    """Write ``data`` to a compressed ``.npz`` file."""
    path = Path(path)
    arrays = dict(ids=data.ids, src=data.src, dst=data.dst, x=data.x, weight=data.weight,
                  name=np.array(data.name))
    if data.y is not None:
        arrays["y"] = data.y
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def load(path: str | Path) -> GraphData:
    """Read a graph written by :func:`save`; raises `InputError` for a missing file or one
    of another kind."""
    try:
        with np.load(path) as z:
            return GraphData(ids=z["ids"], src=z["src"], dst=z["dst"], x=z["x"],
                             y=z.get("y"), weight=z["weight"],
                             name=str(z["name"]))
    except FileNotFoundError:
        raise InputError(f"dataset file {path} does not exist", _WRITE_ONE.format(
            path=path)) from None
    except OSError as e:
        raise InputError(f"cannot read dataset file {path}: {e.strerror}",
                         _WRITE_ONE.format(path=path)) from None
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile):
        raise InputError(f"{path} is not a streamgnn dataset file (arrays ids, src, dst, x, "
                         "weight)", _WRITE_ONE.format(path=path)) from None


_WRITE_ONE = "`streamgnn datasets generate tiny --out {path}` writes a dataset file"


def load_edge_list(edges_csv: str | Path, features_npy: str | Path,
                   labels_npy: str | Path | None = None, ids_npy: str | Path | None = None,
                   delimiter: str = ",") -> GraphData:
    """An edge list (``src,dst[,weight]`` per line; a non-numeric header line is skipped)
    plus a features array (row i is vertex ``ids[i]``, or vertex i without ``ids_npy``).
    Self-loops and parallel edges are dropped with a warning."""
    table = _read_table(edges_csv, delimiter)
    if table.shape[1] not in (2, 3):
        raise ValueError(f"{edges_csv}: expected 2 or 3 columns (src, dst[, weight]), "
                         f"got {table.shape[1]}")
    x = np.load(features_npy)
    ids = np.load(ids_npy) if ids_npy is not None else np.arange(len(x), dtype=np.int64)
    y = np.load(labels_npy).reshape(-1) if labels_npy is not None else None
    weight = table[:, 2] if table.shape[1] == 3 else None
    return GraphData.cleaned(ids=ids, src=table[:, 0].astype(np.int64),
                             dst=table[:, 1].astype(np.int64), x=x, y=y, weight=weight,
                             name=Path(edges_csv).stem)


def load_ogb_node_dir(root: str | Path) -> GraphData:
    """An OGB node-property dataset directory already on disk (e.g. ``ogbn_arxiv``): reads
    ``raw/edge.csv.gz``, ``raw/node-feat.csv.gz`` and ``raw/node-label.csv.gz``. Vertex ids
    are the row numbers. Missing labels raise: every vertex needs a class."""
    raw = Path(root) / "raw"
    for name in ("edge.csv.gz", "node-feat.csv.gz"):
        if not (raw / name).exists():
            raise InputError(f"{raw / name} not found: {root} is not an OGB node dataset",
                             "an OGB node dataset directory holds raw/edge.csv.gz and "
                             "raw/node-feat.csv.gz")
    edges = _read_table(raw / "edge.csv.gz", ",").astype(np.int64)
    x = _read_table(raw / "node-feat.csv.gz", ",").astype(np.float32)
    y = None
    if (raw / "node-label.csv.gz").exists():
        labels = _read_table(raw / "node-label.csv.gz", ",").reshape(-1)
        if np.isnan(labels).any():
            raise ValueError(f"{raw / 'node-label.csv.gz'}: some labels are missing (NaN)")
        y = labels.astype(np.int64)
    return GraphData.cleaned(ids=np.arange(len(x), dtype=np.int64), src=edges[:, 0],
                             dst=edges[:, 1], x=x, y=y, name=Path(root).name)


def _read_table(path: str | Path, delimiter: str) -> np.ndarray:
    """A numeric table (``.gz`` transparently); one non-numeric header line is skipped."""
    try:
        table = np.loadtxt(path, delimiter=delimiter, dtype=np.float64, ndmin=2)
    except ValueError:
        table = np.loadtxt(path, delimiter=delimiter, dtype=np.float64, ndmin=2, skiprows=1)
    return table


def open_dataset(name_or_path: str, seed: int = 0) -> GraphData:
    """A synthetic preset by name, a file written by :func:`save` (``.npz``), or an OGB
    node-property directory; raises `InputError` naming the choices for anything else."""
    from streamgnn.datasets.presets import PRESETS, synthetic

    if name_or_path in PRESETS:
        return synthetic(name_or_path, seed)
    path = Path(name_or_path)
    if path.is_dir():
        return load_ogb_node_dir(path)
    if path.suffix == ".npz":
        return load(path)
    raise InputError(f"unknown dataset {name_or_path!r}: it is neither a preset, a .npz "
                     "file nor an OGB dataset directory",
                     f"choose a preset ({', '.join(PRESETS)}), a .npz file written by "
                     "`streamgnn datasets generate`, or an OGB node dataset directory")
