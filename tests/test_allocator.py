"""`keep_freed_memory`: after it, memory freed by the process is reused without faulting
its pages in again (the point of it), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
from streamgnn.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
np.ones(64 << 20, np.uint8)  # allocate, touch and free 64 MB once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    np.ones(64 << 20, np.uint8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_memory_is_reused_without_page_faults():
    default = faults("default")  # each 64 MB block is mapped afresh and faults in again
    assert default > 100
    assert faults("keep") * 20 < default
