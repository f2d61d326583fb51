"""Plain arrays, never pickles: a dict of numpy arrays as one ``.npz`` file, written
atomically (temporary name, fsync, rename) with a manifest entry naming its size and
SHA-256, and read back without unpickling anything (what checkpoints are made of); and as
one message between processes (what MPI commands are made of): a JSON layout, then each
array's bytes at a 64-byte aligned offset, so packing copies each array once and
unpacking copies nothing (the arrays are views into the message).
Must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import hashlib
import json
import math
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


_ALIGN = 64  # bytes: every array of a message starts at a multiple of this


def to_bytes(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """``arrays`` as one message in a uint8 array: the layout's length (8 bytes), the
    layout (JSON: each array's name, dtype, shape and offset), then the arrays; no bytes
    at all for no arrays."""
    if not arrays:
        return np.zeros(0, np.uint8)
    arrays = {name: np.asarray(a, order="C") for name, a in arrays.items()}
    layout, size = [], 0
    for name, a in arrays.items():
        plain(a.dtype, name)
        layout.append({"name": name, "dtype": a.dtype.str, "shape": a.shape, "at": size})
        size += _aligned(a.nbytes)
    head = json.dumps(layout).encode()
    start = _aligned(8 + len(head))
    out = np.zeros(start + size, np.uint8)  # (the padding stays zero)
    out[:8 + len(head)] = np.frombuffer(len(head).to_bytes(8, "little") + head, np.uint8)
    for entry, a in zip(layout, arrays.values(), strict=True):
        if a.nbytes:
            at = start + entry["at"]
            out[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
    return out


def from_bytes(buffer: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays `to_bytes` packed, as views into ``buffer`` (none for an empty one)."""
    if not len(buffer):
        return {}
    n = int.from_bytes(buffer[:8].tobytes(), "little")
    start = _aligned(8 + n)
    out = {}
    for entry in json.loads(buffer[8:8 + n].tobytes()):
        dtype, shape = np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"])
        plain(dtype, entry["name"])
        at = start + int(entry["at"])
        nbytes = math.prod(shape) * dtype.itemsize  # (np.prod makes an array of it first)
        if entry["at"] < 0 or min(shape, default=0) < 0 or at + nbytes > len(buffer):
            raise ValueError(f"array {entry['name']!r} lies outside the message")
        out[entry["name"]] = buffer[at:at + nbytes].view(dtype).reshape(shape)
    return out


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def plain(dtype: np.dtype, name: str) -> None:
    """Only plain numbers travel: an array of Python objects would need pickling, and a
    record's fields would not survive ``dtype.str``."""
    if dtype.hasobject:
        raise TypeError(f"array {name!r} holds Python objects ({dtype}): not a plain array")
    if dtype.names is not None:
        raise TypeError(f"array {name!r} has fields ({dtype}): not a plain array")


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
