"""`warm_up` compiles every kernel a stream goes on to run: after it, an engine of the same
model on another graph, at one partition and at three, fed every update type at several
batch sizes (and a batch that re-anchors its states, and one refused and undone) with its
row loops serial and threaded, and asked an exact and a selective
query, compiles nothing more."""

from __future__ import annotations

import contextlib
import sys

import numba
import numpy as np
import pytest
import torch

import streamgnn as sg
from streamgnn import cores
from streamgnn.replay import LinkBenchWorkload
from streamgnn.workers import Engine
from streamgnn.workers.warm_up import refused, worn_out
from tests.archs import ARCHS, F_IN, randomise
from tests.test_engine import start_graph


def compiled() -> dict[str, int]:
    """Per numba kernel of streamgnn's loaded modules (a row loop's serial and threaded
    builds apart), how many argument types it is compiled for."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("streamgnn"):
            continue
        for value in list(vars(module).values()):
            builds = ((value.serial, value._parallel) if isinstance(value, cores.RowLoop)
                      else (value,))
            for build in builds:
                if isinstance(build, numba.core.dispatcher.Dispatcher):
                    fn = build.py_func
                    out[f"{fn.__module__}.{fn.__qualname__}"] = len(build.signatures)
    return out


# one per kind of aggregation state: sum, a mean's rescaled z, degree-normalised (in-degrees
# exchanged), max and GIN's MLP, attention
@pytest.mark.parametrize("arch", ["graphconv-add", "graphconv-mean", "pyg-gcn",
                                  "graphconv-max", "pyg-gin", "pyg-gat"])
def test_after_warm_up_a_stream_compiles_nothing(arch):
    model = randomise(ARCHS[arch](2), 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # (the tests run torch on one; the threaded builds then wait)
    try:
        _warm_up_then_stream(model)
    finally:
        torch.set_num_threads(threads)


def _warm_up_then_stream(model: torch.nn.Module) -> None:
    seconds = sg.warm_up(model, partitions=3)
    assert seconds > 0
    before = compiled()
    assert before, "no kernel found: the check would pass whatever warm_up did"
    for partitions in (1, 3):
        data = start_graph(partitions)
        engine = Engine.from_pyg(model, data, partitions=partitions)
        workload = LinkBenchWorkload(sg.DynamicGraph.from_data(data), seed=partitions)
        for threaded in (False, True):
            with cores.threads_whatever_the_size() if threaded else contextlib.nullcontext():
                for size in (1, 6, 25):
                    engine.apply(workload.applied(size))
                worn_out(engine)  # (a stream re-anchors after hundreds of batches)
                engine.apply(workload.applied(25))
                refused(engine, F_IN)  # (a library user's bad batch, undone)
                new = int(engine.vertex_ids().max()) + 1
                for budget in (None, 0.3):
                    engine.query(sg.QueryRequest(
                        vertices=[sg.QueryVertex(id=new, x=np.ones(F_IN).tolist())],
                        edges=[sg.QueryEdge(src=int(engine.vertex_ids()[0]), dst=new)],
                        budget=budget))
    after = compiled()
    assert after == before, {k: (before.get(k, 0), v) for k, v in after.items()
                             if v != before.get(k, 0)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warm-up must fail: no CUDA here")
def test_a_failed_warm_up_says_why_and_lets_the_caller_go_on(capsys):
    """`serve`, its workers and the demo call `warm_up_if_possible`: a warm-up that cannot
    run (here on a CUDA device this machine lacks) is reported on stderr with its reason,
    and the caller gets None instead of an exception."""
    from streamgnn.workers.warm_up import warm_up_if_possible

    model = randomise(ARCHS["graphconv-add"](1), 0)
    assert warm_up_if_possible(model, "cuda") is None
    err = capsys.readouterr().err
    assert "warm-up failed" in err and "compile where first used" in err
