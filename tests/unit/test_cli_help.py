"""``--help`` of every ``gyre`` command renders, and shows flags as flags.

typer 0.29's rich help printed every boolean flag as ``--json <bool>``, as if it took a value;
the root app uses click's plain formatter instead. This walks the whole command tree so a new
command, or a typer upgrade that brings the rich help back, is caught.
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from gyre.cli import app


def _commands(cmd, path: tuple[str, ...] = ()):
    """(path, command) for the whole tree (typer 0.29 vendors click: duck-typed, not isinstance)."""
    yield path, cmd
    subs = getattr(cmd, "commands", None)
    if subs:
        for name, sub in sorted(subs.items()):
            yield from _commands(sub, (*path, name))


ROOT_CMD = typer.main.get_command(app)
COMMANDS = list(_commands(ROOT_CMD))


def test_tree_is_complete() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    for expected in ("sim", "sim sweep", "tree show", "harness tasks", "config show", "proxy"):
        assert expected in names, names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "gyre")
def test_help_shows_flags_as_flags(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output, r.output
    cmd = dict(COMMANDS)[path]
    for p in cmd.params:
        if getattr(p, "is_flag", False) and not getattr(p, "hidden", False):
            line = next(ln for ln in r.output.splitlines() if p.opts[0] in ln)
            after = line.split(p.opts[0], 1)[1]
            # a flag is followed by its help (or its --no- twin), never by a value's type
            assert not after.lstrip().startswith("<"), line
