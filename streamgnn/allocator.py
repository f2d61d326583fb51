"""How the engine's process asks glibc's malloc to treat freed memory.

By default malloc hands blocks above 128 KB back to the kernel on free (mmap) and trims
the heap's free top, so every batch's temporaries (message rows, gathered states) fault
their pages in again. Page faults are dear on virtual machines: on the 2-core VM this
project is measured on, a 3-layer GAT batch of 1,000 updates spent more than half its
time in them. `keep_freed_memory` makes malloc serve every block from its heap and keep
what is freed for reuse: the process's resident memory then stays at its peak.

Owns this process setting only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Keep freed memory in this process for reuse (glibc only); True if malloc took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
