"""``gyre runs health``: the tool-call health table of a run's (or a trace folder's) executions.

One line per execution, counted from its trace alone (:mod:`gyre.trace.toolhealth`, the same
counts a run's ``tools/*`` metrics sum), then one total line per harness profile. Roles
(compactions, sub-agent calls) follow the harness's role rules: the run's own profile for a
run directory, ``--harness`` otherwise (else the default rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.runs import safefs
from gyre.runs.files import is_run_dir, read_json
from gyre.textsafe import printable
from gyre.trace.roles import RoleProfile, default_profile
from gyre.trace.store import read_trace
from gyre.trace.toolhealth import ToolHealth, execution_health


class HealthError(ValueError):
    """A path that holds no traces (one line for the user)."""


@dataclass
class Source:
    """Trace files and the harness profile whose rules read them."""

    files: list[Path]
    profile: str
    roles: RoleProfile


def _harness(name: str) -> tuple[str, RoleProfile]:
    from gyre.harness.profiles import ProfileError, load_profile

    try:
        prof = load_profile(name)
    except ProfileError as e:
        raise HealthError(str(e)) from None
    return prof.name, prof.role_profile()


def source(path: Path, harness: str | None) -> Source:
    """``path``: a run directory (its traces/ and its profile), a folder of traces, or one."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        folder = path / "traces" if is_run_dir(path) else path
        files = []
        for f in sorted(folder.glob("*.jsonl")):  # a FIFO or a link out of it: skipped
            why = safefs.refusal(folder, f)
            files += [f] if why is None else []
            if why is not None:
                safefs.warn(f, why)
    else:
        raise HealthError(f"{path}: no such file or directory")
    if not files:
        raise HealthError(f"{path}: no trace files (*.jsonl) in it")
    if harness is None and path.is_dir() and is_run_dir(path):
        cfg = read_json(path / "config.json")
        run = cfg.get("run") if isinstance(cfg, dict) else None
        harness = run.get("profile") if isinstance(run, dict) else None
    if harness is None:
        return Source(files, "default", default_profile())
    name, roles = _harness(str(harness))
    return Source(files, name, roles)


def rows(src: Source) -> list[tuple[str, ToolHealth]]:
    """(execution id, its counts) per trace file; a file that is not a trace is an error."""
    out = []
    for f in src.files:
        try:
            res = read_trace(f)
        except (OSError, ValueError) as e:
            raise HealthError(f"{f}: cannot read it as a trace ({e})") from None
        if res.errors and not res.records:
            raise HealthError(f"{f}: not a Gyre trace ({res.errors[0]})")
        eid = res.records[0].execution_id if res.records else f.stem
        out.append((eid, execution_health(res.records, src.roles)))
    return out


COLUMNS = ("turns", "calls", "unparsed", "truncated", "no_call", "compactions", "subagent")


def _cells(h: ToolHealth) -> list[str]:
    return [
        str(h.turns),
        str(h.calls),
        str(h.unparsed),
        str(h.truncated),
        str(h.no_call_executions),
        str(h.compactions),
        str(h.subagent_calls),
    ]


def table(groups: list[tuple[str, list[tuple[str, ToolHealth]]]]) -> str:
    """Aligned text: each execution, then per profile a total with turns per execution."""
    lines = [["execution", "profile", *COLUMNS]]
    totals: dict[str, ToolHealth] = {}
    for profile, items in groups:
        for eid, h in items:
            lines.append([printable(str(eid)), printable(profile), *_cells(h)])
            totals[profile] = totals.get(profile, ToolHealth()) + h
    for profile, total in totals.items():
        label = f"total ({total.executions} exec, {total.turns_per_execution:.2f} turns/exec)"
        lines.append([label, profile, *_cells(total)])
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    fmt = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in lines
    ]
    return "\n".join(fmt[:1] + ["-" * len(fmt[0])] + fmt[1:])
