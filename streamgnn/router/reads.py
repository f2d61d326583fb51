"""`Reads`: how other threads (the REST API) read a running service's state. Each read
sees the state after one batch and before the next, never a half-applied one, and can
name that batch.

Vertex rows and neighbors come from the service's `ReadView` while the engine's shards
run in this process: read on the caller's thread, at once, while the loop applies the next
batch. Every other read (and those when the shards live on MPI ranks) is queued and run by
the service loop itself between two batches, where only the loop's thread touches the
engine. Between two batches the loop runs queued reads for at most about as long as its
last batch took (at least one): reads cannot stall ingest by more than a batch, and
ingest cannot starve reads.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from streamgnn.errors import StreamGNNError
from streamgnn.router.view import ReadView

if TYPE_CHECKING:
    from streamgnn.router.service import Service

T = TypeVar("T")


class NotServing(StreamGNNError, RuntimeError):
    """No service loop is running to answer reads (the engine is still being bootstrapped
    or restored, or the service is restarting or has stopped)."""


class Reads:
    """The queue between threads that read and the service loop that answers, and the
    serving loop's `ReadView` (None while no loop serves, or where the engine's rows live
    on MPI ranks)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[Service], Any], Future]] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._serving: Service | None = None
        self.service: Service | None = None  # the last service that served (or serves)
        self.view: ReadView | None = None

    @property
    def ready(self) -> bool:
        return self._serving is not None

    @property
    def waiting(self) -> bool:
        """Whether reads are queued."""
        return not self._queue.empty()

    def submit(self, read: Callable[[Service], T]) -> Future[T]:
        """Queue ``read``; the future holds what it returns (or raises) once the loop ran
        it. Raises `NotServing` when no loop is running."""
        future: Future[T] = Future()
        with self._lock:
            if self._serving is None:
                raise NotServing("the service is not serving yet (bootstrapping, restoring "
                                 "or restarting): retry shortly")
            self._queue.put((read, future))
        return future

    def open(self, service: Service) -> None:
        """``service``'s loop answers reads from now on (call it on the loop's thread,
        between two batches): vertex rows from a view of its engine, built here, where
        the engine's shards run in this process."""
        view = (ReadView(service.engine, service.batch_seq)
                if service.engine.shards is not None else None)
        with self._lock:
            self._serving = self.service = service
            self.view = view

    def close(self) -> None:
        """The loop stops answering: reads still queued fail with `NotServing`, and the
        view is dropped."""
        with self._lock:
            self._serving = None
            self.view = None
        while True:
            try:
                _, future = self._queue.get_nowait()
            except queue.Empty:
                return
            future.set_exception(NotServing("the service stopped before answering"))

    def serve(self, budget_s: float) -> None:
        """Run queued reads (on the loop's thread, between two batches) until none is left
        or ``budget_s`` has passed; at least one if any is queued."""
        deadline = time.perf_counter() + budget_s
        while True:
            try:
                read, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(read(self._serving))
                except Exception as e:  # the reader's to handle, never the loop's
                    future.set_exception(e)
            if time.perf_counter() >= deadline:
                return
