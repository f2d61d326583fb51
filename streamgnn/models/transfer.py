"""Host arrays onto a device in one copy (`upload`) and device tensors back in one
(`download`, or `download_async`, which starts the copy and returns before it is done).
On a GPU each copy costs a launch and, from pageable memory or back to the host, a wait
for the work queued before it: a superstep's index arrays go over together, from one
pinned buffer, without making the host wait, and the values the host must see come back
together, into pinned memory, the host waiting only when it reads them (`Pending.wait`).
On the CPU the arrays and tensors share their memory, and a count of crossings
(`streamgnn.crossings`) counts each call as the one copy it is on a GPU.

Owns the packing; must not import the engine.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

_ALIGN = 8  # bytes: every part starts where any dtype's view may


def upload(device: torch.device, *arrays: np.ndarray) -> list[Tensor]:
    """``arrays`` as tensors on ``device`` (each its own dtype and shape), copied in one."""
    parts = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
    if device.type == "cpu":  # the arrays themselves
        return [torch.from_numpy(a) for a in parts]
    buffer, offsets = packed_arrays(parts)
    moved = torch.from_numpy(buffer).pin_memory().to(device, non_blocking=True)
    return tensor_views(moved, parts, offsets)


def download(*tensors: Tensor) -> list[np.ndarray]:
    """``tensors`` (on one device) as host arrays, read back in one copy."""
    return download_async(*tensors).wait()


class Pending:
    """Host arrays a copy back (`download_async`) fills: ``wait`` gives them once it is
    done (at once where none was needed)."""

    def __init__(self, arrays: list[np.ndarray], done: torch.cuda.Event | None) -> None:
        self.arrays, self.done = arrays, done

    def wait(self) -> list[np.ndarray]:
        """The arrays, once the copy into them is done."""
        if self.done is not None:
            self.done.synchronize()
        return self.arrays


def download_async(*tensors: Tensor) -> Pending:
    """``tensors`` (on one device) as host arrays, read back in one copy into pinned memory
    that the host may go on while the device fills (a GPU's: the copy queued after the
    work that computes them); the arrays are read after `Pending.wait`."""
    if all(t.device.type == "cpu" for t in tensors):  # the tensors' own memory
        return Pending([t.numpy() for t in tensors], None)
    packed, offsets = packed_tensors(tensors)
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(packed.device))
    return Pending(array_views(host.numpy(), tensors, offsets), done)


def packed_arrays(parts: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """The C-contiguous ``parts``' bytes in one buffer, and where each starts."""
    offsets, total = _layout([a.nbytes for a in parts])
    buffer = np.zeros(total, np.uint8)
    for a, at in zip(parts, offsets, strict=True):
        buffer[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
    return buffer, offsets


def tensor_views(buffer: Tensor, parts: list[np.ndarray], offsets: list[int]) -> list[Tensor]:
    """Tensors viewing ``buffer`` (`packed_arrays`' bytes, wherever they are) as ``parts``."""
    return [buffer[at:at + a.nbytes].view(_torch_dtype(a.dtype)).view(a.shape)
            for a, at in zip(parts, offsets, strict=True)]


def packed_tensors(tensors: tuple[Tensor, ...]) -> tuple[Tensor, list[int]]:
    """The ``tensors``' bytes in one tensor where they are, and where each starts."""
    flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    offsets, total = _layout([f.shape[0] for f in flat])
    packed = flat[0].new_zeros(total)
    for f, at in zip(flat, offsets, strict=True):
        packed[at:at + f.shape[0]] = f
    return packed, offsets


def array_views(buffer: np.ndarray, tensors: tuple[Tensor, ...], offsets: list[int]
                ) -> list[np.ndarray]:
    """Arrays viewing ``buffer`` (`packed_tensors`' bytes, on the host) as ``tensors``."""
    out = []
    for t, at in zip(tensors, offsets, strict=True):
        dtype = numpy_dtype(t.dtype)
        out.append(buffer[at:at + t.numel() * dtype.itemsize].view(dtype).reshape(t.shape))
    return out


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    """Each part's offset (aligned) in a buffer holding them all, and its size."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // _ALIGN) * _ALIGN
    return offsets, max(at, _ALIGN)


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of torch's ``dtype``, by its name (no tensor made or read)."""
    return np.dtype(str(dtype).removeprefix("torch."))
