"""`HttpServer`: the REST app served by uvicorn on a thread of the service's process, with
the server's limits: request heads (`BoundedHttp`), connections, keep-alive.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

import socket
import threading
import time

from streamgnn.api.app import create_app
from streamgnn.extras import needs
from streamgnn.router.reads import Reads

with needs("the REST API (serve --http)"):
    import uvicorn

    from streamgnn.api.protocol import BoundedHttp

MAX_CONNECTIONS = 1000
"""A request gets 503 while this many connections are open (its own included) or this
many requests are in progress."""
KEEP_ALIVE_S = 5
"""How long an idle keep-alive connection stays open."""


class HttpServer:
    """Uvicorn serving `create_app` on a daemon thread; the socket listens from the
    constructor on, so a port in use fails there, in the caller's thread."""

    def __init__(self, reads: Reads, host: str, port: int, token: str | None = None) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio turns Nagle off only on sockets that say TCP (with
        # proto 0, each keep-alive response's body waited 40 ms for a delayed ACK)
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
            self._socket.listen(2048)
        except OSError as e:
            self._socket.close()
            raise OSError(f"cannot listen on {host}:{port} for --http: {e.strerror}") from e
        self.host, self.port = host, self._socket.getsockname()[1]
        # uvloop and httptools (bounded: `BoundedHttp`): a request holds the server's
        # thread (and the GIL it shares with the service loop) for less time than with
        # asyncio + h11
        self._server = uvicorn.Server(uvicorn.Config(
            create_app(reads, token), loop="uvloop", http=BoundedHttp, log_level="warning",
            access_log=False, proxy_headers=False, timeout_graceful_shutdown=2,
            limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=KEEP_ALIVE_S))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="streamgnn-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> HttpServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
        self._socket.close()
