"""Per-step agent figures: turns per execution, tool calls, harness cuts, and tree sharing.

Pure functions over what the runtime already holds when it packs a group: each execution's
:class:`~gyre.trace.toolhealth.ToolHealth`, how its harness stopped, and its
:class:`~gyre.trace.admission.Admission`. Like the tool-call health, a group gives
*summable* counts (keys under ``agentstats/``, not metric names) that a step adds up over
its groups; :func:`agent_metrics` turns a step's sums into the published ``agent/*`` and
``tree/*`` metrics (docs/runtime.md):

- turns: a histogram of answered model calls per execution (``agentstats/turns/<n>``), so
  quantiles of a step are exact whatever its groups were;
- harness cuts: executions stopped at the harness timeout, and those of them scored anyway
  (on their workspace);
- trees: per admitted execution, the tree's paths (leaves), the admitted paths, the tokens
  the admitted paths need stored once (each path up to its last target, shared prefixes
  once: what ``tree`` packing computes) and expanded flat (each path on its own: what
  ``paths`` packing computes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .admission import Admission
from .toolhealth import ToolHealth, from_sums

SUMS = "agentstats/"
_TURNS = f"{SUMS}turns/"
HARNESS_TIMEOUT = "harness_timeout"  # the executor's stop for a harness cut at its timeout

# summed tree keys, in table order
TREE_SUMS = ("paths", "paths_admitted", "tokens_unique", "tokens_flat")


def turn_sums(turns: Iterable[int]) -> dict[str, int]:
    """The histogram of turns per execution (one value per execution) as summable counts."""
    out: dict[str, int] = {}
    for n in turns:
        k = f"{_TURNS}{max(0, int(n))}"
        out[k] = out.get(k, 0) + 1
    return out


def timeout_sums(outcomes: Iterable[tuple[str | None, bool]]) -> dict[str, int]:
    """(harness stop, scored) per execution -> executions cut at the harness timeout, and
    those of them that got a score (the workspace is assessed after a cut)."""
    cut = scored = 0
    for stop, ok in outcomes:
        if stop == HARNESS_TIMEOUT:
            cut += 1
            scored += int(ok)
    return {f"{SUMS}harness_timeout": cut, f"{SUMS}harness_timeout_scored": scored}


def tree_figures(adm: Admission) -> dict[str, int]:
    """One execution's tree: paths, admitted paths, unique and flat tokens of the admitted
    paths (each up to its deepest target; a path without a target needs no token)."""
    tree = adm.tree
    cuts = []
    for p in adm.paths:
        if p.last_target < 0:
            continue
        toks = tree.path_tokens(p.leaf)  # tree indices increase along a path
        cuts.append(toks[: int(np.searchsorted(toks, p.last_target)) + 1])
    flat = sum(len(c) for c in cuts)
    unique = int(np.unique(np.concatenate(cuts)).size) if cuts else 0
    return {
        "paths": len(tree.leaves),
        "paths_admitted": len(adm.paths),
        "tokens_unique": unique,
        "tokens_flat": flat,
    }


def tree_sums(admissions: Iterable[Admission]) -> dict[str, int]:
    """:func:`tree_figures` summed over executions, as summable counts."""
    out = {f"{SUMS}tree/{k}": 0 for k in TREE_SUMS}
    for adm in admissions:
        for k, v in tree_figures(adm).items():
            out[f"{SUMS}tree/{k}"] += v
    return out


def quantile(hist: Mapping[int, int], q: float) -> int | None:
    """Nearest-rank ``q`` quantile (0 < q <= 1) of a histogram value -> count; None if empty."""
    total = sum(c for c in hist.values() if c > 0)
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for v in sorted(hist):
        seen += max(0, hist[v])
        if seen >= rank:
            return v
    return max(hist)  # pragma: no cover - unreachable: seen reaches total


def turn_histogram(sums: Mapping[str, Any]) -> dict[int, int]:
    """Turns -> executions, from a mapping holding :func:`turn_sums` keys (others ignored)."""
    out: dict[int, int] = {}
    for k, v in sums.items():
        if k.startswith(_TURNS) and k[len(_TURNS) :].isdigit() and int(v) > 0:
            n = int(k[len(_TURNS) :])
            out[n] = out.get(n, 0) + int(v)
    return out


def agent_metrics(sums: Mapping[str, Any]) -> dict[str, Any]:
    """A step's ``agent/*`` and ``tree/*`` metrics from its summed counts (these and the
    ``tools/*`` sums); a family is left out when its counts are absent."""
    out: dict[str, Any] = {}
    health = from_sums(sums)
    if health:
        total = ToolHealth()
        for h in health.values():
            total = total + h
        n = total.executions
        out["agent/tool_calls_per_exec_mean"] = total.calls / n if n else 0.0
    hist = turn_histogram(sums)
    if hist:
        n = sum(hist.values())
        out["agent/turns_mean"] = sum(t * c for t, c in hist.items()) / n
        for q in (10, 50, 90):
            out[f"agent/turns_p{q}"] = quantile(hist, q / 100)
        out["agent/turns_max"] = max(hist)
        out["agent/turns_hist"] = {str(t): hist[t] for t in sorted(hist)}
    if f"{SUMS}harness_timeout" in sums:
        for k in ("harness_timeout", "harness_timeout_scored"):
            out[f"agent/{k}"] = int(sums.get(f"{SUMS}{k}", 0))
    if f"{SUMS}tree/paths" in sums:
        t = {k: int(sums.get(f"{SUMS}tree/{k}", 0)) for k in TREE_SUMS}
        out.update({f"tree/{k}": v for k, v in t.items()})
        out["tree/flat_over_tree"] = (
            t["tokens_flat"] / t["tokens_unique"] if t["tokens_unique"] else 0.0
        )
    return out


__all__ = [
    "HARNESS_TIMEOUT",
    "agent_metrics",
    "quantile",
    "timeout_sums",
    "tree_figures",
    "tree_sums",
    "turn_histogram",
    "turn_sums",
]
