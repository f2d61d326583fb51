"""Fault injection over HTTP: requests that try the REST server's limits, sent on raw
sockets to a real uvicorn server (in a child process, so that its memory is its own: a
head that is read whole shows there), and ids written loosely, sent to a served tiny
engine. Each must be refused with its status and reason, before authentication for the
head limit, and never answered as if it were a good request."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamgnn.api.protocol import HEAD_TIMEOUT_S, LINGER_BYTES, MAX_HEAD_BYTES
from streamgnn.api.server import MAX_CONNECTIONS
from streamgnn.stream.schemas import DecodeError, decode_query, decode_update
from tests.test_api import Running

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import sys
from streamgnn.api.server import HttpServer
from streamgnn.router.reads import Reads
server = HttpServer(Reads(), "127.0.0.1", 0, token="s3cret").start()
print(server.port, flush=True)
sys.stdin.read()  # until the test closes stdin
"""


class Child:
    """The REST server (no service loop behind it, a bearer token set) in a child
    process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.port = int(self.process.stdout.readline())

    def peak_rss(self) -> int:
        """The child's peak resident memory, bytes."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) << 10

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def ask(self, head: bytes) -> bytes:
        """Everything the server writes back to ``head`` before it closes the connection
        (the request says ``connection: close``)."""
        with self.connect() as s:
            s.sendall(head)
            return _until_closed(s)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


def _until_closed(s: socket.socket) -> bytes:
    got = b""
    while chunk := s.recv(1 << 16):
        got += chunk
    return got


def _head(path: str, size: int, extra: bytes = b"") -> bytes:
    """A request for ``path`` whose head (request line to the blank line) is ``size``
    bytes, padded with an ``x-pad`` header."""
    start = f"GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n".encode() + extra
    pad = size - len(start) - len(b"x-pad: \r\n\r\n")
    return start + b"x-pad: " + b"a" * pad + b"\r\n\r\n"


@pytest.fixture(scope="module")
def child() -> Iterator[Child]:
    server = Child()
    yield server
    server.close()


def test_a_head_at_the_limit_is_served_one_byte_more_gets_431(child):
    assert child.ask(_head("/healthz", MAX_HEAD_BYTES)).startswith(b"HTTP/1.1 200 ")
    refused = child.ask(_head("/healthz", MAX_HEAD_BYTES + 1))
    assert refused.startswith(b"HTTP/1.1 431 ")
    assert b'"error":"request_header_fields_too_large"' in refused
    assert f"{MAX_HEAD_BYTES:,} bytes".encode() in refused


def test_a_refusal_ends_in_a_clean_close_while_the_client_still_sends(child):
    """Bytes the client sends after the answer are read and dropped, so that the client
    reads the answer and then the end of the connection, never a reset."""
    for _ in range(3):
        with child.connect() as s:
            s.sendall(_head("/healthz", MAX_HEAD_BYTES + 1) + b"x" * (LINGER_BYTES // 2))
            time.sleep(0.2)
            assert _until_closed(s).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("head", [
    _head("/v1/status", 2 * MAX_HEAD_BYTES),  # one long header
    _head("/v1/status", 0, b"".join(b"x-%d: 1\r\n" % i for i in range(4000))),  # many
    b"GET /v1/status?" + b"q" * MAX_HEAD_BYTES + b" HTTP/1.1\r\nhost: t\r\n\r\n",  # a long URL
], ids=["long-header", "many-headers", "long-url"])
def test_an_oversized_head_gets_431_before_authentication(child, head):
    """Without the token /v1/status answers 401: a 431 shows the limit came first."""
    assert child.ask(head).startswith(b"HTTP/1.1 431 ")


def test_a_64_mb_header_is_refused_without_being_read_whole(child):
    before = child.peak_rss()
    with child.connect() as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\nx-big: ")
        sent, chunk, answer = 0, b"a" * (1 << 20), b""
        try:
            while sent < 64 << 20:
                s.sendall(chunk)
                sent += len(chunk)
            s.sendall(b"\r\n\r\n")
            answer = _until_closed(s)
        except OSError:  # reset or broken pipe: the server closed
            pass
    assert not answer.startswith(b"HTTP/1.1 200 "), "the 64 MB head was read and answered"
    assert sent < 16 << 20, f"the server took {sent >> 20} MB of one header"
    assert child.peak_rss() - before < 16 << 20
    assert child.ask(_head("/healthz", 100)).startswith(b"HTTP/1.1 200 ")  # still serves


def test_a_head_that_does_not_end_in_time_gets_408(child):
    """An idle connection, a head trickled a byte a second, and the same as a second
    request on a keep-alive connection: each answered 408 and closed after the head
    timeout, counted from the connection opening or the second head's first byte."""
    start = time.monotonic()
    idle, slow, later = child.connect(), child.connect(), child.connect()
    later.sendall(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
    first = b""
    while not first.endswith(b'{"status":"ok"}'):
        first += later.recv(1 << 16)
    assert first.startswith(b"HTTP/1.1 200 ")
    waiting, closed = [idle, slow, later], {}
    for s in (slow, later):
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: t\r\n")
    while waiting and time.monotonic() - start < HEAD_TIMEOUT_S + 5:
        answered, _, _ = select.select(waiting, [], [], 1.0)
        for s in answered:
            closed[s] = time.monotonic() - start, _until_closed(s)
            waiting.remove(s)
        for s in {slow, later} & set(waiting):
            s.sendall(b"x")
    for s in (idle, slow, later):
        s.close()
    assert not waiting, f"{len(waiting)} of 3 connections still open"
    for after, answer in closed.values():
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert HEAD_TIMEOUT_S - 0.01 <= after < HEAD_TIMEOUT_S + 2


def test_a_request_while_max_connections_are_open_gets_503(child):
    idle = [child.connect() for _ in range(MAX_CONNECTIONS - 1)]
    try:
        deadline = time.monotonic() + 5  # until the server has taken them all
        while not (answer := child.ask(_head("/healthz", 100))).startswith(b"HTTP/1.1 503 "):
            assert answer.startswith(b"HTTP/1.1 200 ") and time.monotonic() < deadline
        idle.pop().close()
        while not (answer := child.ask(_head("/healthz", 100))).startswith(b"HTTP/1.1 200 "):
            assert answer.startswith(b"HTTP/1.1 503 ") and time.monotonic() < deadline
    finally:
        for s in idle:
            s.close()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    with Running() as r:
        yield r


def _loose(v: int) -> list[str]:
    return [f"{v}.0", f"+{v}", f"%20{v}", f"{v}%20", f"0{v}", f"{v}e0", "true", f"%2B{v}"]


def test_a_loosely_written_path_id_gets_422_naming_it(running):
    v = int(running.snapshot.ids[0])
    for suffix in ("", "/neighbors"):
        assert running.http.get(f"/v1/vertices/{v}{suffix}").status_code == 200
        for written in _loose(v):
            got = running.http.get(f"/v1/vertices/{written}{suffix}")
            assert got.status_code == 422, (written, got.text)
            shown = written.replace("%20", " ").replace("%2B", "+")
            assert got.json()["error"] == "invalid_request"
            assert f"(got {json.dumps(shown)})" in got.json()["reason"], got.json()["reason"]
        got = running.http.get(f"/v1/vertices/{'9' * 5000}{suffix}")  # past int()'s limit
        assert got.status_code == 422 and "within int64" in got.json()["reason"]


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1], {"id": 1}, 2**63],
                         ids=repr)
def test_a_body_id_that_is_not_an_integer_gets_422_naming_it(running, value):
    v = int(running.snapshot.ids[0])
    f = running.snapshot.num_features
    bodies = {
        "/v1/vertices/lookup": [{"ids": [v, value]}],
        "/v1/queries": [{"vertices": [{"id": value, "x": [0.0] * f}]},
                        {"vertices": [{"id": -1, "x": [0.0] * f}],
                         "edges": [{"src": -1, "dst": value}]},
                        {"vertices": [{"id": -1, "x": [0.0] * f}],
                         "edges": [{"src": value, "dst": -1}]}]}
    for path, sent in bodies.items():
        for body in sent:
            got = running.http.post(path, json=body)
            assert got.status_code == 422, (body, got.text)
            assert got.json()["error"] == "invalid_request"
            if not isinstance(value, list | dict):
                assert f"(got {json.dumps(value)})" in got.json()["reason"], got.json()["reason"]


@pytest.mark.parametrize("written", ["true", "1.0", '"1"', "1e0", "null"])
def test_the_kafka_messages_refuse_the_same_ids(written):
    query = f'{{"vertices": [{{"id": {written}, "x": [0.0]}}]}}'
    edge = f'{{"vertices": [{{"id": -1, "x": [0.0]}}], "edges": [{{"src": -1, "dst": {written}}}]}}'
    for decode, raw in ((decode_query, query), (decode_query, edge),
                        (decode_update, f'{{"op": "delete_vertex", "id": {written}}}')):
        with pytest.raises(DecodeError) as e:
            decode(raw.encode())
        assert e.value.error == "invalid_fields"
