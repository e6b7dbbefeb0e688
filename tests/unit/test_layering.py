"""The house's import rules, checked on the source (docs/architecture.md, CONTRIBUTING.md).

Every ``gyre/**/*.py`` is parsed with :mod:`ast` (relative and absolute imports, imports inside
functions and under ``TYPE_CHECKING`` all count, since each is knowledge one module has of
another). Two checks:

- no import circle between modules (a strongly connected component of more than one file);
- no package imports one that ``docs/architecture.md``'s table puts below it: ``ALLOWED`` is
  that table, written out as the packages each one may import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gyre"

# Imported by every package that needs them, importing nothing of gyre above them
# (docs/architecture.md: "leaves every package below may import").
LEAVES = {"log", "validation", "ports", "textsafe", "cli_errors", "config_io", "gyre"}

# The table of docs/architecture.md: package -> the gyre packages it may import (leaves aside).
ALLOWED: dict[str, set[str]] = {
    "policy": set(),
    "sim": {"policy"},
    "trace": set(),
    "engine": set(),
    "models": set(),
    "proxy": {"engine", "trace"},
    "train": {"trace", "models", "engine"},
    "harness": {"trace"},
    "runs": {"trace", "harness"},
    "runtime": {"policy", "sim", "trace", "engine", "models", "proxy", "train", "harness"},
    "config": {"policy", "sim", "trace", "engine", "models", "proxy", "train", "harness"}
    | {"runtime"},
    "cli": {"policy", "sim", "trace", "engine", "models", "proxy", "train", "harness"}
    | {"runs", "runtime", "config"},
}
# The leaves import only one another (cli_errors words a pydantic error with validation's line).
LEAF_ALLOWED: dict[str, set[str]] = {"cli_errors": {"validation"}}


def _modules() -> dict[str, Path]:
    """Module name -> file; a package's ``__init__.py`` is the package's own name."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path, known: dict[str, Path] | None = None) -> set[str]:
    """What ``mod`` imports of gyre. With ``known`` (the hook's graph): ``from a import b``
    names module ``a.b`` if it is one, else ``a``; names outside ``known`` are dropped. Without
    it: every gyre name, ``a.b`` for ``from a import b``."""
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - n.level + 1] + ([base] if base else []))
            for a in n.names:
                names = (f"{base}.{a.name}", base)
                if known is None:
                    out.add(names[0])
                else:
                    out.update(next(([c] for c in names if c in known), []))
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names if known is None or a.name in known)
    out.discard(mod)
    return {m for m in out if m == "gyre" or m.startswith("gyre.")}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, ``__init__`` files aside: the same graph as the
    before-stop hook's circle check."""
    mods = {m: p for m, p in _modules().items() if p.name != "__init__.py"}
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(10000)
    idx: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    res: list[list[str]] = []

    def visit(v: str) -> None:
        idx[v] = low[v] = len(idx)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in idx:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(sorted(comp))

    for v in sorted(g):
        if v not in idx:
            visit(v)
    return sorted(res)


def _unit(mod: str) -> str:
    """The row of the layering table a module belongs to (its package, or a top-level file)."""
    parts = mod.split(".")
    if len(parts) > 1 and ((PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file()):
        return parts[1]
    return "gyre"  # the package's own __init__ (its version)


def _upward() -> list[str]:
    bad = []
    for m, p in _modules().items():
        a = _unit(m)
        for name in sorted(_imports(m, p)):
            b = _unit(name)
            if a == b or (b in LEAVES and a not in LEAVES):
                continue
            ok = LEAF_ALLOWED.get(a, set()) if a in LEAVES else ALLOWED.get(a, set())
            if b not in ok:
                bad.append(f"{m} -> {name} ({a} may import {sorted(ok) or 'nothing of gyre'})")
    return bad


def test_every_package_has_a_row() -> None:
    units = {_unit(m) for m in _modules()}
    assert units <= set(ALLOWED) | LEAVES, sorted(units - set(ALLOWED) - LEAVES)


def test_no_import_circles() -> None:
    circles = _circles(_graph())
    assert not circles, "import circles (TYPE_CHECKING imports count):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_no_import_runs_up_the_layers() -> None:
    bad = _upward()
    table = "\n".join(f"  {k}: {sorted(v)}" for k, v in ALLOWED.items())
    assert not bad, (
        "imports up the layers of docs/architecture.md:\n"
        + "\n".join(bad)
        + f"\nallowed (leaves {sorted(LEAVES)} aside):\n{table}"
    )


# Test rigs (gyre.runtime.handles.Rig): the modules that may name them, i.e. the rig itself,
# its audit, and the one place that reads its config section and attaches it to the world.
RIGS = {"gyre.runtime.chaos", "gyre.runtime.chaos_audit"}
RIG_ATTACHERS = {"gyre.runtime.loop"}


def test_rigs_attach_from_outside_the_product() -> None:
    """Only the attaching module imports a rig: the world, supervision, records, the live view
    and the report know a rig by the ``Rig`` protocol alone (issue 36: rigs out of the
    product path)."""
    bad = [
        f"{m} -> {name}"
        for m, p in _modules().items()
        if m not in RIGS | RIG_ATTACHERS
        for name in sorted(_imports(m, p))
        if name in RIGS or any(name.startswith(r + ".") for r in RIGS)
    ]
    assert not bad, "modules of the product path importing a test rig:\n" + "\n".join(bad)
