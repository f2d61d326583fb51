"""LinkBench-style traces: the write-batch generator (`linkbench`), trace files
(`trace`), their generation (`generate`), the open-loop replay (`openloop`, `runner`), its
measurements (`recorder`, `matching`, `rest`), reports (`report`), and the `streamgnn
replay` commands (`commands`).

`streamgnn replay run` must start without torch: `trace`, `openloop`, `runner`,
`recorder`, `matching`, `rest` and `report` import neither torch nor the graph store,
and importing this package imports none of its modules (the names below load on use).
None imports mpi4py; kafka comes only through `streamgnn.stream` (`loadgen`, `kafka_config`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["WRITE_MIX", "LinkBenchWorkload"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from streamgnn.replay import linkbench

        return getattr(linkbench, name)
    raise AttributeError(f"module 'streamgnn.replay' has no attribute {name!r}")
