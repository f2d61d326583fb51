"""The reference pages name what the code has: every `streamgnn` command has a section in
docs/reference/cli.md that lists each of its options, arguments and environment
variables, and docs/reference/configuration.md lists every environment variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.main import get_command

from streamgnn.cli import app

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"
_HEADING = re.compile(r"^#+ `streamgnn ?([a-z -]*)`\s*$", re.MULTILINE)


def _commands(command, path: tuple[str, ...] = ()):
    """(path, command) of ``command`` and every command under it that takes options or
    arguments (the root's are the global options), or has no subcommand."""
    subcommands = getattr(command, "commands", None)
    if command.params or not subcommands:
        yield path, command
    for name, sub in sorted((subcommands or {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(get_command(app)))


def _sections(text: str) -> dict[str, str]:
    """Each ``## `streamgnn PATH` `` section of ``text`` by PATH, up to the next one."""
    marks = list(_HEADING.finditer(text))
    return {m.group(1).strip(): text[m.end():nxt.start() if nxt else len(text)]
            for m, nxt in zip(marks, [*marks[1:], None], strict=True)}


def _names(command) -> list[str]:
    """What a page must show of ``command``: its options (every spelling), its
    arguments (upper case, as in a usage line) and its environment variables."""
    names = []
    for param in command.params:
        if param.param_type_name == "argument":
            names.append(param.name.upper())
        else:
            names += [*param.opts, *param.secondary_opts]
        envvar = getattr(param, "envvar", None)
        names += [envvar] if isinstance(envvar, str) else list(envvar or ())
    return names


@pytest.mark.parametrize("path", sorted(" ".join(p) for p in COMMANDS))
def test_cli_reference_covers_the_command(path: str) -> None:
    sections = _sections((DOCS / "cli.md").read_text())
    assert path in sections, f"docs/reference/cli.md has no section `streamgnn {path}`"
    section = sections[path]
    missing = [name for name in _names(COMMANDS[tuple(path.split())])
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", section)]
    assert not missing, f"`streamgnn {path}` in docs/reference/cli.md lacks {missing}"


def test_cli_reference_names_no_command_that_does_not_exist() -> None:
    documented = set(_sections((DOCS / "cli.md").read_text()))
    assert documented <= {" ".join(p) for p in COMMANDS}


def test_configuration_lists_every_environment_variable() -> None:
    text = (DOCS / "configuration.md").read_text()
    envvars = {name for command in COMMANDS.values() for name in _names(command)
               if name.startswith("STREAMGNN_")}
    assert envvars, "the CLI declares no environment variable"
    missing = sorted(name for name in envvars if f"`{name}`" not in text)
    assert not missing, f"docs/reference/configuration.md lacks {missing}"
