"""`RestReader`: a replay's reads against the REST API (docs/architecture.md "A REST read"),
from a small thread pool so a slow answer never holds up the sender.

getnode -> ``GET /v1/vertices/{id}``; getlinklist and countlink ->
``GET /v1/vertices/{id}/neighbors``. Each latency runs from the op's intended send time
to the end of the answer's body; anything but a 200 is an error counted by kind
(``read:http_404``, ``read:connection_refused``, ``read:timeout``, ...), never the end of
the run. At most ``limit`` reads wait or run at once; past that a read is counted as
``read:backlog_full`` instead of queueing without bound. Keep-alive connections, one per
thread (stdlib `http.client`). Owns the read side; must not import torch, kafka or the
graph store.
"""

from __future__ import annotations

import http.client
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from streamgnn.replay.recorder import Recorder
from streamgnn.replay.trace import TraceOp

_PATHS = {"getnode": "/v1/vertices/{}", "getlinklist": "/v1/vertices/{}/neighbors",
          "countlink": "/v1/vertices/{}/neighbors"}


class RestReader:
    def __init__(self, base_url: str, recorder: Recorder, token: str | None = None,
                 workers: int = 8, limit: int = 10_000, timeout_s: float = 10.0) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{base_url!r} is not an http:// or https:// base URL")
        self._connection = http.client.HTTPSConnection if url.scheme == "https" else \
            http.client.HTTPConnection
        self._host, self._port, self._prefix = url.hostname, url.port, url.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.recorder, self.limit, self.timeout_s = recorder, limit, timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="replay-read")
        self._local = threading.local()
        self._in_flight = 0
        self._lock = threading.Lock()

    def read(self, op: TraceOp, intended: float) -> None:
        with self._lock:
            if self._in_flight >= self.limit:
                self.recorder.error("read:backlog_full")
                return
            self._in_flight += 1
        self._pool.submit(self._get, op.op, self._prefix + _PATHS[op.op].format(int(op.body)),
                          intended)

    def _get(self, op: str, path: str, intended: float) -> None:
        try:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connection(self._host, self._port,
                                                           timeout=self.timeout_s)
            try:
                conn.request("GET", path, headers=self._headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                self._local.conn = None
                self.recorder.error(f"read:{_kind(e)}")
                return
            if response.status == 200:
                self.recorder.latency(op, time.time() - intended)
            else:
                self.recorder.error(f"read:http_{response.status}")
        finally:
            with self._lock:
                self._in_flight -= 1

    def outstanding(self) -> int:
        return self._in_flight

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _kind(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(e, TimeoutError):
        return "timeout"
    return type(e).__name__
