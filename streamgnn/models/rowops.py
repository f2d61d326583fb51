"""Row-wise kernels on 2-D tensors, the inner loops of a sum's superstep: a
gather-scale-scatter (``combine_rows``), the same folded into stored states and read back
(``fold_rows_``), in-neighbors' rows summed per vertex where they are stored
(``in_row_sums``: a linear pull), the store of a superstep's new rows that reports which changed
(``store_rows_``), the rows a linear layer's delta transforms (``difference_table``), the
rows of a layer kept as z activated and compared in one pass (``activated_rows``), rows
taken from a table (``take_rows``) or from two (``merge_rows``), rows reset to one value
(``fill_rows_``) and each row's largest column (``argmax_rows``: the labels); the
grouping of messages by destination (``by_destination``) the folds share, and the factors
of one a kernel reads where nothing scales (``ones``).
Each has a numba loop for CPU tensors (quicker than torch's indexing ops on the few hundred
rows of a batch) and a torch version for other devices; tests hold the two to each other.
The loops that read and write rows of large tables at random ask for the row they will
need a few iterations ahead (`prefetch_row`).

Owns these kernels only; must not import kafka, mpi4py or the graph store.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import intrinsic, overload
from torch import Tensor

from streamgnn.cores import block_costs, block_work, chunk_rows, row_loop
from streamgnn.models.transfer import download, upload
from streamgnn.prefetch import AHEAD, prefetch_row

_ONES = np.ones(1024)


def ones(n: int) -> np.ndarray:
    """``n`` float64 ones for a kernel to read (never to write: every caller gets a view of
    one array). A batch's kernels take several such all-ones factors; amid a batch's work
    each np.ones call costs several times what it does alone, and far more than a view."""
    global _ONES
    if len(_ONES) < n:  # (a race between threads grows it twice, both all ones)
        _ONES = np.ones(max(n, 2 * len(_ONES)))
    return _ONES[:n]


@njit(cache=True)
def any_above(values, limit):
    """Whether some of ``values`` is above ``limit``: numpy's max of a small batch's few
    values costs far more amid its work than alone, and more than a numba call."""
    for v in values:  # noqa: SIM110 (numba compiles no generator expression)
        if v > limit:
            return True
    return False


@njit(cache=True)
def _combine_loop(t, rows, coef, dst, num):
    out = np.zeros((num, t.shape[1]), np.float64)
    for k in range(len(rows)):
        if k + AHEAD < len(rows):
            prefetch_row(t, rows[k + AHEAD])
        r, d, c = rows[k], dst[k], coef[k]
        for j in range(t.shape[1]):
            out[d, j] += c * t[r, j]
    return out


def combine_rows_numba(t: Tensor, rows: Tensor, coef: Tensor, dst: Tensor, num: int
                       ) -> Tensor:
    return torch.from_numpy(_combine_loop(t.numpy(), rows.numpy(), coef.numpy(), dst.numpy(),
                                          num))


def combine_rows_torch(t: Tensor, rows: Tensor, coef: Tensor, dst: Tensor, num: int
                       ) -> Tensor:
    msg = t[rows].double()
    msg *= coef.unsqueeze(-1)
    return msg.new_zeros((num, t.shape[1])).index_add_(0, dst, msg)


def combine_rows(t: Tensor, rows: Tensor, coef: Tensor, dst: Tensor, num: int) -> Tensor:
    """Messages ``coef[k] * t[rows[k]]`` summed per destination ``dst[k]`` in ``0..num``,
    in float64 (``rows`` and ``dst`` int64, ``coef`` float64, on ``t``'s device)."""
    kernel = combine_rows_numba if t.device.type == "cpu" else combine_rows_torch
    return kernel(t, rows, coef, dst, num)


def block_edges(begin: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blocks ``[begin[i], end[i])`` of an edge list listed one after the other: each
    edge's place in the list and the block it is in (the torch versions' gathers)."""
    count = end - begin
    ptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    return (np.repeat(begin - ptr[:-1], count) + np.arange(ptr[-1]),
            np.repeat(np.arange(len(count)), count))


@row_loop
def _in_sums_loop(table, relu, begin, end, src, w, weighted, out, chunks):
    zero = table.dtype.type(0)
    cost = block_costs(begin, end, 1)
    for chunk in prange(chunks):
        acc = np.empty(table.shape[1], np.float64)
        first, last = chunk_rows(cost, chunks, chunk)
        for i in range(first, last):
            acc[:] = 0.0
            for k in range(begin[i], end[i]):
                if k + AHEAD < end[i]:
                    prefetch_row(table, src[k + AHEAD])
                r, c = src[k], w[k] if weighted else 1.0
                for j in range(table.shape[1]):
                    acc[j] += c * _act(table[r, j], relu, zero)
            for j in range(table.shape[1]):
                out[i, j] = acc[j]


def in_row_sums_numba(table: Tensor, relu: bool, begin: np.ndarray, end: np.ndarray,
                      src: np.ndarray, w: np.ndarray | None, dtype: torch.dtype,
                      device: torch.device) -> Tensor:
    out = torch.empty((len(begin), table.shape[1]), dtype=dtype)
    _in_sums_loop(block_work(begin, end, table.shape[1]), table.numpy(), relu, begin, end, src,
                  src[:0] if w is None else w, w is not None, out.numpy())
    return out


def in_row_sums_torch(table: Tensor, relu: bool, begin: np.ndarray, end: np.ndarray,
                      src: np.ndarray, w: np.ndarray | None, dtype: torch.dtype,
                      device: torch.device) -> Tensor:
    edge, local = block_edges(begin, end)
    weights = [] if w is None else [w[edge]]
    if table.device.type == device.type:  # the rows' index with the rest, in one copy
        read, local, *weights = upload(device, src[edge], local, *weights)
    else:  # a table on the host (the features): its rows cross instead
        read = upload(table.device, src[edge])[0]
        local, *weights = upload(device, local, *weights)
    rows = table[read].to(device, torch.float64)
    if relu:
        rows = torch.relu(rows)
    if weights:
        rows *= weights[0].to(torch.float64).unsqueeze(-1)
    sums = rows.new_zeros((len(begin), table.shape[1])).index_add_(0, local, rows)
    return sums.to(dtype)


def in_row_sums(table: Tensor, relu: bool, begin: np.ndarray, end: np.ndarray,
                src: np.ndarray, w: np.ndarray | None, dtype: torch.dtype,
                device: torch.device) -> Tensor:
    """Per vertex i, the rows ``src[begin[i]:end[i]]`` of ``table`` (ReLU of them where
    ``relu``: the table is z), each times its weight in ``w`` (None: 1), summed in float64;
    returned in ``dtype`` on ``device``: a linear aggregation's pull from all in-neighbors
    without gathering their rows first."""
    on_cpu = table.device.type == device.type == "cpu"
    kernel = in_row_sums_numba if on_cpu else in_row_sums_torch
    return kernel(table, relu, begin, end, src, w, dtype, device)


@njit(cache=True)
def by_destination(at, num):
    """Message indices grouped by destination position ``at`` in ``0..num``, each group in
    order (a counting sort): destination g's are ``order[ptr[g]:ptr[g + 1]]``."""
    ptr = np.zeros(num + 1, np.int64)
    for k in range(len(at)):
        ptr[at[k] + 1] += 1
    for g in range(num):
        ptr[g + 1] += ptr[g]
    order = np.empty(len(at), np.int64)
    fill = ptr[:-1].copy()
    for k in range(len(at)):
        order[fill[at[k]]] = k
        fill[at[k]] += 1
    return ptr, order


@row_loop
def _fold_loop(state, drift, t, rows, coef, local, region, divisor, limit, out, wear,
               scale, bias, before, chunks):
    bits = _bits(state)
    keep = len(before) > 0  # (rows for every region row, or none: nothing to keep)
    # each destination's messages summed in one row (no table of the region's deltas:
    # 1 KB a row written, then read, on top of the state's)
    first, order = by_destination(local, len(region))
    unit = np.finfo(state.dtype).eps / 2  # a rounding's relative error, at most
    cost = block_costs(first[:-1], first[1:], 3)  # its messages, and the state row twice
    for chunk in prange(chunks):
        delta = np.empty(state.shape[1], np.float64)
        start, end = chunk_rows(cost, chunks, chunk)
        for i in range(start, end):
            if i + AHEAD < end:
                prefetch_row(state, region[i + AHEAD])
                prefetch_row(drift, region[i + AHEAD])  # a cache miss of its own otherwise
            delta[:] = 0.0
            for q in range(first[i], first[i + 1]):
                k = order[q]
                c, m = coef[k], rows[k]
                for j in range(t.shape[1]):
                    delta[j] += c * t[m, j]
            r, s, a = region[i], divisor[i], scale[i]
            if keep:
                before[i] = state[r]
            largest = _largest(bits, r)
            if a == 1.0:
                for j in range(state.shape[1]):
                    state[r, j] += delta[j]
            else:
                for j in range(state.shape[1]):
                    state[r, j] = a * state[r, j] + (1.0 - a) * bias[j] + delta[j]
            if s == 1.0:  # (a sum's: x / 1 is x)
                for j in range(state.shape[1]):
                    out[i, j] = state[r, j]
            else:
                for j in range(state.shape[1]):
                    out[i, j] = state[r, j] / s
            top = _largest(bits, r)
            g = max(a, 1.0)  # the bound grows with the row; never shrunk (see fold_rows_)
            drift[r] = g * drift[r] + unit * max(top, g * largest)
            wear[i] = drift[r] / (limit * unit * max(top, 1.0))


@njit(cache=True, inline="always")
def _largest(bits, r):
    """max |x| over row ``r`` of a float table, read as its IEEE bits ``bits`` (the table
    viewed as unsigned integers of its width): without the sign bit, larger magnitudes
    have larger bits, and an integer maximum vectorises where numba's float one does not
    (a row holding NaN gives NaN; such rows fail the store's finiteness check anyway)."""
    word = bits.dtype.type
    magnitude = word(~(word(1) << word(8 * bits.itemsize - 1)))
    top = word(0)
    for j in range(bits.shape[1]):
        top = word(max(top, word(bits[r, j] & magnitude)))
    return float(_float_of_bits(top))


def _bits(table):
    """``table`` (float32 or float64) viewed as unsigned integers of its width."""


@overload(_bits, jit_options={"cache": True})
def _bits_overload(table):
    word = {32: np.uint32, 64: np.uint64}[table.dtype.bitwidth]  # float32 / float64 only
    return lambda table: table.view(word)


@intrinsic
def _float_of_bits(typingctx, bits):
    """The float whose IEEE bits are the unsigned integer ``bits`` (32 bits: float32,
    64: float64)."""
    result = types.float32 if bits.bitwidth == 32 else types.float64

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(result))
    return result(bits), codegen


def fold_rows_numba(state: Tensor, drift: Tensor, t: Tensor, rows: np.ndarray,
                    coef: np.ndarray, local: np.ndarray, region: np.ndarray,
                    divisor: np.ndarray, limit: float, scale: np.ndarray, bias: np.ndarray,
                    keep: bool = False) -> tuple[Tensor, np.ndarray, Tensor | None]:
    states, rows_t = state.numpy(), t.numpy()  # (a view is not free: one each)
    out = np.empty((len(region), states.shape[1]), rows_t.dtype)
    wear = np.empty(len(region))
    before = np.empty((len(region) if keep else 0, states.shape[1]), states.dtype)
    _fold_loop((len(rows) + len(region)) * states.shape[1], states, drift.numpy(), rows_t,
               rows, coef, local, region, divisor, limit, out, wear, scale, bias, before)
    return torch.from_numpy(out), wear, torch.from_numpy(before) if keep else None


def fold_rows_tensors(state: Tensor, drift: Tensor, t: Tensor, rows: Tensor, coef: Tensor,
                      local: Tensor, region: Tensor, divisor: Tensor, scale: Tensor,
                      bias: Tensor, limit: float) -> tuple[Tensor, Tensor, Tensor]:
    """`fold_rows_` on tensors alone, all on the tables' device and ``region`` not empty
    (what `torch.compile` can take whole: `benchmarks/kernels.py`); the wear as a
    tensor, and the region's state rows before, always."""
    msg = t.index_select(0, rows).double() * coef.unsqueeze(-1)
    delta = msg.new_zeros((region.shape[0], t.shape[1])).index_add_(0, local, msg)
    kept = state.index_select(0, region)
    summed = kept.double() * scale[:, None] + (1.0 - scale[:, None]) * bias + delta
    stored = summed.to(state.dtype)
    state.index_copy_(0, region, stored)
    unit = torch.finfo(state.dtype).eps / 2
    top = stored.abs().amax(dim=1).double()
    g = scale.clamp(min=1.0)
    grown = (g * drift.index_select(0, region).double()
             + unit * torch.maximum(top, g * kept.abs().amax(dim=1).double())).to(drift.dtype)
    drift.index_copy_(0, region, grown)
    wear = grown.double() / (limit * unit * top.clamp(min=1.0))
    return (stored / divisor[:, None]).to(t.dtype), wear, kept


def fold_rows_torch(state: Tensor, drift: Tensor, t: Tensor, rows: np.ndarray,
                    coef: np.ndarray, local: np.ndarray, region: np.ndarray,
                    divisor: np.ndarray, limit: float, scale: np.ndarray, bias: np.ndarray,
                    keep: bool = False) -> tuple[Tensor, np.ndarray, Tensor | None]:
    if not len(region):
        return t.new_zeros((0, state.shape[1])), np.zeros(0), (
            state.new_empty((0, state.shape[1])) if keep else None)

    out, wear, kept = fold_rows_tensors(state, drift, t, *upload(
        state.device, rows, coef, local, region, divisor, scale, bias), limit)
    return out, download(wear)[0], kept if keep else None


def fold_rows_(state: Tensor, drift: Tensor, t: Tensor, rows: np.ndarray, coef: np.ndarray,
               local: np.ndarray, region: np.ndarray, divisor: np.ndarray, limit: float,
               scale: np.ndarray, bias: np.ndarray, keep: bool = False
               ) -> tuple[Tensor, np.ndarray, Tensor | None]:
    """Messages ``coef[k] * t[rows[k]]`` summed per destination ``region[local[k]]`` in
    float64 and added to its state row in place, the row first rescaled about ``bias``
    where ``scale[i]`` is not 1 (``scale * row + (1 - scale) * bias``; float64), with one
    rounding per element. ``drift`` (per slot) accumulates a bound on the rounding error
    each state row took since it was last computed from scratch: scaled with the row where
    the scale grows it (never shrunk: part of the error, the root term's, does not scale),
    plus a rounding at the row's size before (times the scale, where it grows) or after the
    add, whichever is larger (a row falling from large values keeps the error it carried
    at that size: the old messages subtracted were computed to that size's precision).
    Returns the state rows of ``region`` (distinct slots), each divided by
    ``divisor[i]``, in ``t``'s dtype, each row's wear (float64): its drift as a fraction
    of ``limit`` roundings at its size (or at 1 if smaller), above 1 stale, to be
    recomputed; with ``keep``, the state rows of ``region`` as they were before (else
    None)."""
    kernel = fold_rows_numba if state.device.type == "cpu" else fold_rows_torch
    return kernel(state, drift, t, rows, coef, local, region, divisor, limit, scale, bias,
                  keep)


@njit(cache=True)
def _store_loop(table, index, rows, fresh, old):
    moved = np.zeros(len(index), np.bool_)
    finite = True
    k = 0
    for i in range(len(index)):
        if i + AHEAD < len(index):
            prefetch_row(table, index[i + AHEAD])
        r = index[i]
        differs = fresh[i]
        for j in range(rows.shape[1]):
            v = rows[i, j]
            finite &= np.isfinite(v)
            differs |= table[r, j] != v
        moved[i] = differs
        if differs and not fresh[i] and k < len(old):
            old[k] = table[r]
            k += 1
        table[r] = rows[i]
    return moved, k, finite


def store_rows_numba(table: Tensor, index: np.ndarray, rows: Tensor, fresh: np.ndarray,
                     keep_old: bool) -> tuple[np.ndarray, Tensor, bool]:
    old = np.empty((len(index) if keep_old else 0, table.shape[1]), table.numpy().dtype)
    moved, kept, finite = _store_loop(table.numpy(), index, rows.numpy(), fresh, old)
    return moved, torch.from_numpy(old[:kept]), finite


def store_rows_torch(table: Tensor, index: np.ndarray, rows: Tensor, fresh: np.ndarray,
                     keep_old: bool) -> tuple[np.ndarray, Tensor, bool]:
    at, fresh_at = upload(table.device, index, fresh)
    before = table.index_select(0, at)
    table[at] = rows
    moved_at = (rows != before).any(dim=-1) | fresh_at
    old = before[moved_at & ~fresh_at] if keep_old else before[:0]
    moved, finite = download(moved_at, torch.isfinite(rows).all())
    return moved, old, bool(finite)


def store_rows_(table: Tensor, index: np.ndarray, rows: Tensor, fresh: np.ndarray,
                keep_old: bool) -> tuple[np.ndarray, Tensor, bool]:
    """``table[index[i]] = rows[i]`` (``index`` distinct). Returns which rows changed
    (``fresh`` ones count as changed), with ``keep_old`` the rows they replaced of those
    changed and not fresh (in order; else none), and whether every new row is finite."""
    kernel = store_rows_numba if table.device.type == "cpu" else store_rows_torch
    return kernel(table, index, rows, fresh, keep_old)


@njit(cache=True)
def _compare_loop(old, new, fresh, moved):
    finite = True
    compare = len(old) > 0
    for i in range(new.shape[0]):
        differs = fresh[i]
        for j in range(new.shape[1]):
            v = new[i, j]
            finite &= np.isfinite(v)
            if compare:
                differs |= old[i, j] != v
        if compare:
            moved[i] = differs
    return finite


def compare_rows_numba(old: Tensor | None, new: Tensor, fresh: np.ndarray
                       ) -> tuple[np.ndarray, bool]:
    moved = np.ones(new.shape[0], np.bool_)
    rows = new.numpy()
    before = rows[:0] if old is None else old.numpy()
    return moved, bool(_compare_loop(before, rows, fresh, moved))


def compare_rows_torch(old: Tensor | None, new: Tensor, fresh: np.ndarray
                       ) -> tuple[np.ndarray, bool]:
    finite = torch.isfinite(new).all()
    if old is None:
        return np.ones(len(new), np.bool_), bool(download(finite)[0])
    moved, finite = download((old != new).any(dim=-1), finite)  # in one copy
    return moved | fresh, bool(finite)


def compare_rows(old: Tensor | None, new: Tensor, fresh: np.ndarray
                 ) -> tuple[np.ndarray, bool]:
    """Which rows of ``new`` differ from those of ``old`` (``fresh`` ones count as
    differing; all, without ``old``), and whether every value of ``new`` is finite: what
    `store_rows_` reports, for rows stored already."""
    kernel = compare_rows_numba if new.device.type == "cpu" else compare_rows_torch
    return kernel(old, new, fresh)


@njit(cache=True, inline="always")
def _act(v, relu, zero):
    """ReLU of ``v`` where ``relu`` (as torch.relu: -0.0 and NaN stay), else ``v``;
    ``zero`` of ``v``'s type (an integer 0 would make every value a float64)."""
    return zero if relu and v < zero else v


@njit(cache=True)
def difference_table_into(table, slots, relu, old, taken, moved, dest, out):
    """`difference_table`'s rows written into ``out`` (numpy; numba kernels call it)."""
    zero = table.dtype.type(0)
    fresh = len(slots) - len(moved)
    for i in range(fresh):
        if i + AHEAD < len(slots):
            prefetch_row(table, slots[i + AHEAD])
        for j in range(out.shape[1]):
            out[dest[i], j] = _act(table[slots[i], j], relu, zero)
    for k in range(len(taken)):
        out[dest[fresh + k]] = old[taken[k]]
    at = fresh + len(taken)
    for k in range(len(moved)):
        if fresh + k + AHEAD < len(slots):
            prefetch_row(table, slots[fresh + k + AHEAD])
        r, o, d = slots[fresh + k], moved[k], dest[at + k]
        for j in range(out.shape[1]):
            out[d, j] = _act(table[r, j], relu, zero) - old[o, j]


def difference_table_numba(table: Tensor, slots: np.ndarray, relu: bool, old: Tensor,
                           taken: np.ndarray, moved: np.ndarray, dest: np.ndarray) -> Tensor:
    before = old.numpy()
    out = np.empty((len(slots) + len(taken), before.shape[1]), before.dtype)
    difference_table_into(table.numpy(), slots, relu, before, taken, moved, dest, out)
    return torch.from_numpy(out)


def difference_table_torch(table: Tensor, slots: np.ndarray, relu: bool, old: Tensor,
                           taken: np.ndarray, moved: np.ndarray, dest: np.ndarray) -> Tensor:
    at, taken_at, moved_at, dest_at = upload(old.device, slots, taken, moved, dest)
    if table.device != old.device:  # the features, on the host
        at = upload(table.device, slots)[0]
    rows = table[at].to(old.device, old.dtype)
    if relu:
        rows = torch.relu(rows)
    return difference_table_tensors(rows, old, taken_at, moved_at, dest_at)


def difference_table_tensors(rows: Tensor, old: Tensor, taken: Tensor, moved: Tensor,
                             dest: Tensor) -> Tensor:
    """`difference_table` on tensors alone, all on one device: ``rows`` are h after the
    batch of the table's sources (read and activated already), the last ``len(moved)``
    of them those whose difference is taken."""
    fresh = rows.shape[0] - moved.shape[0]
    stacked = torch.cat([rows[:fresh], old[taken], rows[fresh:] - old[moved]])
    return torch.empty_like(stacked).index_copy_(0, dest, stacked)


def difference_table(table: Tensor, slots: np.ndarray, relu: bool, old: Tensor,
                     taken: np.ndarray, moved: np.ndarray, dest: np.ndarray) -> Tensor:
    """The rows a linear layer's messages read, to be transformed in one product, in
    ``old``'s dtype and device: the rows ``slots`` of ``table`` (h after the batch; ReLU of
    them where ``relu``: the table is z) but for the last ``len(moved)``, the rows
    ``taken`` of ``old`` (h before the batch), then the last rows of h minus the rows
    ``moved`` of ``old`` (t of the difference is the difference of t); row k of these
    is row ``dest[k]`` of the result (a permutation)."""
    on_cpu = table.device.type == old.device.type == "cpu"
    kernel = difference_table_numba if on_cpu else difference_table_torch
    return kernel(table, slots, relu, old, taken, moved, dest)


@row_loop
def _activated_loop(z, table, ahead, relu, compare, z_old, fresh, out, moved, ok, old,
                    chunks):
    zero = z.dtype.type(0)
    n, m = z.shape[0], len(ahead)
    for chunk in prange(chunks):  # each chunk its share of the region and of the rows ahead
        for i in range(chunk * n // chunks, (chunk + 1) * n // chunks):
            differs = fresh[i] or not compare
            finite = True
            for j in range(out.shape[1]):
                out[i, j] = _act(z[i, j], relu, zero)
                finite &= np.isfinite(out[i, j])
                if compare:
                    differs |= _act(z_old[i, j], relu, zero) != out[i, j]
            moved[i], ok[i] = differs, finite
        last = (chunk + 1) * m // chunks
        for i in range(chunk * m // chunks, last):
            if i + AHEAD < last:
                prefetch_row(table, ahead[i + AHEAD])
            for j in range(out.shape[1]):
                out[n + i, j] = _act(table[ahead[i], j], relu, zero)
    k = 0  # the old rows of those that moved, in order (on the calling thread)
    for i in range(n if compare else 0):
        if moved[i] and not fresh[i]:
            for j in range(out.shape[1]):
                old[k, j] = _act(z_old[i, j], relu, zero)
            k += 1
    return ok.all(), k


def activated_rows_numba(z: Tensor, table: Tensor, ahead: np.ndarray, relu: bool,
                         z_old: Tensor | None, fresh: np.ndarray
                         ) -> tuple[Tensor, np.ndarray, Tensor, bool]:
    rows = z.numpy()
    out = np.empty((len(rows) + len(ahead), rows.shape[1]), rows.dtype)
    moved, ok = np.empty(len(rows), np.bool_), np.empty(len(rows), np.bool_)
    before = rows[:0] if z_old is None else z_old.numpy()
    old = np.empty_like(before)
    finite, kept = _activated_loop(out.size, rows, table.numpy(), ahead, relu,
                                   z_old is not None, before, fresh, out, moved, ok, old)
    return torch.from_numpy(out), moved, torch.from_numpy(old[:kept]), bool(finite)


def activated_rows_torch(z: Tensor, table: Tensor, ahead: np.ndarray, relu: bool,
                         z_old: Tensor | None, fresh: np.ndarray
                         ) -> tuple[Tensor, np.ndarray, Tensor, bool]:
    def act(rows: Tensor) -> Tensor:
        return torch.relu(rows) if relu else rows

    n = z.shape[0]
    ahead_at, fresh_at = upload(z.device, ahead, fresh)
    after = act(torch.cat([z, table.index_select(0, ahead_at)]))
    finite = torch.isfinite(after[:n]).all()
    if z_old is None:
        return after, np.ones(n, np.bool_), after[:0], bool(download(finite)[0])
    old = act(z_old)
    moved_at = (old != after[:n]).any(dim=-1) | fresh_at
    moved, finite = download(moved_at, finite)
    return after, moved, old[moved_at & ~fresh_at], bool(finite)


def activated_rows(z: Tensor, table: Tensor, ahead: np.ndarray, relu: bool,
                   z_old: Tensor | None, fresh: np.ndarray
                   ) -> tuple[Tensor, np.ndarray, Tensor, bool]:
    """h of a region whose pre-activation rows ``z`` are stored already (h = z, or ReLU of
    z where ``relu``), followed by h of the rows ``ahead`` of ``table`` (z of every slot),
    in one pass; which of the region's rows differ from h of ``z_old`` (``fresh`` ones
    count as differing; all, without ``z_old``), h of the old rows of those that differ
    and are not fresh (in order), and whether every row of the region's h is finite: what
    `store_rows_` reports, for a layer whose activation maps each value alone."""
    kernel = activated_rows_numba if z.device.type == "cpu" else activated_rows_torch
    return kernel(z, table, ahead, relu, z_old, fresh)


@njit(cache=True)
def _merge_loop(first, at, second, out):
    k = 0
    for i in range(len(at)):
        if at[i] >= 0:
            out[i] = first[at[i]]
        else:
            out[i] = second[k]
            k += 1


def merge_rows_numba(first: Tensor, at: np.ndarray, second: Tensor) -> Tensor:
    out = np.empty((len(at), first.shape[1]), first.numpy().dtype)
    _merge_loop(first.numpy(), at, second.numpy(), out)
    return torch.from_numpy(out)


def merge_rows_torch(first: Tensor, at: np.ndarray, second: Tensor) -> Tensor:
    taken = at >= 0
    rows = first.new_empty((len(at), first.shape[1]))
    kept, rest, read = upload(first.device, np.flatnonzero(taken), np.flatnonzero(~taken),
                              at[taken].astype(np.int64))
    rows.index_copy_(0, kept, first.index_select(0, read))
    return rows.index_copy_(0, rest, second)


def merge_rows(first: Tensor, at: np.ndarray, second: Tensor) -> Tensor:
    """Row i is row ``at[i]`` of ``first`` where that is not negative, else the next row of
    ``second`` (which has one for each negative ``at``, in order)."""
    kernel = merge_rows_numba if first.device.type == "cpu" else merge_rows_torch
    return kernel(first, at, second)


@njit(cache=True)
def _take_loop(table, index, out):
    rows, taken = table.reshape(table.shape[0], -1), out.reshape(len(index), -1)
    for i in range(len(index)):
        if i + AHEAD < len(index):
            prefetch_row(table, index[i + AHEAD])
        r = index[i]
        for j in range(rows.shape[1]):
            taken[i, j] = rows[r, j]


def take_rows_numba(table: Tensor, index: np.ndarray) -> Tensor:
    rows = table.numpy()
    out = np.empty((len(index), *rows.shape[1:]), rows.dtype)
    _take_loop(rows, index, out)
    return torch.from_numpy(out)


def take_rows_torch(table: Tensor, index: np.ndarray) -> Tensor:
    return table.index_select(0, upload(table.device, index)[0])


def take_rows(table: Tensor, index: np.ndarray) -> Tensor:
    """Rows ``index`` of ``table`` (its rows contiguous), copied: ``index_select``. On CPU
    a numba loop for fewer than 1,024 rows, where torch's call costs several times the
    copy between a batch's kernels; torch's, on two threads, for more."""
    few = table.device.type == "cpu" and len(index) < 1024
    kernel = take_rows_numba if few else take_rows_torch
    return kernel(table, index)


@njit(cache=True)
def _fill_loop(table, index, row):
    rows = table.reshape(table.shape[0], -1)  # a 1-D table: rows of one value
    for i in index:
        for j in range(rows.shape[1]):
            rows[i, j] = row[j]


def fill_rows_numba(tables: list[Tensor], index: np.ndarray, rows: list[Tensor | None]
                    ) -> None:
    for table, row in zip(tables, rows, strict=True):
        values = table.numpy()
        fill = (np.zeros(values[:1].size, values.dtype) if row is None
                else row.numpy().reshape(-1))
        _fill_loop(values, index, fill)


def fill_rows_torch(tables: list[Tensor], index: np.ndarray, rows: list[Tensor | None]
                    ) -> None:
    fill_rows_tensors(tables, upload(tables[0].device, index)[0], rows)


def fill_rows_tensors(tables: list[Tensor], at: Tensor, rows: list[Tensor | None]) -> None:
    """`fill_rows_` with the index ``at`` on the tables' device already."""
    for table, row in zip(tables, rows, strict=True):
        table[at] = 0 if row is None else row


def fill_rows_(tables: list[Tensor], index: np.ndarray, rows: list[Tensor | None]) -> None:
    """``table[index[i]] = row`` for every i, each table with its row (None: zeros): rows
    reset in place. Between a batch's kernels torch's indexed assignment costs many times
    what it does alone, even for a few rows."""
    if not tables:
        return
    kernel = fill_rows_numba if tables[0].device.type == "cpu" else fill_rows_torch
    kernel(tables, index, rows)


@row_loop
def _argmax_loop(rows, out, chunks):
    n = rows.shape[0]
    for chunk in prange(chunks):
        for i in range(chunk * n // chunks, (chunk + 1) * n // chunks):
            best, k = rows[i, 0], 0
            for j in range(1, rows.shape[1]):  # selects, not branches: quicker on 40
                v = rows[i, j]
                better = v > best
                k = j if better else k
                best = v if better else best
            out[i] = k


def argmax_rows_numba(rows: Tensor) -> np.ndarray:
    values = rows.numpy()
    out = np.empty(values.shape[0], np.int64)
    _argmax_loop(values.size, values, out)
    return out


def argmax_rows_torch(rows: Tensor) -> np.ndarray:
    return rows.argmax(-1).cpu().numpy()


def argmax_rows(rows: Tensor) -> np.ndarray:
    """Each row's first largest column (rows finite), as numpy's and torch's argmax: at
    a few tens of columns numpy's costs more than this loop."""
    kernel = argmax_rows_numba if rows.device.type == "cpu" else argmax_rows_torch
    return kernel(rows)
