"""REST over a running service (docs/architecture.md "A REST read"): the FastAPI app
(`app`), the uvicorn server inside `streamgnn serve --http` (`server`), its HTTP protocol
bounding each request's head (`protocol`) and where it may listen (`bind`). Reads reach
the engine only through the service loop (`streamgnn.router.reads`). Nothing is imported
here, so checking `bind` loads neither the app nor the engine.

Must not import kafka or mpi4py.
"""
