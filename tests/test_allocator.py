"""`keep_freed_memory`: after it, memory freed by the process is reused without faulting
its pages in again (the point of it), in a process of its own; `huge_pages` /
`huge_zeros`: large tables copied onto memory the kernel backs with 2 MB pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


RETURN_PROBE = """
import numpy as np
from streamgnn.allocator import freed_memory_returned, keep_freed_memory
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
def dropped_on_free(blocks, size):
    held = [np.ones(size, np.uint8) for _ in range(blocks)]  # touched
    before = rss_mb()
    del held
    return before - rss_mb()
assert keep_freed_memory()
with freed_memory_returned():
    with freed_memory_returned():  # nested: the outer one still holds after it
        pass
    large = dropped_on_free(1, 256 << 20)  # its own mapping: unmapped on free
    small = [np.ones(512 << 10, np.uint8) for _ in range(400)]  # 200 MB on the heap
    before = rss_mb()
    del small[:-1]  # all but the last: the heap's top is held, nothing trims
    kept_inside = before - rss_mb()
    before = rss_mb()
print(large, kept_inside, before - rss_mb(), dropped_on_free(1, 256 << 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_memory_goes_back_within_a_bootstrap_and_is_kept_after_it():
    """Within `freed_memory_returned` (nested ones included) a freed large block goes back
    to the kernel at once, and the heap's freed middle when it ends (trimmed); after it
    memory is kept again, as `keep_freed_memory` set it."""
    out = subprocess.run([sys.executable, "-c", RETURN_PROBE], capture_output=True,
                         text=True, check=True)
    large, kept_inside, trimmed, after = map(int, out.stdout.split())
    assert large > 200 and kept_inside < 50 and trimmed > 150 and after < 50


def test_huge_pages_copies_large_tables_and_leaves_small_ones():
    from streamgnn.allocator import huge_pages, huge_zeros

    small = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert huge_pages(small) is small and huge_zeros((3, 4), np.float32) is None
    table = np.random.default_rng(0).random((40_000, 128)).astype(np.float32)  # 20 MB
    copy = huge_pages(table)
    assert copy is not table and copy.dtype == table.dtype and np.array_equal(copy, table)
    assert copy.ctypes.data % (2 << 20) == 0 and copy.flags.writeable
    zeros = huge_zeros((200_000, 128), np.uint8)  # 25 MB
    assert zeros.shape == (200_000, 128) and not zeros.any()


def test_lengthened_grows_a_table_in_its_room_and_copies_past_it():
    """New rows are zero; in the room mapped after a `huge_zeros` table the same memory
    (its rows kept without a copy), past it or from a stale shorter view a copy with room
    again; a small table is copied as numpy allocates it."""
    from streamgnn.allocator import huge_zeros, lengthened

    table = huge_zeros((100_000, 64), np.float32, room=100_000)  # 25 MB, room as much
    table[:] = 1
    longer = lengthened(table, 150_000)
    assert longer.ctypes.data == table.ctypes.data and longer.shape == (150_000, 64)
    assert longer[:100_000].min() == 1 and not longer[100_000:].any()
    stale = lengthened(table, 120_000)  # rows 100K.. are longer's: copied
    assert stale.ctypes.data != table.ctypes.data and not stale[100_000:].any()
    past = lengthened(longer, 250_000)
    assert past.ctypes.data != longer.ctypes.data and past[:100_000].min() == 1
    assert not past[100_000:].any() and past.ctypes.data % (2 << 20) == 0
    assert lengthened(past, 400_000).ctypes.data == past.ctypes.data  # room as much again
    small = np.ones((10, 3), np.int32)
    grown = lengthened(small, 20)
    assert grown.dtype == np.int32 and grown[:10].all() and not grown[10:].any()
    with pytest.raises(ValueError, match="has 20"):
        lengthened(grown, 5)


THP_PROBE = """
import re
import numpy as np
from streamgnn.allocator import huge_zeros
def huge_kb():
    return int(re.search(r"AnonHugePages:\\s+(\\d+)", open("/proc/self/smaps_rollup").read())[1])
before = huge_kb()
table = huge_zeros((64 << 20,), np.uint8)
table[:] = 1  # fault the pages in
print(huge_kb() - before)
"""


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return re.search(r"\[(\w+)\]", text)[1]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason="transparent huge pages off on this kernel")
def test_huge_zeros_are_backed_by_huge_pages():
    out = subprocess.run([sys.executable, "-c", THP_PROBE], capture_output=True, text=True,
                         check=True)
    assert int(out.stdout) >= 32 << 10  # at least half of the 64 MB on 2 MB pages
