"""Row loops on several cores (`streamgnn.cores`): the threaded build really runs on
several threads, each call picks serial or threaded by its work, and a forked child runs
serially. (The kernels' own tests hold each threaded loop to the serial bits.)"""

from __future__ import annotations

import os

import numba
import numpy as np
import pytest
import torch
from numba import prange

from streamgnn import cores


@cores.row_loop
def _thread_ids(out, chunks):
    n = len(out)
    for chunk in prange(chunks):
        for i in range(chunk * n // chunks, (chunk + 1) * n // chunks):
            out[i] = numba.get_thread_id()


@pytest.fixture
def two_threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_a_large_loop_runs_on_torchs_threads_and_a_small_one_on_the_caller(two_threads):
    if _thread_ids.parallel is None:
        pytest.skip("no threading layer loads here")
    out = np.full(8, -1, np.int64)
    _thread_ids(cores.MIN_WORK, out)
    assert sorted(set(out.tolist())) == [0, 1]  # chunk i on thread i: each its half
    _thread_ids(cores.MIN_WORK - 1, out)
    assert set(out.tolist()) == {0}


def test_a_forked_child_runs_every_loop_serially(two_threads):
    assert cores.threads_for(cores.MIN_WORK) == 2
    if _thread_ids.parallel is None:
        pytest.skip("no threading layer loads here")
    _thread_ids(cores.MIN_WORK, np.zeros(2, np.int64))  # threads started here
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers and leaves at once
        os.write(write, bytes([cores.threads_for(cores.MIN_WORK)]))
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == bytes([1])
    os.close(read)


def test_the_work_of_blocks_in_a_long_edge_list_is_the_blocks_own():
    """A pull reads its in-edges where the adjacency stores them: a few blocks of a long
    list, which must not count as a large loop."""
    begin, end = np.array([5, 900, 40]), np.array([8, 900, 44])
    assert cores.block_work(begin, end, 128) == (3 + 0 + 4) * 128
    assert cores.threads_for(cores.block_work(begin, end, 128)) == 1
