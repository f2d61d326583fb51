"""`Checkpoints`: the service's state on disk, written atomically (temporary file, fsync,
rename), so a killed process finds either the previous checkpoint or the new one whole.

A checkpoint holds the model, the engine snapshot (graph, embeddings, states, root terms),
the router's maps, the updates still waiting for a vertex or for their batch, the batch
counter and the consumed offsets of the updates topic: restarting from it and replaying
the topic from those offsets repeats the original run exactly. Must not import kafka or mpi4py.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = "streamgnn-service/2"  # /2: pending updates, engine root terms


class Checkpoints:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / "state.pt"
        for stale in self.directory.glob("*.tmp*"):  # from a process killed mid-write
            stale.unlink()

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, state: dict) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return self.path

    def load(self) -> dict | None:
        """The last checkpoint, or None. It is the service's own file (full pickle)."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if state.get("format") != FORMAT:
            raise ValueError(f"{self.path} is not a {FORMAT} checkpoint (it says "
                             f"{state.get('format')!r}): start with a fresh --state-dir")
        return state
