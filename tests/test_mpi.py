"""The engine with its shards on MPI ranks (mpiexec from the mpich wheel): rank 0 holds the
whole graph and routes, each other rank runs one shard, ghost rows go over Alltoallv. The
answers must equal PyG's forward pass and, bit for bit, the same partitions in one
process; a failing worker must stop the whole job, never hang it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
    "mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec (pip install mpich) missing")


def mpiexec(ranks: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("workers", [2, 3])
def test_mpi_workers_match_pyg_and_one_process_bit_for_bit(tmp_path, workers):
    out = tmp_path / "result.json"
    run = mpiexec(workers + 1, "-m", "tests.mpi_program", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    for name, r in json.loads(out.read_text()).items():
        assert r["partitions"] == workers, name
        assert r["pyg"] < 1e-9, name
        assert r["alone"] == 0.0 and r["restored"] == 0.0, name
        assert r["rejected"] == 5, name
        assert all(s["halo"] > 0 and s["sent_bytes"] for s in r["stats"]), name


def test_a_failing_worker_stops_the_job_and_names_its_rank(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import numpy as np, torch\n"
        "from mpi4py import MPI\n"
        "import streamgnn as sg\n"
        "from streamgnn.workers import Engine\n"
        "from streamgnn.workers import shard as shard_module\n"
        "from streamgnn.workers.mpi import spmd\n"
        "from tests.archs import ARCHS, F_IN\n"
        "from tests.conftest import random_graph\n"
        "if MPI.COMM_WORLD.Get_rank() == 2:\n"
        "    def boom(self, hop):\n"
        "        raise RuntimeError('injected failure')\n"
        "    shard_module.Shard.superstep = boom\n"
        "data = random_graph(np.random.default_rng(0), n=100, m=400, d=F_IN)\n"
        "model = ARCHS['pyg-sage-mean'](2).eval()\n"
        "def main(workers):\n"
        "    engine = Engine.from_pyg(model, data, partitions=2, workers=workers)\n"
        "    engine.apply([sg.UpdateFeatures(id=int(data.ids[0]), x=[1.0] * F_IN)])\n"
        "spmd(model, main)\n")
    run = mpiexec(3, str(script), timeout=120)
    assert run.returncode != 0
    assert "worker rank 2 failed" in run.stderr and "injected failure" in run.stderr
