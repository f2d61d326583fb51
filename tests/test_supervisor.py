"""`serve --workers N`'s supervisor where it cannot start the MPI job, and where it cannot
see the job's ranks (on other hosts)."""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import sys
import threading

import pytest
from rich.console import Console

from streamgnn.errors import UserError
from streamgnn.workers.supervisor import _first, _relay, supervise


def test_without_mpiexec_the_supervisor_names_the_extra_to_install(tmp_path, monkeypatch):
    # no mpiexec beside the interpreter (where the mpich wheel puts it) nor on PATH
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as raised:
        supervise(2, 0, tmp_path / "ranks", Console())
    assert "--workers needs mpiexec" in raised.value.message
    assert raised.value.hint == "pip install 'streamgnn[mpi]'"
    assert not (tmp_path / "ranks").exists()  # nothing started


def test_the_supervisor_watches_only_ranks_on_its_host(tmp_path):
    """A pid file of another host's rank (a shared state directory) names a pid that is not
    that rank here: not watched, though its process here stops first; an empty pid file
    (being written) is read again later; the rank on this host that stops is named, as the
    first of those on this host."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    other, mine = (subprocess.Popen(["sleep", seconds]) for seconds in ("30", "1"))
    (ranks / f"{other.pid}.rank").write_text("1 another-host")
    (ranks / f"{mine.pid}.rank").write_text("")
    other.kill()
    written = threading.Timer(0.3, (ranks / f"{mine.pid}.rank").write_text,
                              [f"2 {socket.gethostname()}"])
    written.start()
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"],
                           stdout=subprocess.PIPE)
    try:
        died, seen = _relay(job, ranks)
    finally:
        written.join()
        for process in (other, mine, job):
            process.kill()
            process.wait()
    assert (died, seen) == (f"rank 2 (pid {mine.pid})", 1)
    assert _first(died, seen, 3, ranks) == (f"rank 2 (pid {mine.pid}) stopped first of the "
                                            "ranks on this host (1 of 3; the others run "
                                            "elsewhere, their pid files not seen here)")
    assert _first(died, 3, 3, ranks) == f"rank 2 (pid {mine.pid}) stopped first"


def test_without_a_rank_seen_to_stop_the_supervisor_says_why_it_cannot_name_one(
        tmp_path, monkeypatch):
    """A job that fails with no rank on this host seen to stop (they ran elsewhere)."""
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text("#!/bin/sh\nexit 1\n")
    mpiexec.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = io.StringIO()
    try:
        assert supervise(2, 0, tmp_path / "ranks", Console(file=out, width=200)) == 1
    finally:  # supervise forwards them to the job
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert (f"exited with code 1; which rank stopped first is not known here (only ranks "
            f"on this host are watched, by their pid files in {tmp_path / 'ranks'})"
            in out.getvalue())
