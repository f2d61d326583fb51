"""Counting host/device crossings: each call in the package's code that hands host data to
torch (``torch.from_numpy``, ``torch.as_tensor``, ``torch.tensor``) or reads a tensor back
on the host (``.cpu`` or ``.to`` off a device, ``Tensor.numpy``, ``.item``, ``.tolist``,
``__array__`` and the conversions to a Python number or truth value). On a GPU each is a
copy over the bus, most of them one the host waits for; run on the CPU with the device
kernels forced, the same calls show what a GPU batch would cross, so tests and benchmarks
count them without a GPU.

An instrument for tests and benchmarks; the engine must not import it.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import torch

_PACKAGE = str(Path(__file__).parent)
_TRANSFER = str(Path(__file__).parent / "models" / "transfer.py")
_UP = ("from_numpy", "as_tensor", "tensor")  # functions of torch
_READS = ("numpy", "item", "tolist", "__array__", "__int__", "__float__", "__bool__",
          "__index__")  # methods of Tensor reading a host tensor's values


@dataclass
class Crossings:
    """Crossings counted by call site (``file:line``), host to device and back."""

    up: collections.Counter[str] = field(default_factory=collections.Counter)
    down: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        """Crossings either way."""
        return sum(self.up.values()) + sum(self.down.values())

    def clear(self) -> None:
        """Forget what was counted so far."""
        self.up.clear()
        self.down.clear()

    def sites(self, most: int = 10) -> list[tuple[str, int]]:
        """The call sites that crossed most, either way."""
        return (self.up + self.down).most_common(most)


@contextmanager
def counted() -> Iterator[Crossings]:
    """Count the crossings the package's code makes inside the block (calls from tests,
    benchmarks or torch itself are not counted). A tensor a crossing made is marked, so
    the host array of one read back (``.cpu().numpy()``) counts once; a call of
    `streamgnn.models.transfer` counts once, at its caller, as the one copy it makes."""
    seen = Crossings()
    saved: list[tuple[object, str, Callable]] = []
    calls: list[FrameType] = []  # `transfer`'s calls counted

    def patch(owner: object, name: str, counter: collections.Counter[str],
              crosses: Callable[..., bool]) -> None:
        original = getattr(owner, name)

        def counting(*args, **kwargs):
            out = original(*args, **kwargs)
            caller = sys._getframe(1)
            if caller.f_code.co_filename == _TRANSFER:  # one copy a call: its caller's
                while caller.f_back.f_code.co_filename == _TRANSFER:
                    caller = caller.f_back
                if caller in calls:
                    return out
                calls.append(caller)  # (kept alive: a frame's id is not reused)
                caller = caller.f_back
            if caller.f_code.co_filename.startswith(_PACKAGE) and crosses(out, *args):
                counter[f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"] += 1
                if isinstance(out, torch.Tensor):
                    out._crossed = True
            return out

        saved.append((owner, name, original))
        setattr(owner, name, counting)

    def host_data(out, data=None, *args) -> bool:
        return not isinstance(data, torch.Tensor)

    def read(out, t, *args) -> bool:
        return not getattr(t, "_crossed", False)

    def to_host(out, t, *args) -> bool:
        return t.device.type != "cpu" and out.device.type == "cpu"

    for name in _UP:
        patch(torch, name, seen.up, host_data)
    for name in _READS:
        patch(torch.Tensor, name, seen.down, read)
    for name in ("cpu", "to"):
        patch(torch.Tensor, name, seen.down, to_host)
    try:
        yield seen
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
