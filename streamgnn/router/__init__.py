"""The router: validation and batching of the update stream, updates waiting for their
vertices (`arrivals`), vertex placement over partitions (`placement`), the streaming loop
that feeds the engine and publishes results (`service`), and its checkpoints
(`checkpoint`). Talks to message systems only through `streamgnn.stream.Transport`; must
not import kafka or mpi4py.
"""

from streamgnn.router.arrivals import Arrivals
from streamgnn.router.checkpoint import Checkpoints
from streamgnn.router.placement import Placement
from streamgnn.router.service import BatchReport, Service, ServiceConfig, Stats

__all__ = ["Arrivals", "BatchReport", "Checkpoints", "Placement", "Service", "ServiceConfig",
           "Stats"]
