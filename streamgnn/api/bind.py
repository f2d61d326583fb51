"""Where `streamgnn serve --http` may listen: ``HOST:PORT`` or ``off``; beyond loopback
only with a bearer token. Standard library only, so a command checks its options without
loading the app.
"""

from __future__ import annotations

import ipaddress

DEFAULT_BIND = "127.0.0.1:8080"


def parse_bind(bind: str, token: str | None) -> tuple[str, int] | None:
    """``HOST:PORT`` (IPv6 hosts in brackets) as (host, port), or None for ``off``.
    Raises ValueError saying what is wrong, including a host beyond loopback without a
    ``token``."""
    if bind.strip().lower() == "off":
        return None
    host, sep, port = bind.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http {bind!r}: expected HOST:PORT (e.g. {DEFAULT_BIND}) or off")
    if not token and not _loopback(host):
        raise ValueError(f"--http {bind}: listening beyond loopback needs a bearer token "
                         "(--http-token or STREAMGNN_HTTP_TOKEN); clients then send "
                         "'Authorization: Bearer <token>'")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False
