"""LinkBench-style trace generation (and, later, rate-controlled replay, reports and
plots). Must not import kafka or mpi4py."""

from streamgnn.replay.linkbench import WRITE_MIX, LinkBenchWorkload

__all__ = ["WRITE_MIX", "LinkBenchWorkload"]
