"""`serve --workers N`'s supervisor where it cannot start the MPI job."""

from __future__ import annotations

import sys

import pytest
from rich.console import Console

from streamgnn.errors import UserError
from streamgnn.workers.supervisor import supervise


def test_without_mpiexec_the_supervisor_names_the_extra_to_install(tmp_path, monkeypatch):
    # no mpiexec beside the interpreter (where the mpich wheel puts it) nor on PATH
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as raised:
        supervise(2, 0, tmp_path / "ranks", Console())
    assert "--workers needs mpiexec" in raised.value.message
    assert raised.value.hint == "pip install 'streamgnn[mpi]'"
    assert not (tmp_path / "ranks").exists()  # nothing started
