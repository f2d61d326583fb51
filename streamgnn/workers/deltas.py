"""A superstep's message sources and the message list of a linear aggregation's delta,
each found in one numba pass.

The sources (`message_sources`): the vertices whose input changed, the sources of changed
edges, deleted vertices and any extra rows a rescale reads, with each edge's source
position, each source's row before the batch and the layout of the table of t the messages
read (`difference_rows`).

The message list (`linear_delta_messages`): for each message, the row of the sources' t it
carries, its coefficient and its destination's position in the region. With s the
per-source factor (degree-normalised layers), unchanged edges out of changed sources send
``+w s_new t_new - w s_old t_old``: one message of ``w s (t_new - t_old)`` where the table
has that difference (t is linear, so it is t of h_new - h_old: one row of the product
instead of two, one message instead of two), one of ``w (s_new - s_old) t`` when only the
factor changed, two otherwise; changed edges send ``+after s_new t_new`` where they exist
after the batch and ``-before s_old t_old`` where they existed before it; each message is
then scaled by its destination's factor (a mean kept as the pre-activation: 1 / its
in-degree). A layer that keeps its pre-activation also adds, to each source whose input
changed, its new root term and subtracts its old one (one message of the difference's root
term where the table has it).

A batch's edge changes as every superstep reads them, with the in-degrees before the batch
from its net edge changes and the in-degrees after it (`edge_changes`, for the mean's
rescale and degree-normalised layers), are worked out here too, in one pass.

Owns this index arithmetic only; must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamgnn.workers.slotsets import union_marked


@njit(cache=True, inline="always")
def _rel(r, paired):
    """Row r's message row in a product whose first ``paired`` rows have root terms."""
    return r + min(r, paired)


@njit(cache=True)
def linear_delta_messages(new_row, old_row, delta_row, at, v1, w1, at2, dst, before, after,
                          has, had, weighted, scale_new, scale_old, region, dst_scale, scratch,
                          own, own_slots, paired):
    """Source i's t after the batch is row ``new_row[i]`` of the table, before it row
    ``old_row[i]`` (the same row where it has no other), and t of the difference row
    ``delta_row[i]`` (-1: none; only where its factor did not change); -1 where the
    message list never reads it. ``scale_new``/``scale_old``: its factor after/before.
    ``at``/``v1``/``w1``: unchanged edges (source, destination slot, weight);
    ``at2``/``dst``/``before``/``after``/``has``/``had``: changed edges (source,
    destination slot, weights, whether they exist after/before and reach a live vertex).
    ``dst_scale``: per region position, what messages to it are multiplied by.
    ``scratch``: an int64 array as long as the slots. ``own``: None, or the sources
    (positions, at slots ``own_slots`` in the region) whose root term changes: then each
    row r < ``paired`` of the table stands for rows 2r (its message) and 2r+1 (its root
    term) of the product's, each later row r for row ``paired + r`` (its message alone:
    `Layer.rel_root`), and each of those sources sends its own state its new root term
    minus its old one (rows below ``paired``). Returns (rows, coef, local)."""
    for i in range(len(region)):
        scratch[region[i]] = i
    paired = 0 if own is None else paired
    size = 2 * len(at) + has.sum() + had.sum() + (0 if own is None else 2 * len(own))
    rows = np.empty(size, np.int64)
    coef = np.empty(size, np.float64)
    local = np.empty(size, np.int64)
    k = 0
    for i in range(len(at)):
        d = scratch[v1[i]]
        a, c = at[i], (w1[i] if weighted else 1.0) * dst_scale[d]
        if delta_row[a] >= 0:
            rows[k], coef[k], local[k] = _rel(delta_row[a], paired), c * scale_new[a], d
            k += 1
        elif old_row[a] == new_row[a]:  # only the factor changed
            rows[k], local[k] = _rel(new_row[a], paired), d
            coef[k] = c * (scale_new[a] - scale_old[a])
            k += 1
        else:
            rows[k], coef[k], local[k] = _rel(new_row[a], paired), c * scale_new[a], d
            rows[k + 1], local[k + 1] = _rel(old_row[a], paired), d
            coef[k + 1] = -c * scale_old[a]
            k += 2
    for i in range(len(at2)):
        a, d = at2[i], scratch[dst[i]]
        if has[i]:
            rows[k] = _rel(new_row[a], paired)
            coef[k] = (after[i] if weighted else 1.0) * scale_new[a] * dst_scale[d]
            local[k] = d
            k += 1
        if had[i]:
            rows[k] = _rel(old_row[a], paired)
            coef[k] = -(before[i] if weighted else 1.0) * scale_old[a] * dst_scale[d]
            local[k] = d
            k += 1
    if own is not None:
        for i in range(len(own)):
            a, d = own[i], scratch[own_slots[i]]
            if delta_row[a] >= 0:
                rows[k], coef[k], local[k] = 2 * delta_row[a] + 1, 1.0, d
                k += 1
                continue
            rows[k], coef[k], local[k] = 2 * new_row[a] + 1, 1.0, d
            k += 1
            if old_row[a] != new_row[a]:
                rows[k], coef[k], local[k] = 2 * old_row[a] + 1, -1.0, d
                k += 1
    return rows[:k], coef[:k], local[:k]


@njit(cache=True)
def message_sources(sources, at, src, dst, has, had, alive, old_slots, removed, extra,
                    own_slots, differences, mark, scratch):
    """A superstep's message sources and where each message reads them, in one pass: the
    sources are the sorted union of ``sources`` (vertices whose input changed, with
    unchanged out-edges ``sources[at]``), the sources ``src`` of the changed edges (into
    ``dst``; ``has``/``had``: they exist after/before the batch), the ``removed`` vertices
    and the ``extra`` slots. Rows of h before the batch are those of ``old_slots`` then
    ``removed``. ``mark``/``scratch``: a bool array (all false; a multiple of 8 long) and an
    int64 array, at least as long as the slots (`SlotSets`' own). Returns (slots, at1, at2,
    has, had, own, extra_at, prior, new_row, old_row, delta_row, fresh, taken, moved, dest,
    paired): the positions in ``slots`` of the unchanged edges' sources, the changed edges'
    sources, ``own_slots`` and ``extra``; ``has``/``had`` left true only into ``alive`` vertices
    (messages to deleted ones are moot); each source's row before the batch (-1: none); and
    the table layout, with ``differences`` `difference_rows`' (t computed from the rows
    after, before and their differences), else rows after the batch in source order followed
    by the rows before, all with root terms (``fresh``, ``taken``, ``moved``, ``dest``
    then empty)."""
    slots = union_marked(np.concatenate((sources, src, removed, extra)), mark, mark, False)
    n = len(slots)
    for i in range(n):
        scratch[slots[i]] = i
    at1 = np.empty(len(at), np.int64)
    for k in range(len(at)):
        at1[k] = scratch[sources[at[k]]]
    at2 = np.empty(len(src), np.int64)
    has_live, had_live = has.copy(), had.copy()
    for k in range(len(src)):
        at2[k] = scratch[src[k]]
        if not alive[dst[k]]:
            has_live[k] = had_live[k] = False
    own = np.empty(len(own_slots), np.int64)
    for k in range(len(own_slots)):
        own[k] = scratch[own_slots[k]]
    extra_at = np.empty(len(extra), np.int64)
    for k in range(len(extra)):
        extra_at[k] = scratch[extra[k]]
    prior = np.full(n, -1)
    for k in range(len(old_slots)):
        prior[scratch[old_slots[k]]] = k
    for k in range(len(removed)):
        prior[scratch[removed[k]]] = len(old_slots) + k
    if differences:
        new, old, delta, fresh, taken, moved, dest, paired = difference_rows(
            prior, at1, at2, has_live, had_live, extra_at, own)
    else:
        new = np.arange(n)
        old = np.where(prior >= 0, n + prior, new)
        delta = np.full(n, -1)
        fresh = taken = moved = dest = np.zeros(0, np.int64)
        paired = n + len(old_slots) + len(removed)
    return (slots, at1, at2, has_live, had_live, own, extra_at, prior, new, old, delta, fresh,
            taken, moved, dest, paired)


@njit(cache=True)
def difference_rows(prior, at1, at2, has, had, extra, own):
    """The table of t a linear aggregation's messages read when t is computed, not kept:
    sources numbered 0..len(prior), ``prior[i]`` the row of h before the batch of source
    i (-1: none; sources whose input changed and deleted ones have one). A source's t
    after the batch is read where a changed edge from it exists after the batch, or where
    it has no row before and an unchanged edge (``at1``), a changed edge that existed
    before, its root term (``own``) or a rescale (``extra``) reads it; its t before the
    batch where a changed edge from it existed before or a rescale reads it; t of h_new -
    h_old where it has a row before and an unchanged edge or its root term reads it (one
    row, one message, instead of two). The rows whose root term is read (an ``own``
    source's after the batch or difference, an ``extra`` source's before it) come first.
    Returns (new_row, old_row, delta_row) as `linear_delta_messages` takes them, the
    table's rows as [after: sources ``fresh`` | before: sources ``taken`` | differences:
    sources ``moved``] each goes to (``dest``, `difference_table`'s), and how many rows
    have root terms (``paired``)."""
    n = len(prior)
    new = np.zeros(n, np.bool_)
    past = np.zeros(n, np.bool_)
    moves = np.zeros(n, np.bool_)
    for i in range(len(at2)):
        a = at2[i]
        if has[i]:
            new[a] = True
        if had[i]:
            if prior[a] >= 0:
                past[a] = True
            else:
                new[a] = True
    for a in extra:
        if prior[a] >= 0:
            past[a] = True
        else:
            new[a] = True
    for reads in (at1, own):
        for a in reads:
            if prior[a] >= 0:
                moves[a] = True
            else:
                new[a] = True
    fresh = np.flatnonzero(new)
    taken = np.flatnonzero(past)
    moved = np.flatnonzero(moves)
    rooted = np.zeros(n, np.bool_)  # own: the root term of its row after (or difference)
    for a in own:
        rooted[a] = True
    rescaled = np.zeros(n, np.bool_)  # extra: the root term of its row before
    for a in extra:
        rescaled[a] = True
    roots = np.empty(len(fresh) + len(taken) + len(moved), np.bool_)
    for k in range(len(fresh)):  # (a source with a row before reads no root term here)
        roots[k] = (rooted[fresh[k]] or rescaled[fresh[k]]) and prior[fresh[k]] < 0
    for k in range(len(taken)):
        roots[len(fresh) + k] = rescaled[taken[k]]
    for k in range(len(moved)):
        roots[len(fresh) + len(taken) + k] = rooted[moved[k]]
    dest = np.empty(len(roots), np.int64)  # rows with root terms first, in table order
    paired = roots.sum()
    first, rest = 0, paired
    for k in range(len(roots)):
        if roots[k]:
            dest[k], first = first, first + 1
        else:
            dest[k], rest = rest, rest + 1
    new_row = np.full(n, -1)
    old_row = np.full(n, -1)
    delta_row = np.full(n, -1)
    for k in range(len(fresh)):
        new_row[fresh[k]] = dest[k]
    for i in range(n):
        if prior[i] < 0:
            old_row[i] = new_row[i]
    for k in range(len(taken)):
        old_row[taken[k]] = dest[len(fresh) + k]
    for k in range(len(moved)):
        delta_row[moved[k]] = dest[len(fresh) + len(taken) + k]
    return new_row, old_row, delta_row, fresh, taken, moved, dest, paired


@njit(cache=True)
def edge_changes(src, dst, before, after, alive, in_degree, mark, scratch):
    """A batch's net edge changes ``src -> dst`` (weights ``before``/``after``, NaN where the
    edge is absent; pairs in key order, as `EdgeLog` holds them), in one pass.
    ``in_degree``: after the batch; ``mark``/``scratch``: a bool array (all false; a
    multiple of 8 long) and an int64 array, at least as long as the slots. Returns (src,
    dst, before, after, had, has, keys, members, recounted, count_before, empty_before)
    (`_BatchEdges`' order): the edges' slots in int64; their weights with 0 for absent;
    whether each existed before and exists after; the sorted `pair_keys` of the changed
    pairs; ``members``, the live destinations (sorted), ``recounted`` those whose number of
    in-edges changed with ``count_before``, that number before the batch, and
    ``empty_before`` those that had no in-edge before it."""
    n = len(dst)
    src64, dst64 = src.astype(np.int64), dst.astype(np.int64)
    members = union_marked(dst64, mark, alive, True)
    had, has = np.empty(n, np.bool_), np.empty(n, np.bool_)
    before0, after0 = np.empty(n, before.dtype), np.empty(n, after.dtype)
    count = np.empty(len(members), np.int64)
    for i in range(len(members)):
        scratch[members[i]] = i
        count[i] = in_degree[members[i]]
    for k in range(n):
        had[k], has[k] = not np.isnan(before[k]), not np.isnan(after[k])
        before0[k] = before[k] if had[k] else 0
        after0[k] = after[k] if has[k] else 0
        if alive[dst64[k]] and had[k] != has[k]:  # one more (lost) or one fewer (gained)
            count[scratch[dst64[k]]] += 1 if had[k] else -1
    recounted = np.zeros(len(members), np.bool_)
    for i in range(len(members)):
        recounted[i] = count[i] != in_degree[members[i]]
    keys = (src64 << 32) | dst64  # sorted: `EdgeLog` holds the pairs in key order
    return (src64, dst64, before0, after0, had, has, keys, members, members[recounted],
            count[recounted], members[count == 0])
