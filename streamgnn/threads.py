"""How many threads torch runs a process's dense work on, and how its idle threads wait.

A process that shares its cores (the one-process service, with its Kafka client and REST
threads; an MPI job's rank 0) runs torch on one thread: a batch's hundreds of small
operations each wait for every thread. A worker rank of an MPI job runs on the cores its
host gives each worker there, and in an MPI job idle OpenMP threads sleep instead of
spinning (``OMP_WAIT_POLICY=PASSIVE``), so a worker's threads leave the cores to rank 0
while it waits. The user's ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` win.

Imports torch only after the wait policy is set (OpenMP reads it when torch loads it);
must not import kafka.
"""

from __future__ import annotations

import os

JOB_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",  # idle MPI ranks yield their core
           "OMP_WAIT_POLICY": "PASSIVE"}


def set_torch_threads(threads: int | None, comm=None) -> int:
    """`serve --torch-threads`: ``threads`` (0 keeps torch's own), else OMP_NUM_THREADS if
    set, else 1, or on a worker rank of the MPI job ``comm`` (every rank must call this:
    it counts the workers on each host) this host's cores over its workers. Returns the
    threads set (0: torch's own)."""
    share = None
    if comm is not None:
        os.environ.setdefault("OMP_WAIT_POLICY", JOB_ENV["OMP_WAIT_POLICY"])
        share = _cores_per_worker(comm)
    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or share or 1
    if threads:
        import torch

        torch.set_num_threads(threads)
    return threads


def _cores_per_worker(comm) -> int | None:
    """On a worker rank (rank > 0): the cores this process may run on over the worker
    ranks on its host, at least 1; None on rank 0."""
    from mpi4py import MPI

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        workers_here = host.allreduce(1 if comm.Get_rank() else 0)
    finally:
        host.Free()
    if not comm.Get_rank():
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, cores // workers_here)
