"""The id map (`IdMap`): a table of any size whose cells hold a slot and a tag of the key's
hash must answer as a dict does through inserts, deletes, rehashes and slots growing
wider than the cells' tags left room for; and a thread may look ids up while another
changes other ids."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamgnn.graph.idmap import IdMap


@given(seed=st.integers(0, 10_000), rounds=st.integers(1, 30))
def test_the_id_map_answers_as_a_dict_does(seed, rounds):
    rng = np.random.default_rng(seed)
    ids = IdMap(16)
    mapped: dict[int, int] = {}
    next_slot = 0
    for _ in range(rounds):
        if mapped and rng.random() < 0.3:  # delete some
            gone = rng.choice(list(mapped), size=rng.integers(1, len(mapped) + 1),
                              replace=False)
            ids.delete(gone)
            for key in gone.tolist():
                del mapped[key]
        else:  # insert new keys at new slots, the slots growing past a power of two
            keys = np.unique(np.concatenate([rng.integers(-2**62, 2**62, rng.integers(
                1, 200)), rng.integers(0, 1000, 20)]))  # small ids too
            keys = rng.permutation(keys[~np.isin(keys, np.array(list(mapped), np.int64))])
            if next_slot + len(keys) > len(ids.ext):
                ids.grow_slots(next_slot + len(keys))
            slots = np.arange(next_slot, next_slot + len(keys), dtype=np.int32)
            ids.insert(keys, slots)
            mapped.update(zip(keys.tolist(), slots.tolist()))
            next_slot += len(keys)
        assert len(ids) == len(mapped)
        keys = np.array(list(mapped), np.int64)
        assert ids.get(keys).tolist() == [mapped[k] for k in keys.tolist()]
        absent = np.setdiff1d(rng.integers(-2**62, 2**62, 50), keys)
        assert (ids.get(absent) == -1).all()
        cells = ids.table[0]
        assert np.count_nonzero(cells >= 0) <= 0.7 * len(cells)


def test_a_thread_looks_ids_up_while_another_changes_other_ids():
    """`IdMap`'s promise: each method changes the map in one step as other threads see it,
    rehashes and slots widening included."""
    ids = IdMap(1000)
    fixed = np.arange(1000, dtype=np.int64) * 7919
    ids.insert(fixed, np.arange(1000, dtype=np.int32))
    wrong: list[np.ndarray] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            got = ids.get(fixed)
            if not np.array_equal(got, np.arange(1000)):
                wrong.append(got)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        slot = 1000
        for step in range(200):
            keys = -1 - np.arange(slot, slot + 500, dtype=np.int64)
            ids.grow_slots(slot + 500)
            ids.insert(keys, np.arange(slot, slot + 500, dtype=np.int32))
            if step % 2:
                ids.delete(keys[:250])
            slot += 500
    finally:
        done.set()
        reader.join()
    assert not wrong
