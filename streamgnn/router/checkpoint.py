"""`Checkpoints`: the service's state on disk as data, never pickles: numbered generations
``gen-000012/``, each a set of ``.npz`` array files (loaded with ``allow_pickle=False``) and
a ``manifest.json`` written last, naming every file with its size and SHA-256 beside the
small JSON state. A generation without its manifest, or whose files do not match it (a
process killed mid-write, a torn or altered file), is not complete: loading skips it and
takes the newest complete one. Every file is written to a temporary name, fsync'd and
renamed; the last ``keep`` complete generations are kept.

Files of one generation may come from different processes (`write_arrays`, one shard per
rank; `streamgnn.npz`); `commit` makes the set complete. Must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamgnn.npz import read_arrays, sha256

FORMAT = "streamgnn-state/4"  # /4: float32 sum states with rounding bounds; /3: npz files
MANIFEST = "manifest.json"


@dataclass
class Saved:
    """A complete generation: its number, folder, JSON state and the array files loaded
    (by name; every file of the generation was checked against the manifest)."""

    generation: int
    folder: Path
    meta: dict
    files: dict[str, dict[str, np.ndarray]]


class CorruptCheckpointError(ValueError):
    """A generation's file does not match its manifest."""


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep
        for stale in self.directory.glob("gen-*/*.tmp*"):  # from a process killed mid-write
            stale.unlink()

    def generations(self) -> list[int]:
        """Generation numbers present (complete or not), ascending."""
        return sorted(int(p.name[4:]) for p in self.directory.glob("gen-*")
                      if p.name[4:].isdigit())

    def folder(self, generation: int) -> Path:
        return self.directory / f"gen-{generation:06d}"

    def next_generation(self) -> int:
        return max(self.generations(), default=0) + 1

    def begin(self) -> int:
        """A new generation's number, its folder made: write its files there
        (`write_arrays`, from any process), then `commit`."""
        generation = self.next_generation()
        self.folder(generation).mkdir(parents=True, exist_ok=True)
        return generation

    def commit(self, generation: int, meta: dict, entries: list[dict]) -> None:
        """Write the manifest that makes ``generation`` complete, then drop generations
        older than the last ``keep`` complete ones."""
        folder = self.folder(generation)
        manifest = {"format": FORMAT, "generation": generation, "files": entries,
                    "state": meta}
        tmp = folder / f"{MANIFEST}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
        _fsync_dir(folder)
        kept = self.kept()
        for g in self.generations():
            if g < generation and g not in kept:
                shutil.rmtree(self.folder(g), ignore_errors=True)

    def kept(self) -> list[int]:
        """The last ``keep`` generations that have a manifest, ascending."""
        return [g for g in self.generations() if (self.folder(g) / MANIFEST).exists()
                ][-self.keep:]

    def load(self, names: Collection[str] | None = None) -> Saved | None:
        """The newest complete generation (every file checked, only those ``names``
        loaded, if given), or None if there is none. Incomplete or corrupt ones are
        skipped with a warning naming them; a manifest of another format raises
        ValueError (start with a fresh state directory)."""
        for generation in reversed(self.generations()):
            try:
                return self._load(generation, names)
            except CorruptCheckpointError as e:
                warnings.warn(f"{e}; using the previous complete checkpoint", stacklevel=2)
        return None

    def _load(self, generation: int, names: Collection[str] | None = None) -> Saved:
        folder = self.folder(generation)
        path = folder / MANIFEST
        if not path.exists():
            raise CorruptCheckpointError(f"{folder} is incomplete (no manifest)")
        try:
            manifest = json.loads(path.read_text())
        except ValueError as e:
            raise CorruptCheckpointError(f"{path} is not JSON ({e})") from None
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} checkpoint (it says "
                             f"{manifest.get('format')!r}): start with a fresh --state-dir")
        files = {}
        for entry in manifest["files"]:
            file = folder / f"{entry['name']}.npz"
            if not file.exists() or file.stat().st_size != entry["bytes"] or (
                    sha256(file) != entry["sha256"]):
                raise CorruptCheckpointError(f"{file} is missing or does not match its "
                                             "manifest (size or SHA-256)")
            if names is None or entry["name"] in names:
                files[entry["name"]] = read_arrays(file)
        return Saved(generation, folder, manifest["state"], files)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
