"""The engine's numba kernels against plain numpy/torch: row scatters and tests, the softmax
delta (both device paths), slot-set unions and positions, out-edges except a set of
pairs."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamgnn.graph import DynamicGraph, pair_keys
from streamgnn.models.rowops import (
    combine_rows_numba,
    combine_rows_torch,
    fold_rows_numba,
    fold_rows_torch,
    max_rows_numba,
    max_rows_torch,
    reaches_rows_numba,
    reaches_rows_torch,
    store_rows_numba,
    store_rows_torch,
)
from streamgnn.models.softmax_ops import (
    attend_with_self_loop_numba,
    attend_with_self_loop_torch,
    fold_softmax_numba,
    fold_softmax_torch,
)
from streamgnn.workers.slotsets import SlotSets
from tests.conftest import random_graph

seeds = st.integers(0, 2**32 - 1)


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
        got = kernel(t, rows, coef, dst, num)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


@given(seed=seeds, dtype=st.sampled_from([torch.float32, torch.float64]),
       messages=st.integers(0, 60), num=st.integers(0, 12), limit=st.sampled_from([1.0, 8.0]))
def test_fold_rows_numba_and_torch_add_messages_to_states_bound_their_rounding_and_read_back(
        seed, dtype, messages, num, limit):
    rng = np.random.default_rng(seed)
    t = torch.from_numpy(rng.normal(size=(9, 5))).to(dtype)
    region = rng.choice(30, num, replace=False)
    local = rng.integers(0, max(num, 1), messages if num else 0)
    rows, coef = rng.integers(0, 9, len(local)), rng.normal(size=len(local)) * 10
    divisor = rng.integers(1, 4, num).astype(np.float64)
    base = torch.from_numpy(rng.normal(size=(30, 5)) * 10).to(dtype)
    unit = torch.finfo(dtype).eps / 2
    drift = torch.from_numpy(rng.random(30).astype(np.float32) * 20 * unit)
    summed = base.double().numpy().copy()  # (a float64 base would share its memory)
    np.add.at(summed, region[local], coef[:, None] * t.double().numpy()[rows])
    expected = torch.from_numpy(summed).to(dtype).numpy()  # one rounding per element
    top = np.abs(summed[region]).max(axis=1, initial=0.0)
    grown = drift.numpy().copy()
    grown[region] += (unit * top).astype(np.float32)
    stale = grown[region] > limit * unit * np.maximum(top, 1.0)
    for kernel in (fold_rows_numba, fold_rows_torch):
        state, bound = base.clone(), drift.clone()
        out, got_stale = kernel(state, bound, t, rows, coef, local, region, divisor, limit)
        np.testing.assert_allclose(state.numpy(), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(bound.numpy(), grown, rtol=1e-6)
        np.testing.assert_array_equal(got_stale, stale)
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


@given(seed=seeds, count=st.integers(0, 40))
def test_max_rows_numba_and_torch_equal_the_reference(seed, count):
    rng = np.random.default_rng(seed)
    index = torch.from_numpy(rng.integers(0, 10, count))  # repeats
    rows = torch.from_numpy(rng.normal(size=(count, 4)).astype(np.float32))
    base = torch.from_numpy(rng.normal(size=(10, 4)).astype(np.float32))
    expected = base.numpy().copy()
    np.maximum.at(expected, index.numpy(), rows.numpy())
    for kernel in (max_rows_numba, max_rows_torch):
        state = base.clone()
        kernel(state, index, rows)
        np.testing.assert_array_equal(state.numpy(), expected)


@given(seed=seeds, count=st.integers(0, 40))
def test_reaches_rows_numba_and_torch_equal_the_reference(seed, count):
    rng = np.random.default_rng(seed)
    index = torch.from_numpy(rng.integers(0, 10, count))
    state = torch.from_numpy(rng.integers(-2, 3, size=(10, 3)).astype(np.float32))
    rows = torch.from_numpy(rng.integers(-2, 3, size=(count, 3)).astype(np.float32))
    rows += torch.from_numpy(rng.choice([0, -1e-7, -1e-3], size=(count, 3)).astype(np.float32))
    current = state.numpy()[index.numpy()]
    expected = (rows.numpy() >= current - 1e-6 * np.abs(current)).any(axis=1)
    for kernel in (reaches_rows_numba, reaches_rows_torch):
        np.testing.assert_array_equal(kernel(state, index, rows, 1e-6).numpy(), expected)


@given(seed=seeds, sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       slots=st.sampled_from([50, 5000]))
def test_slot_set_union_positions_and_find(seed, sizes, slots):
    """Among 50 slots a union is found by a scan of the marks, among 5000 by a sort."""
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
def test_out_edges_except_skips_exactly_the_given_pairs(seed):
    rng = np.random.default_rng(seed)
    graph = DynamicGraph.from_data(random_graph(rng, n=25, m=90, d=3, hubs=2))
    src, dst, w = graph.edge_slots()
    skip = np.sort(pair_keys(src, dst)[rng.random(len(src)) < 0.3])
    vertices = rng.choice(25, 8, replace=False)
    at, nbr, weight = graph.out_edges_except(vertices, skip)
    got = sorted(zip(vertices[at].tolist(), nbr.tolist(), weight.tolist()))
    chosen = np.isin(src, vertices) & ~np.isin(pair_keys(src, dst), skip)
    expected = sorted(zip(src[chosen].tolist(), dst[chosen].tolist(), w[chosen].tolist()))
    assert got == expected


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
    """Fold removals and arrivals into states built from scratch: every destination not
    reported cancelled holds the softmax of its remaining messages (same weighted values
    and denominators as re-aggregating), empty ones included; both kernels agree."""
    rng = np.random.default_rng(seed)
    num = 6

    def messages(most: int) -> np.ndarray:
        m = rng.normal(size=(rng.integers(0, most), h + h * c)).astype(np.float32)
        m[:, :h] *= spread  # wide logits: one message can dwarf the rest
        return m.astype(np.float64)

    before = [messages(5) for _ in range(num)]
    gone = [rng.random(len(m)) < 0.4 for m in before]
    arriving = [messages(3) for _ in range(num)]
    after = [np.concatenate([m[~g], a]) for m, g, a in zip(before, gone, arriving)]
    old = [m[g] for m, g in zip(before, gone)]
    old_msg = torch.from_numpy(np.concatenate(old)).float()
    old_dst = torch.from_numpy(np.repeat(np.arange(num), [len(m) for m in old]))
    new_msg = torch.from_numpy(np.concatenate(arriving)).float()
    new_dst = torch.from_numpy(np.repeat(np.arange(num), [len(m) for m in arriving]))
    expected = _softmax_rows(after, h, c)
    start = torch.from_numpy(_softmax_rows(before, h, c))
    results = []
    for kernel in (fold_softmax_numba, fold_softmax_torch):
        state = start.clone()
        cancelled = kernel(state, new_msg, new_dst, old_msg, old_dst, h, c, 1e-6).numpy()
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
    for kernel in (attend_with_self_loop_numba, attend_with_self_loop_torch):
        got = kernel(state[:, :h], state[:, h:2 * h], state[:, 2 * h:].view(-1, h, c),
                     own[:, :h].contiguous(), own[:, h:].reshape(-1, h, c))
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-12)
