"""`gyre tree ...` commands: look at trajectory trees built from trace files.

Keep heavy imports inside the commands (no torch here at all).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gyre.cli_errors import (
    fail,
    first_line,
    make_dir,
    require_model_dir,
    user_errors,
)
from gyre.validation import validation_line

app = typer.Typer(
    help="Trajectory trees: build from traces, admission stats, rendering.", no_args_is_help=True
)


def _profile(path: Path | None, command: str):
    from pydantic import ValidationError

    from gyre.trace.roles import RoleProfile, default_profile

    if path is None:
        return default_profile()
    try:
        return RoleProfile.model_validate_json(path.read_text())
    except OSError as e:
        fail(f"tree {command}", f"--profile {path}: {e.strerror or e}")
    except ValidationError as e:
        fail(f"tree {command}", f"--profile {path}: not a RoleProfile JSON ({validation_line(e)})")


def _tokenizer(path: Path, command: str):
    """The tokenizer in ``path``, or one line saying why it cannot be loaded."""
    with user_errors(f"tree {command}"):
        require_model_dir(path, "--tokenizer", need_config=False)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        fail(f"tree {command}", f"--tokenizer {path}: cannot load it ({first_line(e)})")


def _decoder(tokenizer: Path | None, command: str):
    if tokenizer is None:
        return None
    tok = _tokenizer(tokenizer, command)
    return lambda ids: tok.decode(ids)


def _load(path: Path, prof, vocab_size: int | None, command: str):
    """One trace's tree; a file that is not a Gyre trace is a user mistake (exit 2)."""
    from gyre.trace.stats import load_tree

    try:
        tree = load_tree(path, prof, vocab_size)
    except OSError as e:
        fail(f"tree {command}", f"{path}: {e.strerror or e}")
    except ValueError as e:  # not UTF-8 text
        fail(f"tree {command}", f"{path}: not a Gyre trace (JSONL): {first_line(e)}")
    if not tree.requests:
        why = tree.errors[0] if tree.errors else f"{path}: no trace records in it"
        fail(f"tree {command}", f"not a Gyre trace (JSONL, one call per line): {why}")
    return tree


@app.command("stats")
def stats(
    traces: list[Path] = typer.Argument(
        ..., help="Trace files (one execution's JSONL each).", exists=True
    ),
    j_max: int | None = typer.Option(
        None, "--j-max", min=0, help="Admission cap (default: uncapped)."
    ),
    seed: int = typer.Option(0, help="Admission seed."),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object per trace, one per line."
    ),
    profile: Path | None = typer.Option(
        None, help="RoleProfile JSON file (default: the built-in profile)."
    ),
    vocab_size: int | None = typer.Option(
        None, min=1, help="Reject token ids outside this vocabulary."
    ),
    tokenizer: Path | None = typer.Option(
        None, help="Tokenizer directory: also count message nodes (occurrences of --message-token)."
    ),
    message_token: str = typer.Option(
        "<|im_start|>", help="Token that opens a message (with --tokenizer)."
    ),
) -> None:
    """Requests, unique nodes/tokens, paths, expansion, targets by role, and admission for --j-max."""
    from gyre.trace.stats import format_stats, tree_stats

    prof = _profile(profile, "stats")
    msg_id: int | None = None
    if tokenizer is not None:
        tok = _tokenizer(tokenizer, "stats")
        found = tok.convert_tokens_to_ids(message_token)
        msg_id = found if isinstance(found, int) else None
        if msg_id is None or msg_id == tok.unk_token_id:
            raise typer.BadParameter(f"{message_token!r} is not a token of {tokenizer}")
    keys = ("requests", "unique_tokens", "tokens_expanded", "targets", "paths")
    total = dict.fromkeys(keys, 0)
    total["admitted_targets"] = 0
    for i, path in enumerate(traces):
        s = tree_stats(_load(path, prof, vocab_size, "stats"), j_max, seed, message_token=msg_id)
        s["trace"] = str(path)
        for k in keys:
            total[k] += s[k]
        total["admitted_targets"] += s["admission"]["admitted_targets"]
        if as_json:
            typer.echo(json.dumps(s))
        else:
            if i:
                typer.echo("")
            typer.echo(f"{path}:")
            typer.echo(format_stats(s))
    if len(traces) > 1 and not as_json:
        dedup = total["tokens_expanded"] / total["unique_tokens"] if total["unique_tokens"] else 0.0
        typer.echo(
            f"\ntotal over {len(traces)} executions: {total['requests']} requests, {total['paths']} paths, "
            f"{total['unique_tokens']} unique tokens ({total['tokens_expanded']} expanded, {dedup:.2f}x), "
            f"{total['targets']} targets, {total['admitted_targets']} admitted"
        )


@app.command("show")
def show(
    trace: Path = typer.Argument(..., help="One execution's trace file.", exists=True),
    j_max: int | None = typer.Option(
        None, "--j-max", min=0, help="Mark the paths admitted under this cap."
    ),
    seed: int = typer.Option(0, help="Admission seed."),
    html_out: Path | None = typer.Option(
        None, "--html", help="Also write an HTML picture of the tree here."
    ),
    png_out: Path | None = typer.Option(
        None, "--png", help="Also write a PNG icicle picture of the tree here."
    ),
    tokenizer: Path | None = typer.Option(None, help="Tokenizer directory: show node text."),
    max_nodes: int = typer.Option(400, min=0, help="Print at most this many nodes."),
    profile: Path | None = typer.Option(None, help="RoleProfile JSON file."),
) -> None:
    """An indented outline of the tree's radix nodes (leaves with role and admission order)."""
    from gyre.trace.admission import admit
    from gyre.trace.stats import render_html, render_png, render_text

    for out in (html_out, png_out):  # before the outline is printed, not after
        if out is not None and not out.parent.is_dir():
            fail("tree show", f"cannot write {out}: no directory {out.parent}")
    tree = _load(trace, _profile(profile, "show"), None, "show")
    adm = admit(tree, j_max, seed)
    decode = _decoder(tokenizer, "show")
    typer.echo(render_text(tree, adm, max_nodes=max_nodes, decode=decode))
    for e in tree.errors:
        typer.echo(f"problem: {e}", err=True)
    try:
        if html_out is not None:
            html_out.write_text(render_html(tree, adm, decode=decode), encoding="utf-8")
            typer.echo(f"wrote {html_out}")
        if png_out is not None:
            typer.echo(f"wrote {render_png(tree, png_out, adm)}")
    except OSError as e:
        fail("tree show", f"cannot write {e.filename or html_out or png_out}: {e.strerror or e}")


@app.command("synth")
def synth(
    out_dir: Path = typer.Argument(..., help="Directory to write the synthetic trace to."),
    requests: int = typer.Option(636, help="Requests in the execution."),
    subagents: int = typer.Option(5, help="Sub-agents (sub-agent 0 compacts)."),
    seed: int = typer.Option(0),
    execution_id: str = typer.Option("case-study"),
) -> None:
    """Write a synthetic execution shaped like the paper's case study (for demos and benches)."""
    from gyre.trace.store import TraceWriter, trace_path
    from gyre.trace.synthetic import case_study_execution

    with user_errors("tree synth"):
        make_dir(out_dir, "OUT_DIR")
    try:
        # Replace, never append: a second run into the same directory would otherwise
        # duplicate every request id.
        trace_path(out_dir, execution_id).unlink(missing_ok=True)
        w = TraceWriter(out_dir, fsync=False)
        try:
            for r in case_study_execution(
                execution_id, seed=seed, n_requests=requests, n_subagents=subagents
            ):
                w.append(r)
        finally:
            w.close()
    except OSError as e:
        fail("tree synth", f"cannot write {e.filename or out_dir}: {e.strerror or e}")
    except ValueError as e:  # sizes the generator cannot honour
        fail("tree synth", f"{e}; raise --requests or lower --subagents")
    typer.echo(str(trace_path(out_dir, execution_id)))
