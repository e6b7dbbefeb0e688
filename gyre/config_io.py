"""Config files and ``--set`` overrides: the reading every command shares.

``gyre run`` (:mod:`gyre.runtime.config`), ``gyre proxy CONFIG`` and ``gyre engine CONFIG``
read the same TOML file with the same ``--set section.field=value`` overrides, so a run's
``[proxy]`` or ``[engine]`` serves standalone unchanged. A leaf: stdlib only, so the proxy and
engine CLIs take it without importing the run's composed config (which sits above them).

Overrides take JSON values where they parse as JSON (numbers, booleans, lists) and plain
strings otherwise.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

SECTIONS_WITH_MODEL = ("engine", "proxy", "trainer")
SECTIONS_WITH_SEED = ("engine", "trainer")  # one seed: engines sample, the trainer inits


def read_toml(path: str | Path) -> dict[str, Any]:
    """A config file's data; FileNotFoundError (one line) if there is none."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {p} does not exist")
    with open(p, "rb") as f:
        return tomllib.load(f)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (copying what it touches)."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not of the form section.field=value")
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[parts[-1]] = _parse_value(value)
    return out


def load_section(
    path: str | Path | None,
    section: str,
    overrides: list[str] | None = None,
    given: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One component's section of a run config, for ``gyre proxy CONFIG`` and
    ``gyre engine CONFIG``: the same file and the same ``--set section.field=value`` as
    ``gyre run``, so a run's ``[proxy]`` or ``[engine]`` serves standalone unchanged.

    The file's top-level ``model_dir`` and ``seed`` reach the section as in a run (the
    section's own win); ``given`` (the command's flags the user typed) come next and the
    overrides last. Returns plain data: the caller validates it with its own model, so each
    default stays the model's. Raises FileNotFoundError / ValueError (TOML syntax, overrides).
    """
    data = read_toml(path) if path is not None else {}
    body = data.get(section) or {}
    if not isinstance(body, dict):
        raise ValueError(f"[{section}] in {path} is a value, not a section")
    shared = {
        k: data[k]
        for k, sections in (("model_dir", SECTIONS_WITH_MODEL), ("seed", SECTIONS_WITH_SEED))
        if k in data and section in sections
    }
    merged = {**shared, **body, **{k: v for k, v in (given or {}).items() if v is not None}}
    for item in overrides or []:
        if not item.strip().startswith(f"{section}."):
            raise ValueError(f"override {item!r}: only {section}.field=value applies here")
    return apply_overrides({section: merged}, overrides or [])[section]
