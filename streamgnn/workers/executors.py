"""Executors for the dense work of a query batch (the coordinator's side of `query.run`:
transforms, partial aggregates over the rows computed for the query, merges, updates):
the same code on every device, the device a parameter. `Executors.pick` chooses one per
query batch from its expected computation-graph size, the in-edges of every vertex it
recomputes (Quiver's PSGS idea: the work is known from degrees before any of it is
done), against the threshold `streamgnn calibrate` measured (`Calibration`): below it
a GPU's launch and copy costs outweigh its speed. With one device there is one choice.

Owns executor choice; must not import kafka or mpi4py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from streamgnn.models import decompose
from streamgnn.models.layers import Layer


@dataclass
class Calibration:
    """``cuda_from``: the work (in-edges aggregated) from which a query batch runs
    quicker on cuda than on cpu, None where cuda never won or is absent; ``measured``:
    the (work, cpu ms, cuda ms or None) points it came from."""

    cuda_from: int | None = None
    measured: list[tuple[int, float, float | None]] = field(default_factory=list)

    @classmethod
    def fit(cls, measured: list[tuple[int, float, float | None]]) -> Calibration:
        """The smallest work from which cuda was quicker at every larger size measured."""
        cuda_from = None
        for work, cpu_ms, cuda_ms in sorted(measured, reverse=True):
            if cuda_ms is None or cuda_ms >= cpu_ms:
                break
            cuda_from = work
        return cls(cuda_from, sorted(measured))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> Calibration:
        raw = json.loads(path.read_text())
        return cls(raw["cuda_from"], [tuple(m) for m in raw["measured"]])


class Executors:
    """The devices a query batch may run on: the engine's own, and cuda when present.
    Layers for a device other than the engine's are a copy of the model, made once."""

    def __init__(self, model: torch.nn.Module, layers: list[Layer], device: torch.device,
                 calibration: Calibration | None = None) -> None:
        self.model, self.device = model, device
        self.devices = [device] + [torch.device(d) for d in ("cpu", "cuda")
                                   if d != device.type and _present(d)]
        self.calibration = calibration
        self._layers = {device: layers}

    def pick(self, work: Callable[[], int]) -> torch.device:
        """The device for a query batch aggregating ``work()`` in-edges (asked only when
        there is a choice): the engine's own until calibrated; then cuda from the
        calibrated work on, cpu below it (and always, where cuda never won)."""
        if len(self.devices) == 1 or self.calibration is None:
            return self.device
        threshold = self.calibration.cuda_from
        return torch.device("cuda" if threshold is not None and work() >= threshold
                            else "cpu")

    def layers(self, device: torch.device) -> list[Layer]:
        if device not in self._layers:
            self._layers[device] = decompose(copy.deepcopy(self.model).to(device))
        return self._layers[device]


def calibrate(engine, sizes: tuple[int, ...] = (1, 16, 64, 256, 1024, 4096),
              repeats: int = 3, seed: int = 0, progress: bool = True) -> Calibration:
    """Time exact query batches of ``sizes`` new vertices (features and in- and out-edges
    drawn like the graph's own) on each executor device of ``engine``: the best of
    ``repeats`` runs per device and size; fit the threshold."""
    import time

    import numpy as np

    from streamgnn.progress import track
    from streamgnn.queries import QueryColumns

    rng = np.random.default_rng(seed)
    ids = engine.vertex_ids()
    degree = max(1, round(engine.num_edges / max(engine.num_vertices, 1)))
    cuda = [d for d in engine.executors.devices if d.type == "cuda"]
    measured = []
    for n in track(sizes, "calibrating", "size", enabled=progress):
        first = int(ids.max()) + 1
        x = engine.lookup(rng.choice(ids, n), 0)
        ends = np.sort(rng.choice(ids, (n, degree)), axis=1)  # repeats now adjacent
        new, old = np.repeat(first + np.arange(n), degree), ends.ravel()
        keep = np.concatenate([[True], (old[1:] != old[:-1]) | (new[1:] != new[:-1])])
        out = np.tile(np.arange(degree) % 2 == 1, n)  # half the edges leave the query
        req = QueryColumns(first + np.arange(n), x, np.where(out, new, old)[keep],
                           np.where(out, old, new)[keep])
        times = {}
        for device in [torch.device("cpu"), *cuda]:
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                answer = engine.query(req, device=str(device))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
            times[device.type] = best * 1e3
        measured.append((answer.work, times["cpu"], times.get("cuda")))
    return Calibration.fit(measured)


def _present(device: str) -> bool:
    return device == "cpu" or (device == "cuda" and torch.cuda.is_available())
