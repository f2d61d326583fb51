"""The engine's numba kernels against plain numpy/torch: row scatters, the max/min and
softmax deltas and column pulls (both device paths), slot-set unions and positions,
out-edges except a set of pairs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamgnn import cores
from streamgnn.graph import DynamicGraph, pair_keys
from streamgnn.graph.adjacency import entries_except
from streamgnn.models.aggr import MaxAggregation, MinAggregation
from streamgnn.models.extremum_ops import (
    MAX_TIES,
    fold_max_numba,
    fold_max_torch,
    pull_max_columns_numba,
    pull_max_columns_torch,
)
from streamgnn.models.rowops import (
    activated_rows_numba,
    activated_rows_torch,
    argmax_rows_numba,
    argmax_rows_torch,
    combine_rows_numba,
    combine_rows_torch,
    compare_rows_numba,
    compare_rows_torch,
    difference_table_numba,
    difference_table_torch,
    fill_rows_numba,
    fill_rows_torch,
    fold_rows_numba,
    fold_rows_torch,
    in_row_sums_numba,
    in_row_sums_torch,
    merge_rows_numba,
    merge_rows_torch,
    store_rows_numba,
    store_rows_torch,
    take_rows_numba,
    take_rows_torch,
)
from streamgnn.models.softmax_ops import (
    attend_with_self_loop_numba,
    attend_with_self_loop_torch,
    fold_softmax_numba,
    fold_softmax_torch,
)
from streamgnn.updates import AddVertex
from streamgnn.workers.deltas import difference_rows, linear_delta_messages, message_sources
from streamgnn.workers.exchange import Ghosts, pack, unpack
from streamgnn.workers.halo import (
    begin_halo,
    gather_rows_numba,
    gather_rows_torch,
    rows_for,
    take_ghost_rows_numba,
    take_ghost_rows_torch,
)
from streamgnn.workers.placement import bit
from streamgnn.workers.region import NO_GHOSTS, superstep_region
from streamgnn.workers.slotsets import SlotSets, _find_in_runs, remote_pairs
from tests.conftest import random_graph

seeds = st.integers(0, 2**32 - 1)


def threaded(kernel: Callable, chunks: int = 3) -> Callable:
    """``kernel`` with its row loops split into ``chunks`` ranges over threads whatever
    the work's size (`cores.RowLoop`; the tests run torch, and so the loops, on one
    thread): they must give the serial loop's bits."""
    def run(*args):
        with cores.threads_whatever_the_size(chunks):
            return kernel(*args)
    return run


@given(seed=seeds, dtype=st.sampled_from([torch.float32, torch.float64]),
       rows=st.integers(0, 50), cols=st.integers(1, 45), levels=st.integers(1, 6))
def test_argmax_rows_numba_and_torch_pick_the_first_largest_column(seed, dtype, rows, cols,
                                                                  levels):
    """Few distinct values per row, so ties are common: the first largest column wins,
    in whole rows and in a strided view."""
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.integers(0, levels, (rows, cols))).to(dtype)
    for values in (table, table[:, ::2]):
        expected = values.numpy().argmax(axis=1)
        for kernel in (argmax_rows_numba, threaded(argmax_rows_numba), argmax_rows_torch):
            np.testing.assert_array_equal(kernel(values), expected)


@given(seed=seeds, dtype=st.sampled_from([torch.float32, torch.float64]),
       messages=st.integers(0, 60), num=st.integers(1, 12))
def test_combine_rows_numba_and_torch_equal_the_reference(seed, dtype, messages, num):
    rng = np.random.default_rng(seed)
    t = torch.from_numpy(rng.normal(size=(9, 5))).to(dtype)
    rows = rng.integers(0, 9, messages)
    coef = rng.normal(size=messages)
    dst = rng.integers(0, num, messages)
    expected = np.zeros((num, 5))
    np.add.at(expected, dst, coef[:, None] * t.double().numpy()[rows])
    for kernel in (combine_rows_numba, combine_rows_torch):
        got = kernel(t, *(torch.from_numpy(a) for a in (rows, coef, dst)), num)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


@given(seed=seeds, dtype=st.sampled_from([torch.float32, torch.float64]),
       degrees=st.lists(st.integers(0, 6), max_size=8), relu=st.booleans(),
       weighted=st.booleans())
def test_in_row_sums_numba_and_torch_sum_each_vertexs_block(seed, dtype, degrees, relu,
                                                             weighted):
    """Blocks of in-edges laid out with gaps between them and out of order, as the
    adjacency stores them; sums in float64, returned in the dtype asked for."""
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.normal(size=(9, 5))).to(dtype)
    degrees = np.array(degrees, np.int64)
    spans = degrees + rng.integers(0, 3, len(degrees))
    begin = np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64)
    order = rng.permutation(len(degrees))
    begin, end = begin[order], (begin + degrees)[order]
    size = int(end.max(initial=0)) + 2
    src, w = rng.integers(0, 9, size), rng.normal(size=size)
    rows = table.double().numpy()
    rows = np.maximum(rows, 0) if relu else rows
    expected = np.array([(rows[src[b:e]] * (w[b:e, None] if weighted else 1)).sum(0)
                         for b, e in zip(begin, end, strict=True)]).reshape(-1, 5)
    for kernel in (in_row_sums_numba, threaded(in_row_sums_numba), in_row_sums_torch):
        got = kernel(table, relu, begin, end, src, w if weighted else None, torch.float32,
                     torch.device("cpu"))
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


@given(seed=seeds, dtype=st.sampled_from([torch.float32, torch.float64]),
       messages=st.integers(0, 60), num=st.integers(0, 12), limit=st.sampled_from([1.0, 8.0]),
       rescales=st.booleans(), keep=st.booleans())
def test_fold_rows_numba_and_torch_add_messages_to_states_bound_their_rounding_and_read_back(
        seed, dtype, messages, num, limit, rescales, keep):
    rng = np.random.default_rng(seed)
    t = torch.from_numpy(rng.normal(size=(9, 5))).to(dtype)
    region = rng.choice(30, num, replace=False)
    local = rng.integers(0, max(num, 1), messages if num else 0)
    rows, coef = rng.integers(0, 9, len(local)), rng.normal(size=len(local)) * 10
    divisor = rng.integers(1, 4, num).astype(np.float64)
    scale = np.ones(num)  # a mean's rescale d / d' about the bias (and root, as messages)
    if rescales:
        scale = np.where(rng.random(num) < 0.5, 1.0, rng.integers(0, 5, num) / 3)
    bias = rng.normal(size=5)
    base = torch.from_numpy(rng.normal(size=(30, 5)) * 10).to(dtype)
    unit = torch.finfo(dtype).eps / 2
    drift = torch.from_numpy(rng.random(30).astype(np.float32) * 20 * unit)
    summed = base.double().numpy().copy()  # (a float64 base would share its memory)
    summed[region] = scale[:, None] * summed[region] + (1 - scale[:, None]) * bias
    np.add.at(summed, region[local], coef[:, None] * t.double().numpy()[rows])
    expected = torch.from_numpy(summed).to(dtype).numpy()  # one rounding per element
    top = np.abs(expected[region].astype(np.float64)).max(axis=1, initial=0.0)  # stored rows
    before = np.abs(base.double().numpy()[region]).max(axis=1, initial=0.0)
    grown = drift.numpy().astype(np.float64)
    grown[region] = np.maximum(scale, 1.0) * grown[region] + unit * np.maximum(  # grown
        top, np.maximum(scale, 1.0) * before)
    grown = grown.astype(np.float32)
    wear = grown[region] / (limit * unit * np.maximum(top, 1.0))
    for kernel in (fold_rows_numba, threaded(fold_rows_numba), fold_rows_torch):
        state, bound = base.clone(), drift.clone()
        out, got_wear, got_before = kernel(state, bound, t, rows, coef, local, region,
                                            divisor, limit, scale, bias, keep)
        if keep:  # the region's rows as they were
            assert got_before.dtype == dtype
            np.testing.assert_array_equal(got_before.numpy(), base.numpy()[region])
        else:
            assert got_before is None
        np.testing.assert_allclose(state.numpy(), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(bound.numpy(), grown, rtol=1e-6)
        np.testing.assert_allclose(got_wear, wear, rtol=1e-6)
        assert out.dtype == dtype
        np.testing.assert_allclose(out.double().numpy(), expected[region] / divisor[:, None],
                                   rtol=1e-6 if dtype == torch.float32 else 1e-12)


@given(seed=seeds, count=st.integers(0, 20), keep_old=st.booleans(),
       poison=st.sampled_from([None, np.nan, np.inf]))
def test_store_rows_numba_and_torch_report_changed_rows_their_old_values_and_finiteness(
        seed, count, keep_old, poison):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(30, 4)).astype(np.float32)
    index = rng.choice(30, count, replace=False)
    rows = table[index].copy()
    changes = rng.random(count) < 0.5
    rows[changes, rng.integers(0, 4, count)[changes]] += 1.0
    fresh = rng.random(count) < 0.2
    if poison is not None and count:
        rows[0, 0] = poison
    expected = table.copy()
    expected[index] = rows
    moved = (rows != table[index]).any(axis=1) | fresh
    for kernel in (store_rows_numba, store_rows_torch):
        stored = torch.from_numpy(table.copy())
        got_moved, old, finite = kernel(stored, index, torch.from_numpy(rows), fresh, keep_old)
        np.testing.assert_array_equal(stored.numpy(), expected)
        np.testing.assert_array_equal(got_moved, moved)
        np.testing.assert_array_equal(
            old.numpy(), table[index[moved & ~fresh]] if keep_old else np.zeros((0, 4)))
        assert finite == (poison is None or not count)


@given(seed=seeds, count=st.integers(0, 20), with_old=st.booleans(),
       poison=st.sampled_from([None, np.nan, np.inf]))
def test_compare_rows_numba_and_torch_report_changed_rows_and_finiteness(
        seed, count, with_old, poison):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(count, 4)).astype(np.float32)
    new = old.copy()
    changes = rng.random(count) < 0.5
    new[changes, rng.integers(0, 4, count)[changes]] += 1.0
    fresh = rng.random(count) < 0.2
    if poison is not None and count:
        new[0, 0] = poison
    moved = (new != old).any(axis=1) | fresh if with_old else np.ones(count, bool)
    for kernel in (compare_rows_numba, compare_rows_torch):
        got, finite = kernel(torch.from_numpy(old) if with_old else None,
                             torch.from_numpy(new), fresh)
        np.testing.assert_array_equal(got, moved)
        assert finite == (poison is None or not count)


def _relu(rows: np.ndarray) -> np.ndarray:
    return np.where(rows < 0, 0, rows).astype(rows.dtype)


@given(seed=seeds, fresh=st.integers(0, 6), taken=st.integers(0, 6), moved=st.integers(0, 6),
       relu=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]))
def test_difference_table_numba_and_torch_stack_new_old_and_difference_rows(
        seed, fresh, taken, moved, relu, dtype):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(20, 5)).astype(np.float32)  # (the features: float32)
    slots = rng.choice(20, fresh + moved, replace=False)
    old = rng.normal(size=(8, 5)).astype(dtype)
    at_taken, at_moved = rng.integers(0, 8, taken), rng.integers(0, 8, moved)
    rows = table[slots].astype(dtype)
    rows = _relu(rows) if relu else rows
    stacked = np.concatenate([rows[:fresh], old[at_taken], rows[fresh:] - old[at_moved]])
    dest = rng.permutation(len(stacked))
    expected = np.empty_like(stacked)
    expected[dest] = stacked
    for kernel in (difference_table_numba, difference_table_torch):
        got = kernel(torch.from_numpy(table), slots, relu, torch.from_numpy(old), at_taken,
                     at_moved, dest)
        assert got.dtype == torch.from_numpy(old).dtype
        np.testing.assert_array_equal(got.numpy(), expected)


@given(seed=seeds, count=st.integers(0, 12), ahead=st.integers(0, 5), with_old=st.booleans(),
       relu=st.booleans(), poison=st.sampled_from([None, np.nan, np.inf, -np.inf]))
def test_activated_rows_numba_and_torch_activate_compare_and_keep_the_old_rows(
        seed, count, ahead, with_old, relu, poison):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(30, 4)).astype(np.float32)
    table[rng.random(table.shape) < 0.1] = -0.0  # ReLU keeps -0.0 as torch's does
    region = rng.choice(30, count, replace=False)
    slots_ahead = rng.choice(30, ahead, replace=False)
    z_old = table[region].copy()
    changes = rng.random(count) < 0.5
    table[region[changes], rng.integers(0, 4, count)[changes]] -= 1.0  # h may or may not move
    if poison is not None and count:
        table[region[0], 0] = poison
    z = table[region].copy()
    fresh = rng.random(count) < 0.2
    act = _relu if relu else (lambda rows: rows)
    after = act(np.concatenate([z, table[slots_ahead]]))
    moved = ((act(z_old) != after[:count]).any(axis=1) | fresh if with_old
             else np.ones(count, bool))
    for kernel in (activated_rows_numba, threaded(activated_rows_numba),
                   activated_rows_torch):
        got, got_moved, old, finite = kernel(
            torch.from_numpy(z), torch.from_numpy(table), slots_ahead, relu,
            torch.from_numpy(z_old) if with_old else None, fresh)
        np.testing.assert_array_equal(got.numpy(), after)
        assert (np.signbit(got.numpy()) == np.signbit(after)).all()
        np.testing.assert_array_equal(got_moved, moved)
        np.testing.assert_array_equal(
            old.numpy(), act(z_old)[moved & ~fresh] if with_old else np.zeros((0, 4)))
        assert finite == bool(np.isfinite(after[:count]).all())


@given(seed=seeds, count=st.integers(0, 12), dtype=st.sampled_from([np.float32, np.float64]))
def test_merge_rows_numba_and_torch_take_rows_from_the_first_table_or_else_the_second(
        seed, count, dtype):
    rng = np.random.default_rng(seed)
    first = rng.normal(size=(6, 3)).astype(dtype)
    at = np.where(rng.random(count) < 0.5, rng.integers(0, 6, count), -1)
    second = rng.normal(size=(int((at < 0).sum()), 3)).astype(dtype)
    expected = np.empty((count, 3), dtype)
    expected[at >= 0] = first[at[at >= 0]]
    expected[at < 0] = second
    for kernel in (merge_rows_numba, merge_rows_torch):
        got = kernel(torch.from_numpy(first), at, torch.from_numpy(second))
        np.testing.assert_array_equal(got.numpy(), expected)


@given(seed=seeds, count=st.integers(0, 6), shape=st.sampled_from([(9, 4), (9,)]),
       dtype=st.sampled_from([np.float32, np.uint8]), zeros=st.booleans())
def test_fill_rows_numba_and_torch_set_each_tables_rows_to_its_row_and_leave_the_rest(
        seed, count, shape, dtype, zeros):
    rng = np.random.default_rng(seed)
    base = rng.integers(1, 100, shape).astype(dtype)
    index = rng.choice(shape[0], count, replace=False)
    row = None if zeros else rng.integers(1, 100, shape[1:]).astype(dtype)
    expected = base.copy()
    expected[index] = 0 if zeros else row
    for kernel in (fill_rows_numba, fill_rows_torch):
        tables = [torch.from_numpy(base.copy()), torch.from_numpy(base.copy())]
        kernel(tables, index, [None if zeros else torch.from_numpy(row), None])
        np.testing.assert_array_equal(tables[0].numpy(), expected)
        expected_zeros = base.copy()
        expected_zeros[index] = 0
        np.testing.assert_array_equal(tables[1].numpy(), expected_zeros)


@given(seed=seeds, count=st.integers(0, 12), shape=st.sampled_from([(9, 4), (9,), (9, 2, 3)]))
def test_take_rows_numba_and_torch_copy_the_given_rows(seed, count, shape):
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    index = rng.integers(0, shape[0], count)
    for kernel in (take_rows_numba, take_rows_torch):
        got = kernel(table, index)
        np.testing.assert_array_equal(got.numpy(), table.numpy()[index])
        assert got.shape == (count, *shape[1:])


@given(seed=seeds, differences=st.booleans())
def test_message_sources_find_the_sources_and_their_rows_as_the_set_operations_do(
        seed, differences):
    """`message_sources` in one pass against the slot-set operations and `difference_rows`
    it stands for, and the scratch arrays it borrows are left clean."""
    rng = np.random.default_rng(seed)
    size = 60
    sets = SlotSets(size)
    alive = rng.random(size) < 0.8

    def some(count):
        return rng.choice(size, int(rng.integers(0, count + 1)), replace=False)

    sources, removed, extra = np.sort(some(8)), some(3), some(3)
    src, dst = rng.integers(0, size, 12), rng.integers(0, size, 12)
    has, had = rng.random(12) < 0.6, rng.random(12) < 0.6
    at = rng.integers(0, len(sources), 10 if len(sources) else 0)
    old_slots = sources[rng.random(len(sources)) < 0.7]
    own_slots = sources[rng.random(len(sources)) < 0.5]
    got = message_sources(sources, at, src, dst, has, had, alive, old_slots, removed, extra,
                          own_slots, differences, sets.mark, sets.scratch)
    slots = np.unique(np.concatenate([sources, src, removed, extra]))
    prior = np.full(len(slots), -1)
    prior[np.searchsorted(slots, np.concatenate([old_slots, removed]))] = np.arange(
        len(old_slots) + len(removed))
    at1, at2 = np.searchsorted(slots, sources[at]), np.searchsorted(slots, src)
    own, extra_at = np.searchsorted(slots, own_slots), np.searchsorted(slots, extra)
    live_has, live_had = has & alive[dst], had & alive[dst]
    if differences:
        table = difference_rows(prior, at1, at2, live_has, live_had, extra_at, own)
    else:
        n, none = len(slots), np.zeros(0, np.int64)
        table = (np.arange(n), np.where(prior >= 0, n + prior, np.arange(n)),
                 np.full(n, -1), none, none, none, none, n + len(old_slots) + len(removed))
    expected = (slots, at1, at2, live_has, live_had, own, extra_at, prior, *table)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sets.union(slots[::-1]), slots)  # marks left clean


def _extremum(msgs: np.ndarray, sign: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Max of ``sign * msgs`` per column (0 for none) and how many messages equal it."""
    if not len(msgs):
        return np.zeros(d), np.zeros(d, np.int64)
    best = (sign * msgs).max(axis=0)
    return best, (sign * msgs == best).sum(axis=0)


@given(seed=seeds, sign=st.sampled_from([1.0, -1.0]), dtype=st.sampled_from(
    [torch.float32, torch.float64]))
def test_max_fold_numba_and_torch_keep_max_and_ties(seed, sign, dtype):
    """Fold arrivals and removals into max states and ties built from scratch, with values
    from a few integers (ties everywhere): exactly the columns whose every carrier left
    with no arrival reaching the old max are lost; every other column holds the max and
    the tie count of its remaining messages; both kernels agree."""
    rng = np.random.default_rng(seed)
    num, d = 6, 5

    def messages(least: int, most: int) -> np.ndarray:
        return rng.integers(-2, 3, size=(rng.integers(least, most + 1), d)).astype(np.float64)

    before = [messages(1, 5) for _ in range(num)]
    gone = [rng.random(len(m)) < 0.4 for m in before]
    arriving = [messages(0, 2) for _ in range(num)]
    after = [np.concatenate([m[~g], a]) for m, g, a in zip(before, gone, arriving)]
    start = [_extremum(m, sign, d) for m in before]
    expected_lost = np.zeros((num, d), bool)
    for i in range(num):
        left = (sign * before[i][~gone[i]] == start[i][0]).sum(axis=0)
        reached = (sign * arriving[i] >= start[i][0]).any(axis=0)
        expected_lost[i] = (left == 0) & ~reached
    expected = [_extremum(m, sign, d) for m in after]

    # Messages as rows of a table times a factor (half of them 2 x half the row), to the
    # destinations region[at] (slots 3 * i), shuffled.
    region = 3 * np.arange(num)
    rows = np.concatenate(before + arriving)
    factor = np.where(rng.random(len(rows)) < 0.5, 2.0, 1.0).astype(np.float32)
    table = torch.from_numpy(rows / factor[:, None]).to(dtype)
    at = np.repeat(np.tile(np.arange(num), 2), [len(m) for m in before + arriving])
    leaving = np.concatenate(gone + [np.zeros(len(m), bool) for m in arriving])
    arriving_at = np.arange(len(rows)) >= sum(len(m) for m in before)

    def messages(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        index = rng.permutation(np.flatnonzero(chosen))
        return index, factor[index], at[index]

    for kernel in (fold_max_numba, fold_max_torch):
        state = torch.zeros((3 * num, d), dtype=dtype)
        ties = torch.zeros((3 * num, d), dtype=torch.uint8)
        state[region] = torch.from_numpy(np.array([s for s, _ in start])).to(dtype)
        ties[region] = torch.from_numpy(np.array([t for _, t in start])).to(torch.uint8)
        dst, cols = kernel(state, ties, table, region, messages(arriving_at),
                           messages(leaving), sign, 1e-6)
        assert (np.diff(dst.numpy()) > 0).all()
        lost = np.zeros((num, d), bool)
        lost[dst.numpy() // 3] = cols.numpy()
        state, ties = state[region], ties[region]
        np.testing.assert_array_equal(lost, expected_lost)
        assert cols.numpy().any(axis=1).all()  # only destinations that lost a column
        np.testing.assert_array_equal(state.numpy()[~lost],
                                      np.array([s for s, _ in expected])[~lost])
        np.testing.assert_array_equal(ties.numpy()[~lost],
                                      np.array([t for _, t in expected])[~lost])


def test_max_fold_loses_a_column_to_a_near_miss_and_saturates_ties():
    """A message that leaves within the tolerance of the max but not equal to it may be
    the carrier computed in another order: the column is lost however many ties there
    are. A clear miss changes nothing; ties stop counting at 255 (a lower bound)."""
    table = torch.tensor([[0.0, 0.0, 1.0], [1.0 - 1e-7, 0.5, 1.0], [0.5, 0.5, 0.5]])
    one = np.ones(3, np.float32)
    for kernel in (fold_max_numba, fold_max_torch):
        state = torch.tensor([[1.0, 1.0, 1.0]])
        ties = torch.tensor([[2, 2, 255]], dtype=torch.uint8)
        dst, cols = kernel(state, ties, table, np.array([0]),
                           (np.array([0]), one[:1], np.array([0])),
                           (np.array([1, 2]), one[:2], np.array([0, 0])), 1.0, 1e-6)
        assert dst.tolist() == [0] and cols.tolist() == [[True, False, False]]
        assert ties[0, 1:].tolist() == [2, 254]


@given(seed=seeds, sign=st.sampled_from([1.0, -1.0]), weighted=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_max_column_pulls_numba_and_torch_equal_the_reference(seed, sign, weighted, dtype):
    """The chosen columns of each destination re-aggregated from its in-edges (max of
    ``sign * factor * row`` and its tie count; 0 and no tie without in-edges), the other
    columns left as they were."""
    rng = np.random.default_rng(seed)
    num, d = 5, 6
    table = torch.from_numpy(rng.integers(-2, 3, size=(8, d))).to(dtype)
    degree = rng.integers(0, 5, num)
    begin = rng.integers(0, 20, num)  # blocks of in-edges in arrays of 30, anywhere
    end = begin + degree
    src = rng.integers(0, 8, 30).astype(np.int32)
    factor = rng.choice([0.5, 1.0, 2.0], 30).astype(np.float32)
    dst = rng.choice(12, num, replace=False)
    cols = rng.random((num, d)) < 0.5
    base = rng.normal(size=(12, d))
    base_ties = rng.integers(0, 9, size=(12, d)).astype(np.uint8)
    expected, expected_ties = base.copy(), base_ties.copy()
    for i, v in enumerate(dst):
        f = factor[begin[i]:end[i], None] if weighted else 1.0
        best, count = _extremum(f * table.double().numpy()[src[begin[i]:end[i]]], sign, d)
        expected[v, cols[i]], expected_ties[v, cols[i]] = best[cols[i]], count[cols[i]]
    for kernel in (pull_max_columns_numba, threaded(pull_max_columns_numba),
                   pull_max_columns_torch):
        state = torch.from_numpy(base).to(dtype)
        ties = torch.from_numpy(base_ties.copy())
        kernel(state, ties, torch.from_numpy(dst), torch.from_numpy(cols), table, begin, end,
               src, factor if weighted else None, sign)
        np.testing.assert_array_equal(state.numpy(), expected.astype(state.numpy().dtype))
        np.testing.assert_array_equal(ties.numpy(), expected_ties)


@given(seed=seeds, aggr=st.sampled_from([MaxAggregation(), MinAggregation()]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_whole_max_states_and_their_ties_equal_the_reference(seed, aggr, dtype):
    """`MaxAggregation.reduce_with_ties` (a planned batch's recompute): each destination's
    state (the max of ``sign * message``, 0 for no message) and its ties, saturating."""
    rng = np.random.default_rng(seed)
    num, d, many = 6, 5, MAX_TIES + 5
    index = np.concatenate([rng.integers(0, num - 1, 40),  # the last gets no message
                            np.zeros(many, np.int64)])
    msg = np.concatenate([rng.integers(-2, 3, size=(40, d)),  # values from a few: ties
                          np.full((many, d), 3 * aggr.sign)]).astype(np.float64)
    state, ties = aggr.reduce_with_ties(torch.from_numpy(msg).to(dtype),
                                        torch.from_numpy(index), num)
    for v in range(num):
        best, count = _extremum(msg[index == v], aggr.sign, d)
        np.testing.assert_array_equal(state[v].numpy(), best.astype(state.numpy().dtype))
        np.testing.assert_array_equal(ties[v].numpy(), np.minimum(count, MAX_TIES))
    assert ties.dtype == aggr.ties_dtype


@given(seed=seeds, sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       slots=st.sampled_from([50, 50_000]))
def test_slot_set_union_positions_and_find(seed, sizes, slots):
    """Among 50 slots a union is found by a scan of the marks, among 50,000 by a sort."""
    rng = np.random.default_rng(seed)
    sets = SlotSets(slots)
    parts = [rng.integers(0, 50, n) for n in sizes]
    parts[0] = parts[0].astype(np.int32)  # mixed dtypes are fine
    alive = rng.random(slots) < 0.7
    union = np.unique(np.concatenate(parts))
    np.testing.assert_array_equal(sets.union(*parts), union)
    live = sets.union(*parts, alive=alive)
    np.testing.assert_array_equal(live, union[alive[union]])
    queries = rng.choice(union, 2 * len(union)) if len(union) else union
    np.testing.assert_array_equal(sets.positions(union, queries),
                                  np.searchsorted(union, queries))
    anywhere = rng.integers(0, 50, 30)  # members or not
    at = np.minimum(np.searchsorted(union, anywhere), max(len(union) - 1, 0))
    found = union[at] == anywhere if len(union) else np.zeros(len(anywhere), bool)
    np.testing.assert_array_equal(sets.find(union, anywhere), np.where(found, at, -1))
    np.testing.assert_array_equal(sets.union(*parts), union)  # scratch left clean


@given(seed=seeds)
def test_remote_pairs_counts_distinct_destination_and_source_owner_pairs(seed):
    """What combining at the sender would send: one message per destination and partition
    owning ghost sources, over the unchanged edges and the changed ones that exist before
    or after into an owned destination."""
    rng = np.random.default_rng(seed)
    sets = SlotSets(30)
    sources = rng.choice(30, 5, replace=False)
    at, v1 = rng.integers(0, 5, 20), rng.integers(0, 30, 20)
    src2, dst2 = rng.integers(0, 30, 12), rng.integers(0, 30, 12)
    had, has = rng.random(12) < 0.5, rng.random(12) < 0.5
    owned, ghost = rng.random(30) < 0.6, rng.random(30) < 0.5
    owner = rng.integers(0, 4, 30)
    sent = (had | has) & owned[dst2]
    edges = [*zip(sources[at].tolist(), v1.tolist()),
             *zip(src2[sent].tolist(), dst2[sent].tolist())]
    expected = {(d, int(owner[s])) for s, d in edges if ghost[s]}
    assert remote_pairs(sources, at, v1, src2, dst2, had, has, owned, ghost, owner,
                        sets.scratch) == len(expected)


def _ghost_graph(size: int) -> DynamicGraph:
    """A graph of ``size`` vertices with external ids 100 + 7 slot (no edges)."""
    graph = DynamicGraph(num_features=1)
    graph.apply([AddVertex(id=100 + 7 * i, x=[0.0]) for i in range(size)])
    return graph


@given(seed=seeds, count=st.integers(0, 20), relu=st.booleans(), unknown=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), weighted=st.booleans())
def test_take_ghost_rows_numba_and_torch_store_rows_and_join_the_moved_ghosts_to_the_sources(
        seed, count, relu, unknown, dtype, weighted):
    """Each received row (read from the packed buffers of two senders as they lie) is
    stored at its ghost's slot, looked up once; a ghost whose row changed (or that the
    batch added) and is not a source yet joins the sources, and, unless added, the old
    slots with its row before (ReLU'd where asked); the rows of an id the graph does not
    know or holds as no ghost are not taken; in-degrees sent are stored, and those that
    changed named."""
    rng = np.random.default_rng(seed)
    graph, sets = _ghost_graph(30), SlotSets(30)
    ghost = rng.random(30) < 0.8
    table = rng.normal(size=(30, 4)).astype(dtype)
    slots = rng.choice(30, count, replace=False)
    rows = table[slots].copy()
    changes = rng.random(count) < 0.6
    rows[changes, rng.integers(0, 4, count)[changes]] += 1.0
    added = np.flatnonzero(rng.random(30) < 0.2)
    sources = np.flatnonzero(rng.random(30) < 0.3)
    old_slots = np.flatnonzero(rng.random(30) < 0.2)
    ids = graph.ext[slots].copy()
    if unknown and count:
        ids[count // 2] = 5  # no vertex has it
    sent_weights = rng.integers(0, 3, count).astype(np.float64) if weighted else None
    split = count // 3
    buffers = [buffer for buffer in (
        pack(Ghosts(ids[:split], rows[:split],
                    None if sent_weights is None else sent_weights[:split])),
        pack(Ghosts(ids[split:], rows[split:],
                    None if sent_weights is None else sent_weights[split:]))) if len(buffer)]
    taken = ghost[slots] & (ids != 5)
    expected_weight = np.ones(30)
    if weighted:
        expected_weight[slots[taken]] = sent_weights[taken]
    slots, rows = slots[taken], rows[taken]
    fresh = np.isin(slots, added)
    joins = ((rows != table[slots]).any(axis=1) | fresh) & ~np.isin(slots, sources)
    replaced = joins & ~fresh
    expected = table.copy()
    expected[slots] = rows
    before = table[slots[replaced]]
    if not buffers:  # (`incoming` passes none)
        return
    for kernel in (take_ghost_rows_numba, take_ghost_rows_torch):
        stored, in_weight = torch.from_numpy(table.copy()), np.ones(30)
        got_sources, got_old_slots, old, degree, got_weighted = kernel(
            buffers, graph.id_table, ghost, in_weight, stored, relu, added, sources,
            old_slots, sets.mark, sets.scratch)
        assert not sets.mark.any()
        np.testing.assert_array_equal(stored.numpy(), expected)
        np.testing.assert_array_equal(got_sources, np.concatenate([sources, slots[joins]]))
        np.testing.assert_array_equal(got_old_slots,
                                      np.concatenate([old_slots, slots[replaced]]))
        assert old.dtype == stored.dtype
        np.testing.assert_array_equal(old.numpy(), np.maximum(before, 0) if relu else before)
        assert got_weighted == weighted
        np.testing.assert_array_equal(in_weight, expected_weight)
        np.testing.assert_array_equal(degree, slots[expected_weight[slots] != 1.0])


@given(seed=seeds, me=st.integers(0, 3), subscribed=st.integers(0, 5), weighted=st.booleans())
def test_rows_for_sends_the_moved_owned_rows_a_partition_holds_and_those_it_began_to_hold(
        seed, me, subscribed, weighted):
    rng = np.random.default_rng(seed)
    sets = SlotSets(30)
    moved = rng.choice(30, 12, replace=False)
    owned = rng.random(30) < 0.7
    holders = rng.integers(0, 16, 30).astype(np.uint64)
    began = rng.choice(np.flatnonzero(owned), min(subscribed, int(owned.sum())),
                       replace=False)
    by = rng.integers(0, 4, len(began))
    table = torch.from_numpy(rng.normal(size=(30, 3)).astype(np.float32))
    ext = 100 + 7 * np.arange(30)
    in_weight = rng.random(30) if weighted else None
    sent = rows_for(me, 4, moved, owned, holders, began, by, table, ext, in_weight,
                    sets.mark, sets.scratch)
    assert not sets.mark.any() and len(sent) == 4
    for q, buffer in enumerate(sent):
        held = moved[owned[moved] & ((holders[moved] & bit(q)) != 0)]
        slots = np.union1d(held, began[by == q])
        got = unpack(buffer)
        if q == me or not len(slots):
            assert got is None
            continue
        np.testing.assert_array_equal(got.ids, ext[slots])
        np.testing.assert_array_equal(got.rows, table.numpy()[slots])
        assert got.rows.dtype == np.float32
        if weighted:
            np.testing.assert_array_equal(got.in_weight, in_weight[slots])
        else:
            assert got.in_weight is None
        assert len(buffer) == len(pack(got))  # the layout `pack` writes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_rows_numba_and_torch_give_each_slots_row(dtype):
    rng = np.random.default_rng(1)
    table = torch.from_numpy(rng.normal(size=(30, 4)).astype(dtype))
    slots = rng.choice(30, 7, replace=False)
    for gather in (gather_rows_numba, gather_rows_torch):
        rows, at = gather(table, slots)
        np.testing.assert_array_equal(rows[at], table.numpy()[slots])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_pack_and_unpack_carry_ids_rows_and_in_degrees(dtype, weighted):
    rng = np.random.default_rng(0)
    ghosts = Ghosts(rng.integers(0, 1 << 40, 5), rng.normal(size=(5, 3)).astype(dtype),
                    rng.random(5) if weighted else None)
    got = unpack(pack(ghosts))
    np.testing.assert_array_equal(got.ids, ghosts.ids)
    np.testing.assert_array_equal(got.rows, ghosts.rows)
    assert got.rows.dtype == dtype
    if weighted:
        np.testing.assert_array_equal(got.in_weight, ghosts.in_weight)
    else:
        assert got.in_weight is None
    assert unpack(pack(None)) is None
    assert unpack(pack(Ghosts(ghosts.ids[:0], ghosts.rows[:0]))) is None


@given(seed=seeds, unknown=st.booleans())
def test_begin_halo_updates_ghosts_holders_and_owned_as_the_routed_batch_says(seed, unknown):
    rng = np.random.default_rng(seed)
    graph = _ghost_graph(40)
    slot = rng.permutation(40)
    removed, added, ghosts, subscribed, unsubscribed = np.split(slot[:25], [4, 9, 14, 20])
    owners, subscribers, unsubscribers = (rng.integers(0, 4, n) for n in (5, 6, 5))
    ghost, holders = rng.random(40) < 0.4, rng.integers(0, 16, 40).astype(np.uint64)
    ghost_owner = rng.integers(0, 4, 40).astype(np.int16)
    owned, in_weight = rng.random(40) < 0.5, rng.random(40)
    expected = [a.copy() for a in (ghost, ghost_owner, holders, owned, in_weight)]
    e_ghost, e_owner, e_holders, e_owned, e_weight = expected
    e_weight[removed[ghost[removed]]] = 0.0
    e_ghost[removed] = e_ghost[added] = False
    e_holders[removed] = e_holders[added] = 0
    e_ghost[ghosts], e_owner[ghosts] = True, owners
    for s, q in zip(subscribed, subscribers, strict=True):
        e_holders[s] |= bit(q)
    for s, q in zip(unsubscribed, unsubscribers, strict=True):
        e_holders[s] &= ~bit(q)
    e_owned[removed] = False
    e_owned[added] = ~e_ghost[added]
    ids = [graph.ext[s].copy() for s in (ghosts, subscribed, unsubscribed)]
    if unknown:
        ids[1][2] = 5  # no vertex has it
        expected = [a.copy() for a in (ghost, ghost_owner, holders, owned, in_weight)]
    got, slots = begin_halo(graph.id_table, removed, added, ids[0], owners, ids[1],
                            subscribers, ids[2], unsubscribers, ghost, ghost_owner, holders,
                            owned, in_weight)
    assert got == (len(ghosts) + 2 if unknown else -1)
    for ours, theirs in zip((ghost, ghost_owner, holders, owned, in_weight), expected,
                            strict=True):
        np.testing.assert_array_equal(ours, theirs)
    if not unknown:
        np.testing.assert_array_equal(slots, subscribed)


@given(seed=seeds, queries=st.integers(0, 40))
def test_find_in_two_ascending_runs_is_find(seed, queries):
    """Few queries search the runs, many mark the members: either way `find`'s answer."""
    rng = np.random.default_rng(seed)
    sets = SlotSets(200)
    first = np.sort(rng.choice(200, rng.integers(0, 60), replace=False))
    second = np.sort(np.setdiff1d(rng.choice(200, rng.integers(0, 60), replace=False), first))
    members = np.concatenate([first, second]).astype(np.int64)
    asked = np.concatenate([rng.integers(0, 200, queries), second[:3]])  # (some in run 2)
    expected = sets.find(members, asked)
    np.testing.assert_array_equal(sets.find_in_runs(members, len(first), asked), expected)
    np.testing.assert_array_equal(_find_in_runs(members, len(first), asked), expected)
    for split in (0, len(members)):  # one run only: all of it ascending
        whole = np.sort(members)
        np.testing.assert_array_equal(_find_in_runs(whole, split, asked),
                                      sets.find(whole, asked))


@given(seed=seeds, weighted=st.booleans(), roots=st.booleans())
def test_linear_messages_from_differences_sum_as_new_and_old_rows_do(seed, weighted, roots):
    """A linear aggregation's messages per destination, built on a table of t of the rows
    after the batch, before it and of their differences (`difference_rows`), and built on
    the rows after and before alone: both equal the sum written out edge by edge (every
    row read lies in its table). ``roots``: each row of the table stands for a message
    row and a root-term row (`Layer.rel_root`), and sources send their own state their
    root terms' change."""
    rng = np.random.default_rng(seed)
    n, d, e, slots = int(rng.integers(1, 12)), 3, 2, 40
    h_new = rng.standard_normal((n, d))
    prior = np.where(rng.random(n) < 0.6, -1, 0)  # -1: no row before (added)
    prior[prior == 0] = rng.permutation(int((prior == 0).sum()))
    h_old = np.zeros((max(prior.max() + 1, 0), d))
    h_old[prior[prior >= 0]] = rng.standard_normal((int((prior >= 0).sum()), d))
    weights = rng.standard_normal((2 * e if roots else e, d))

    def t(rows, paired=None):  # rel_root's: rel and root interleaved for the first paired
        paired = len(rows) if paired is None or not roots else paired
        both = (rows[:paired] @ weights.T).reshape(-1, e)
        return np.concatenate([both, rows[paired:] @ weights[:e].T])

    region = np.sort(rng.choice(slots, 8, replace=False))
    moved_sources = np.flatnonzero(prior >= 0)
    at1 = rng.choice(moved_sources, 10) if len(moved_sources) else np.zeros(0, np.int64)
    v1, w1 = rng.choice(region, len(at1)), rng.random(len(at1)).astype(np.float32)
    at2 = rng.integers(0, n, 10)
    dst2 = rng.choice(region, 10)
    has, had = rng.random(10) < 0.6, rng.random(10) < 0.6
    before, after = rng.random(10).astype(np.float32), rng.random(10).astype(np.float32)
    own = np.unique(rng.integers(0, n, 4)) if roots else None
    own_slots = rng.choice(region, len(own)) if roots else None
    dst_scale = rng.random(len(region)) + 0.5
    ones = np.ones(n)

    def summed(new, old, delta, table, paired):
        rows, coef, local = linear_delta_messages(
            new, old, delta, at1, v1, w1, at2, dst2, before, after, has, had, weighted,
            ones, ones, region, dst_scale, np.zeros(slots, np.int64), own, own_slots, paired)
        assert (rows >= 0).all() and (rows < len(table)).all()
        out = np.zeros((len(region), e))
        np.add.at(out, local, coef[:, None] * table[rows])
        return out, rows

    def rel(h):
        return t(h[None])[0]

    def root(h):
        return t(h[None])[1]

    where = {v: k for k, v in enumerate(region)}
    expected = np.zeros((len(region), e))
    for a, v, w in zip(at1, v1, w1, strict=True):
        expected[where[v]] += (w if weighted else 1) * dst_scale[where[v]] * (
            rel(h_new[a]) - rel(h_old[prior[a]]))
    for a, v, b, c, yes, was in zip(at2, dst2, before, after, has, had, strict=True):
        f = dst_scale[where[v]]
        if yes:
            expected[where[v]] += (c if weighted else 1) * f * rel(h_new[a])
        if was:
            h = h_old[prior[a]] if prior[a] >= 0 else h_new[a]
            expected[where[v]] -= (b if weighted else 1) * f * rel(h)
    for a, v in zip(own if roots else [], own_slots if roots else [], strict=True):
        expected[where[v]] += root(h_new[a]) - (root(h_old[prior[a]]) if prior[a] >= 0 else 0)

    full = np.concatenate([h_new, h_old])
    old = np.where(prior >= 0, n + prior, np.arange(n))
    np.testing.assert_allclose(summed(np.arange(n), old, np.full(n, -1), t(full), len(full))[0],
                               expected, atol=1e-12)
    new, old, delta, fresh, taken, moved, dest, paired = difference_rows(
        prior, at1, at2, has, had, np.zeros(0, np.int64),
        own if roots else np.zeros(0, np.int64))
    stacked = np.concatenate([h_new[fresh], h_old[prior[taken]],
                              h_new[moved] - h_old[prior[moved]]])
    np.testing.assert_array_equal(np.sort(dest), np.arange(len(stacked)))
    h = np.empty_like(stacked)
    h[dest] = stacked
    got, rows = summed(new, old, delta, t(h, paired), paired)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    read_roots = rows[(rows < 2 * paired) & (rows % 2 == 1)] // 2
    np.testing.assert_array_equal(np.unique(read_roots), np.arange(paired if roots else 0))


@given(seed=seeds)
def test_difference_rows_put_exactly_the_rows_whose_root_term_is_read_first(seed):
    """Root terms are read of an own source's difference row, or its row after the batch
    where it has none before, and of a rescaled (extra) source's row before: those rows
    and no other are the first ``paired`` (`linear_delta_messages`, `Shard._fold`)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 15))
    prior = np.where(rng.random(n) < 0.4, -1, 0)
    prior[prior == 0] = rng.permutation(int((prior == 0).sum()))
    at1, at2 = rng.integers(0, n, 8), rng.integers(0, n, 8)
    has, had = rng.random(8) < 0.6, rng.random(8) < 0.6
    own, extra = (np.unique(rng.integers(0, n, int(rng.integers(0, 5)))) for _ in range(2))
    new, old, delta, fresh, taken, moved, dest, paired = difference_rows(
        prior, at1, at2, has, had, extra, own)
    np.testing.assert_array_equal(np.sort(dest), np.arange(len(fresh) + len(taken) + len(moved)))
    read = {int(delta[a] if delta[a] >= 0 else new[a]) for a in own}
    read |= {int(old[a]) for a in extra}
    assert read == set(range(paired))


@pytest.mark.parametrize("first", range(1, 17))
def test_slot_sets_grown_to_any_size_cover_every_slot(first):
    """Marks are kept in multiples of 8 (scanned 8 at a time); the scratch grows with
    them, so a set grown a slot at a time holds every slot below its size."""
    sets = SlotSets(first)
    for top in range(first, first + 17):
        sets.fit(top)
        assert len(sets.scratch) >= top
        slots = np.arange(top)
        np.testing.assert_array_equal(sets.union(slots[::-1]), slots)
        np.testing.assert_array_equal(sets.positions(slots, slots[::-1]), slots[::-1])
        np.testing.assert_array_equal(sets.find(slots[:top // 2], slots),
                                      np.where(slots < top // 2, slots, -1))


@given(seed=seeds)
def test_entries_except_skips_exactly_the_given_pairs(seed):
    rng = np.random.default_rng(seed)
    graph = DynamicGraph.from_data(random_graph(rng, n=25, m=90, d=3, hubs=2))
    src, dst, w = graph.edge_slots()
    skip = np.sort(pair_keys(src, dst)[rng.random(len(src)) < 0.3])
    chosen = rng.choice(25, 8, replace=False)
    for vertices in (chosen, np.sort(chosen)):  # a search per vertex; one walk along skip
        at, nbr, weight = entries_except(graph.out.arrays, vertices.astype(np.int64), skip)
        got = sorted(zip(vertices[at].tolist(), nbr.tolist(), weight.tolist()))
        kept = np.isin(src, vertices) & ~np.isin(pair_keys(src, dst), skip)
        expected = sorted(zip(src[kept].tolist(), dst[kept].tolist(), w[kept].tolist()))
        assert got == expected


@given(seed=seeds, read_next=st.booleans())
def test_superstep_region_is_the_out_edges_their_owned_destinations_and_the_rows_read_next(
        seed, read_next):
    rng = np.random.default_rng(seed)
    graph = DynamicGraph.from_data(random_graph(rng, n=25, m=90, d=3, hubs=2))
    src, dst, w = graph.edge_slots()
    skip = np.sort(pair_keys(src, dst)[rng.random(len(src)) < 0.3])
    sources = rng.choice(25, 6, replace=False).astype(np.int64)
    if rng.random() < 0.5:
        sources.sort()  # (ascending sources walk the skipped keys once)
    owned = rng.random(len(graph.alive)) < 0.7
    changed_dst, changed = rng.integers(0, 25, 5), rng.choice(25, 4, replace=False)
    added = np.sort(rng.choice(25, 3, replace=False))
    changed_src, removed = rng.integers(0, 25, 5), rng.choice(25, 2, replace=False)
    had, has = rng.random(5) < 0.5, rng.random(5) < 0.5
    ghost, owner = NO_GHOSTS
    if rng.random() < 0.5:
        ghost, owner = rng.random(len(graph.alive)) < 0.5, rng.integers(0, 4, len(graph.alive))
    sets = SlotSets(len(graph.alive))
    at, v1, w1, region, count, fresh, ahead, pairs = superstep_region(
        graph.out.arrays, sources, skip, changed_dst, changed, owned, graph.in_degree, added,
        changed_src, removed, read_next, sets.mark, sets.scratch, had, has, ghost, owner)
    got = sorted(zip(sources[at].tolist(), v1.tolist(), w1.tolist()))
    kept = np.isin(src, sources) & ~np.isin(pair_keys(src, dst), skip)
    assert got == sorted(zip(src[kept].tolist(), dst[kept].tolist(), w[kept].tolist()))
    reached = np.unique(np.concatenate([v1, changed_dst, changed]))
    np.testing.assert_array_equal(region, reached[owned[reached]])
    np.testing.assert_array_equal(count, graph.in_degree[region])
    np.testing.assert_array_equal(fresh, np.isin(region, added))
    read = np.union1d(changed_src[owned[changed_src]], removed)
    np.testing.assert_array_equal(ahead, np.setdiff1d(read, region) if read_next else [])
    sent = (had | has) & owned[changed_dst]
    edges = [*zip(sources[at].tolist(), v1.tolist()),
             *zip(changed_src[sent].tolist(), changed_dst[sent].tolist())]
    assert pairs == len({(d, int(owner[s])) for s, d in edges if len(ghost) and ghost[s]})
    assert not sets.mark.any()  # left as found


def _softmax_rows(msgs: list[np.ndarray], h: int, c: int) -> np.ndarray:
    """State rows [shift | den | num] of each destination's message list, from scratch."""
    rows = np.zeros((len(msgs), 2 * h + h * c))
    for i, m in enumerate(msgs):
        if not len(m):
            rows[i, :h] = -np.inf
            continue
        shift = m[:, :h].max(axis=0)
        e = np.exp(m[:, :h] - shift)
        rows[i, :h], rows[i, h:2 * h] = shift, e.sum(axis=0)
        rows[i, 2 * h:] = (e[:, :, None] * m[:, h:].reshape(-1, h, c)).sum(axis=0).ravel()
    return rows


@given(seed=seeds, h=st.integers(1, 3), c=st.integers(1, 4), spread=st.sampled_from([1, 30]))
def test_softmax_fold_numba_and_torch_equal_reaggregation(seed, h, c, spread):
    """Fold removals and arrivals, each read from its source's row of t (values, source
    score) and its destination's score, into states built from scratch: every destination
    not reported cancelled holds the softmax of its remaining messages (same weighted
    values and denominators as re-aggregating), empty ones included; both kernels agree.
    (Slope 1: the logits are the float32 sums of the two scores on both sides.)"""
    rng = np.random.default_rng(seed)
    num = 6
    part = (rng.normal(size=(num, h)) * spread).astype(np.float32)  # destination scores

    def sources(most: int) -> np.ndarray:
        """t rows [k, h, c + 2] of ``most`` or fewer sources: values, score, unused."""
        t = rng.normal(size=(rng.integers(0, most), h, c + 2)).astype(np.float32)
        t[:, :, c] *= spread  # wide logits: one message can dwarf the rest
        return t

    def as_messages(t: np.ndarray, i: int) -> np.ndarray:
        """[logit | values] rows of sources ``t`` arriving at destination ``i``."""
        logits = (t[:, :, c] + part[i]).astype(np.float64)
        return np.concatenate([logits, t[:, :, :c].reshape(len(t), h * c)], axis=1)

    before = [sources(5) for _ in range(num)]
    gone = [rng.random(len(t)) < 0.4 for t in before]
    arriving = [sources(3) for _ in range(num)]
    old = [t[g] for t, g in zip(before, gone)]
    table = torch.from_numpy(np.concatenate(old + arriving))
    sizes = [len(t) for t in old + arriving]
    at = np.repeat(np.tile(np.arange(num), 2), sizes)
    rows = np.arange(len(at))
    leaving, coming = slice(0, sum(sizes[:num])), slice(sum(sizes[:num]), None)
    region = np.arange(num)
    after = [np.concatenate([t[~g], a]) for t, g, a in zip(before, gone, arriving)]
    expected = _softmax_rows([as_messages(t, i) for i, t in enumerate(after)], h, c)
    start = torch.from_numpy(_softmax_rows([as_messages(t, i) for i, t in enumerate(before)],
                                           h, c))
    results = []
    for kernel in (fold_softmax_numba, fold_softmax_torch):
        state = start.clone()
        cancelled = kernel(state, table, c, region, (rows[coming], at[coming]),
                           (rows[leaving], at[leaving]), torch.from_numpy(part), 1.0,
                           1e-6).numpy()
        kept = np.setdiff1d(np.arange(num), cancelled)
        results.append((state.numpy()[kept], cancelled))
        for i in kept:
            got, want = state.numpy()[i], expected[i]
            if not len(after[i]):  # never had a message: still the empty state
                assert not len(before[i]) and np.all(got[h:] == 0) and np.all(got[:h] == -np.inf)
                continue
            np.testing.assert_allclose(got[h:2 * h] * np.exp(got[:h]),
                                       want[h:2 * h] * np.exp(want[:h]), rtol=1e-6)
            np.testing.assert_allclose(got[2 * h:].reshape(h, c) / got[h:2 * h, None],
                                       want[2 * h:].reshape(h, c) / want[h:2 * h, None],
                                       rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-9, atol=1e-12)


@given(seed=seeds, h=st.integers(1, 3), c=st.integers(1, 4), spread=st.sampled_from([1, 30]))
def test_self_loop_attention_numba_and_torch_equal_the_softmax(seed, h, c, spread):
    """The softmax over a vertex's in-edges and its self-loop, from the in-edges' state and
    the self-loop's logit and value, equals the softmax over all of them at once (a vertex
    without in-edges attends to itself only)."""
    rng = np.random.default_rng(seed)
    msgs = [rng.normal(size=(rng.integers(0, 4), h + h * c)) for _ in range(5)]
    own = [rng.normal(size=h + h * c) for _ in range(5)]
    for m, o in zip(msgs, own):
        m[:, :h] *= spread
        o[:h] *= spread
    state = torch.from_numpy(_softmax_rows(msgs, h, c))
    everything = _softmax_rows([np.vstack([m, o]) for m, o in zip(msgs, own)], h, c)
    expected = everything[:, 2 * h:].reshape(-1, h, c) / everything[:, h:2 * h, None]
    own = torch.from_numpy(np.array(own))
    order = torch.from_numpy(rng.permutation(len(msgs)))  # rows read where they are
    table = torch.zeros((len(msgs), state.shape[1]), dtype=state.dtype)
    table[order] = state
    for kernel in (attend_with_self_loop_numba, attend_with_self_loop_torch):
        for at, rows in ((state, None), (table, order)):
            got = kernel(at, rows, own[:, :h].contiguous(), own[:, h:].reshape(-1, h, c))
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-12)
