"""`BoundedHttp`: uvicorn's httptools protocol with each request's head (request line and
headers) bounded in size (`MAX_HEAD_BYTES`, else 431) and in time (`HEAD_TIMEOUT_S`,
else 408), the connection closed either way, before any of the head reaches the app
(authentication included). httptools alone buffers a head of any size, for good.

A refusal closes the way HTTP servers must for the client to read it: the answer, then
our half of the connection (FIN), then what the client still sends is read and dropped
(up to `LINGER_BYTES`, for up to `LINGER_S`) before the socket closes. Closing with
unread bytes makes the kernel send a reset, and a reset can discard the answer before
the client reads it.

Must not import kafka or mpi4py.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES = 16 << 10
HEAD_TIMEOUT_S = 10.0
LINGER_BYTES = 1 << 20
LINGER_S = 2.0
_END = b"\r\n\r\n"


class BoundedHttp(HttpToolsProtocol):
    """A head counts from its first byte to the blank line ending it, line ends included,
    and is refused before the parser sees the byte past `MAX_HEAD_BYTES`. Exact for a
    head that begins a read from the socket (every request but a pipelined one, which may
    run one read past the bound). A connection's first head must end within
    `HEAD_TIMEOUT_S` of the connection opening, a later one within `HEAD_TIMEOUT_S` of the
    end of the first read holding a part of it (a head that one read holds whole sets no
    timer; between requests, uvicorn's keep-alive timeout applies)."""

    _head: int | None  # bytes of the head so far; None from its end to its message's end
    _tail: bytes  # the head's last 3 bytes so far: an end split across two reads
    _deadline: asyncio.TimerHandle | None  # the head's timeout, then the linger's
    _linger: int | None  # bytes still to drop after a refusal; None before one

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head, self._tail, self._linger = 0, b"", None
        self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            self._linger -= len(data)
            if self._linger < 0:
                self.transport.close()
            return
        if self._head is not None:
            seen = self._tail + data
            end = seen.find(_END)
            head = self._head + (len(data) if end < 0 else end + len(_END) - len(self._tail))
            if head > MAX_HEAD_BYTES:
                self._refuse(431, f"the request line and headers take more than "
                             f"{MAX_HEAD_BYTES:,} bytes")
                return
            self._head, self._tail = head, seen[-3:]
        super().data_received(data)
        if self._head and self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._late)

    def on_headers_complete(self) -> None:
        self._head = None
        self._stop_deadline()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head, self._tail = 0, b""

    def _late(self) -> None:
        self._deadline = None
        self._refuse(408, f"the request line and headers did not arrive within "
                     f"{HEAD_TIMEOUT_S:g} s")

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` with the app's error body, and close (lingering)."""
        if self.transport.is_closing() or self._linger is not None:
            return
        error = HTTPStatus(status).phrase.lower().replace(" ", "_")
        body = orjson.dumps({"error": error, "reason": reason})
        head = [STATUS_LINE[status], *(b"%s: %s\r\n" % pair
                                      for pair in self.server_state.default_headers),
                b"content-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % len(body)]
        self.transport.write(b"".join(head) + body)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._stop_deadline()
        self._linger = LINGER_BYTES
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)
