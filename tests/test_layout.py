"""The package's layout: no module over 800 lines, and the parts of a shard import only
what their docstrings allow (read from their module-level import lines with `ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import streamgnn

PACKAGE = Path(streamgnn.__file__).parent
PARTS = ("batch", "tables", "pulls", "messages", "fold", "superstep", "ghost_rows", "shard")
# part -> the other parts it must not import (none imports the shard, which holds them)
FORBIDDEN = {
    "batch": {"tables", "pulls", "messages", "fold", "superstep", "ghost_rows"},
    "tables": {"pulls", "messages", "fold", "superstep", "ghost_rows"},
    "pulls": {"messages", "fold", "superstep", "ghost_rows"},
    "messages": {"pulls", "fold", "superstep", "ghost_rows"},
    "fold": {"pulls", "superstep", "ghost_rows"},
    "superstep": {"ghost_rows"},
    "ghost_rows": {"pulls", "messages", "fold", "superstep"},
    "shard": set(),
}


def imported(path: Path) -> set[str]:
    """The modules ``path`` imports at run time: its module-level import statements
    (those in a block, ``if TYPE_CHECKING`` above all, left out)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_no_module_of_the_package_is_over_800_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 800}
    assert long == {}


@pytest.mark.parametrize("part", PARTS)
def test_each_part_of_a_shard_imports_only_what_it_may(part):
    names = imported(PACKAGE / "workers" / f"{part}.py")
    heavy = {n for n in names if n.split(".")[0] in ("kafka", "mpi4py")}
    parts = {n.split(".")[2] for n in names if n.startswith("streamgnn.workers.")
             and len(n.split(".")) > 2} & {*PARTS}
    assert heavy == set()
    assert parts & (FORBIDDEN[part] | {"shard"}) == set()
    if part == "batch":  # its records name tensors in annotations alone
        assert not {n for n in names if n.split(".")[0] == "torch"}
