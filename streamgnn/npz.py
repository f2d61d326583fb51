"""Plain-array files: a dict of numpy arrays as one ``.npz`` file, written atomically
(temporary name, fsync, rename) with a manifest entry naming its size and SHA-256, and
read back without unpickling anything; the same as bytes for messages between processes.
What checkpoints and MPI commands are made of. Must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np


def write_arrays(directory: Path, name: str, arrays: dict[str, np.ndarray]) -> dict:
    """Write ``arrays`` to ``directory/name.npz`` (temporary name, fsync, rename); returns
    the manifest entry naming it."""
    path = directory / f"{name}.npz"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"name": name, "bytes": path.stat().st_size, "sha256": sha256(path)}


def read_arrays(path: Path | BinaryIO) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (never unpickling anything)."""
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def to_bytes(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """``arrays`` as the bytes of an ``.npz`` file, in a uint8 array (a message)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return np.frombuffer(buffer.getbuffer(), np.uint8)


def from_bytes(buffer: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays `to_bytes` packed (none for an empty buffer)."""
    return read_arrays(io.BytesIO(buffer.tobytes())) if len(buffer) else {}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def prefixed(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` under names ``prefix + name`` (one file holding several parts)."""
    return {prefix + k: a for k, a in arrays.items()}


def under(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The part of ``arrays`` named ``prefix + name``, by ``name`` (`prefixed` undone)."""
    return {k.removeprefix(prefix): a for k, a in arrays.items() if k.startswith(prefix)}
