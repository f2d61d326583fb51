"""Host arrays onto a device in one copy (`upload`) and device tensors back in one
(`download`). On a GPU each copy costs a launch and, from pageable memory or back to the
host, a wait for the work queued before it: a superstep's index arrays go over together,
from one pinned buffer, without making the host wait, and the values the host must see
come back together. On the CPU the arrays and tensors share their memory, and a count of
crossings (`streamgnn.crossings`) counts each call as the one copy it is on a GPU.

Owns the packing; must not import the engine.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_ALIGN = 8  # bytes: every part starts where any dtype's view may
_NUMPY = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
          torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
          torch.bool: np.dtype(np.bool_), torch.uint8: np.dtype(np.uint8)}
_TORCH = {v: k for k, v in _NUMPY.items()}


def upload(device: torch.device, *arrays: np.ndarray) -> list[Tensor]:
    """``arrays`` as tensors on ``device`` (each its own dtype and shape), copied in one."""
    parts = [np.ascontiguousarray(a) for a in arrays]
    if device.type == "cpu":  # the arrays themselves
        return [torch.from_numpy(a) for a in parts]
    offsets, total = _layout([a.nbytes for a in parts])
    buffer = np.empty(total, np.uint8)
    for a, at in zip(parts, offsets, strict=True):
        buffer[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
    host = torch.from_numpy(buffer)
    moved = host.pin_memory().to(device, non_blocking=True)
    return [moved[at:at + a.nbytes].view(_TORCH[a.dtype]).view(a.shape)
            for a, at in zip(parts, offsets, strict=True)]


def download(*tensors: Tensor) -> list[np.ndarray]:
    """``tensors`` (on one device) as host arrays, read back in one copy."""
    if all(t.device.type == "cpu" for t in tensors):  # the tensors' own memory
        return [t.numpy() for t in tensors]
    flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    offsets, total = _layout([f.shape[0] for f in flat])
    packed = flat[0].new_zeros(total)
    for f, at in zip(flat, offsets, strict=True):
        packed[at:at + f.shape[0]] = f
    host = packed.cpu().numpy()
    return [host[at:at + f.shape[0]].view(_NUMPY[t.dtype]).reshape(t.shape)
            for t, f, at in zip(tensors, flat, offsets, strict=True)]


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    """Each part's offset (aligned) in a buffer holding them all, and its size."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // _ALIGN) * _ALIGN
    return offsets, max(at, _ALIGN)
