"""The router: validation and batching of the update stream, updates waiting for their
vertices (`arrivals`), the updates admitted and not applied yet (`pending`), the
streaming loop that feeds the engine (`service`), what it publishes (`outputs`), its
checkpoints (`checkpoint`), the journal of what it did since the last one (`journal`), its
metrics (`metrics`) and the reads other threads ask of it between two batches (`reads`). Talks to
message systems only through `streamgnn.stream.Transport`; must not import kafka or
mpi4py.
"""

from streamgnn.router.arrivals import Arrivals
from streamgnn.router.checkpoint import Checkpoints
from streamgnn.router.metrics import Stats
from streamgnn.router.service import (
    BatchReport,
    EngineFailure,
    Service,
    run_recovering,
)
from streamgnn.settings import ServiceConfig

__all__ = ["Arrivals", "BatchReport", "Checkpoints", "EngineFailure", "Service",
           "ServiceConfig", "Stats", "run_recovering"]
