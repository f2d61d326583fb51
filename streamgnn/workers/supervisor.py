"""`streamgnn serve --workers N` as an MPI job: the supervisor that starts ``mpiexec -n
N+1`` with the same command and restarts the job from its last checkpoint when it fails
(`supervise`), and the job's side: which rank this process is (`mpi_world`), a worker
rank's serving (`serve_worker`) and rank 0's (`serve_rank`), whose failure stops every
rank and tells the supervisor why. mpi4py is imported here and in `mpi` only."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from streamgnn.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from streamgnn.settings import ServeSettings
    from streamgnn.workers.mpi import MpiWorkers

MPI_JOB = "STREAMGNN_MPI_JOB"  # set for the ranks of a job the supervisor started
_NO_RETRY = 3  # the job's exit code for a configuration error: restarting cannot help


def in_mpi_job() -> bool:
    """Whether this process is a rank of an MPI job (the supervisor's, or mpiexec's)."""
    return os.environ.get(MPI_JOB) == "1" or "PMI_SIZE" in os.environ


def rank_files(state_dir: Path) -> Path:
    """Where the ranks of a job serving ``state_dir`` note their pids (``<pid>.rank``,
    holding the rank and its host's name); each rank in its own ``state_dir``, so the
    supervisor sees only the ranks on its host (or sharing its state directory)."""
    return state_dir / "ranks"


def supervise(workers: int, max_restarts: int, ranks: Path, console: Console) -> int:
    """Run this command as an MPI job of ``workers`` + 1 ranks; restart it (from its last
    checkpoint) when it fails, with backoff; forward SIGINT/SIGTERM to it. ``ranks``: the
    job's `rank_files`, to name a rank that dies. Returns the job's exit code."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec")
    if mpiexec is None:
        raise UserError("--workers needs mpiexec, which is not installed",
                        "pip install 'streamgnn[mpi]'")
    command = [mpiexec, "-n", str(workers + 1), sys.executable, "-m", "streamgnn.cli",
               *sys.argv[1:]]
    env = {**os.environ, MPI_JOB: "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    stopping: list[int] = []
    job: list[subprocess.Popen] = []

    def forward(signum, _frame) -> None:
        stopping.append(signum)
        if job:
            job[-1].send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    delay = 1.0
    for attempt in range(max_restarts + 1):
        shutil.rmtree(ranks, ignore_errors=True)
        job.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT))
        died, seen = _relay(job[-1], ranks)
        code = job[-1].wait()
        if code == 0 or stopping:
            return code
        if code == _NO_RETRY:
            reasons = "; ".join(f.read_text() for f in ranks.glob("*.error")) or "above"
            console.print(f"[red]the MPI job stopped on a configuration error ({reasons}); "
                          "not restarting[/red]", highlight=False, soft_wrap=True)
            return code
        console.print(f"[yellow]the MPI job exited with code {code}; "
                      f"{_first(died, seen, workers + 1, ranks)}[/yellow]",
                      highlight=False, soft_wrap=True)
        if attempt == max_restarts:
            break
        console.print(f"[yellow]restart {attempt + 1} of {max_restarts} from the last "
                      f"checkpoint in {delay:g} s[/yellow]")
        time.sleep(delay)
        delay *= 2
    console.print(f"[red]the MPI job failed {max_restarts + 1} times; giving up[/red]")
    return code


def _first(died: str | None, seen: int, ranks: int, files: Path) -> str:
    """Which rank stopped first, as far as ``seen`` of the job's ``ranks`` tell (those on
    this host, by their pid files in ``files``)."""
    if died is None:
        return (f"which rank stopped first is not known here (only ranks on this host are "
                f"watched, by their pid files in {files})")
    if seen < ranks:
        return (f"{died} stopped first of the ranks on this host ({seen} of {ranks}; the "
                "others run elsewhere, their pid files not seen here)")
    return f"{died} stopped first"


def _relay(job: subprocess.Popen, ranks: Path) -> tuple[str | None, int]:
    """Pass the job's output through as it comes, watching its ranks on this host (their
    pid files in ``ranks``); returns the first rank seen to exit, as "rank R (pid P)", if
    any did, and how many ranks were watched."""
    out = job.stdout.fileno()
    watched: dict[int, tuple[str, int]] = {}  # pidfd -> (rank, pid)
    seen: set[int] = set()  # the pids of every rank watched
    first = None
    host = socket.gethostname()
    while True:
        for f in ranks.glob("*.rank"):
            pid = int(f.stem)
            if pid in seen:
                continue
            with contextlib.suppress(OSError):  # gone already
                rank, _, on = f.read_text().partition(" ")
                # another host's rank (a shared filesystem) has a pid that is not ours; an
                # empty file is being written: read again next time
                if rank and on == host:
                    watched[os.pidfd_open(pid)] = (rank, pid)
                    seen.add(pid)
        ready, _, _ = select.select([out, *watched], [], [], 0.5)
        for fd in ready:
            if fd in watched:
                rank, pid = watched.pop(fd)
                os.close(fd)
                first = first or f"rank {rank} (pid {pid})"
        if out in ready:
            chunk = os.read(out, 1 << 16)
            if not chunk:
                for fd in watched:
                    os.close(fd)
                return first, len(seen)
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()


def mpi_world():
    """MPI's world communicator when this process is one rank of several, else None."""
    if not in_mpi_job():
        return None
    from streamgnn.extras import needs

    with needs("MPI workers (serve --workers)"):
        from mpi4py import MPI

    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def serve_rank(settings: ServeSettings, serve: Callable[[MpiWorkers | None], None]) -> None:
    """``serve`` the stream in this process (``None``: no workers), or as rank 0 of the
    MPI job it is part of (its `MpiWorkers`); a worker rank of the job serves its
    partition instead. Where rank 0 fails, the whole job stops and the supervisor learns
    why (a configuration error: not worth a restart)."""
    comm = mpi_world()
    if comm is None:
        serve(None)
        return
    ranks = rank_files(settings.state_dir)
    ranks.mkdir(parents=True, exist_ok=True)
    (ranks / f"{os.getpid()}.rank").write_text(f"{comm.Get_rank()} {socket.gethostname()}")
    if comm.Get_rank() > 0:  # a worker: one partition, never kafka
        serve_worker(comm, settings.checkpoint, settings.state_dir, settings.device)
        return
    from streamgnn.workers.mpi import MpiWorkers

    workers = MpiWorkers(comm)
    try:
        serve(workers)
    except BaseException as e:  # never leave the workers waiting
        import traceback

        traceback.print_exc()
        # MPI_Abort may kill the output relay before it forwards the traceback: the
        # supervisor reads the reason from here
        (ranks / f"{os.getpid()}.error").write_text(f"{type(e).__name__}: {e}")
        comm.Abort(_NO_RETRY if isinstance(e, ValueError | UserError) else 1)
        raise
    workers.stop()


def serve_worker(comm, checkpoint: Path, state_dir: Path, device: str) -> None:
    """A worker rank: the model from the service's last checkpoint where this rank sees
    rank 0's files (one filesystem), else from the model file (rank 0 sends the state's
    weights when it reads a checkpoint), then one partition until rank 0 says stop, its
    copies of the checkpoints in its own ``state_dir``. Signals are rank 0's to act on
    (it stops the workers at a batch boundary)."""
    from streamgnn.allocator import keep_freed_memory
    from streamgnn.models.zoo import ModelFile
    from streamgnn.router.checkpoint import Checkpoints
    from streamgnn.router.service import saved_model
    from streamgnn.workers.mpi import run_worker
    from streamgnn.workers.warm_up import warm_up_if_possible

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    keep_freed_memory()  # the shard's batches run here: as rank 0 does in one process
    copies = Checkpoints(state_dir)  # rank 0 decides which generation verifies
    saved = copies.peek("model")
    model = (ModelFile.load(checkpoint) if saved is None else saved_model(saved)).model()
    warm_up_if_possible(model, device, 2)  # (another host has its own cache)
    run_worker(model, comm, device, copies)
