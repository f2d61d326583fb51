"""REST over a running service (DESIGN.md "REST"): the FastAPI app (`app`) and the uvicorn
server inside `streamgnn serve --http` (`server`). Reads reach the engine only through the
service loop (`streamgnn.router.reads`). Must not import kafka or mpi4py.
"""

from streamgnn.api.app import create_app
from streamgnn.api.server import DEFAULT_BIND, HttpServer, parse_bind

__all__ = ["DEFAULT_BIND", "HttpServer", "create_app", "parse_bind"]
