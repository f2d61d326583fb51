"""`superstep_region`: where a superstep's messages go and which rows it recomputes, in
one numba call instead of six and the Python between them: the unchanged out-edges of
its sources, the region (their destinations, the changed edges' and the vertices whose
input changed, owned vertices only), the region's in-degrees, which of it the batch
added, the rows outside it the next superstep reads, and with partitions the messages
from ghosts combined per destination and source partition.

Owns this composition only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.graph.adjacency import entries_except
from streamgnn.workers.slotsets import find_marked, remote_pairs, union_marked


@njit(cache=True)
def superstep_region(out_adjacency, sources, skip, changed_dst, changed, owned, in_degree,
                     added, changed_src, removed, read_next, mark, scratch, had, has, ghost,
                     owner):
    """For a superstep from ``sources`` (int64): their out-edges except the changed pairs
    (sorted keys ``skip``) as (position in ``sources``, destination, weight); the region:
    the sorted distinct ``owned`` slots among those destinations, the changed edges' ends
    ``changed_dst`` and the ``changed`` vertices; its ``in_degree``; which of it are among
    the slots the batch ``added`` (distinct); with ``read_next``, the sorted slots outside
    it whose rows the next superstep reads whatever moved (the owned sources
    ``changed_src`` of the changed edges and the ``removed`` vertices: their rows do not
    change before it, and ghosts' are sent in between), else none; where there are
    ``ghost`` slots (a mask, empty without partitions), how many messages from them
    combining at the sender would send (`remote_pairs`: the changed edges count where
    they existed, ``had``, or exist, ``has``; ``owner``: each ghost's partition), else 0.
    ``mark`` and ``scratch``: `SlotSets`' own."""
    at, v1, w1 = entries_except(out_adjacency, sources, skip)
    region = union_marked(np.concatenate((v1, changed_dst, changed)), mark, owned, True)
    count = in_degree[region]
    fresh = find_marked(added, region, scratch, mark) >= 0
    reads = len(changed_src) + len(removed)
    ahead = np.empty(reads if read_next else 0, np.int64)
    n = 0
    if read_next:
        for r in region:
            mark[r] = True
        for k in range(reads):
            first = k < len(changed_src)
            s = changed_src[k] if first else removed[k - len(changed_src)]
            if (not first or owned[s]) and not mark[s]:
                mark[s] = True
                ahead[n] = s
                n += 1
        for r in region:
            mark[r] = False
        for k in range(n):
            mark[ahead[k]] = False
    pairs = (remote_pairs(sources, at, v1, changed_src, changed_dst, had, has, owned, ghost,
                          owner, scratch) if len(ghost) else 0)
    return at, v1, w1, region, count, fresh, np.sort(ahead[:n]), pairs


NO_GHOSTS = (np.zeros(0, bool), np.zeros(0, np.int16))
"""`superstep_region`'s ``ghost`` and ``owner`` without partitions (read only)."""
