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
