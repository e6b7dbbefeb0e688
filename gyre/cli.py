"""The user's front door: ``gyre <command>``.

Each package owns its own sub-CLI module; this file only wires them together.
Sub-CLI modules import nothing heavy at module level so ``gyre --help`` and
``gyre sim`` start fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gyre.engine import cli as engine_cli
from gyre.harness import cli as harness_cli
from gyre.proxy import cli as proxy_cli
from gyre.runtime import cli as runtime_cli
from gyre.sim import cli as sim_cli
from gyre.trace import cli as tree_cli
from gyre.train import cli as train_cli

app = typer.Typer(
    help="Gyre: elastic RL for long-horizon LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(sim_cli.app, name="sim")
app.add_typer(tree_cli.app, name="tree")
app.add_typer(harness_cli.app, name="harness")
app.add_typer(train_cli.app, name="train")
app.command("engine")(engine_cli.serve)
app.command("proxy")(proxy_cli.serve)
app.command("run")(runtime_cli.run_command)

model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("tiny")
def model_tiny(
    out_dir: Path = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, help="Weight initialisation seed."),
    vocab_size: int = typer.Option(2048, help="BPE vocabulary size (special tokens included)."),
    layers: int = typer.Option(2, help="Transformer layers."),
    hidden: int = typer.Option(128, help="Hidden size."),
) -> None:
    """Build a tiny Qwen3-family model and tokenizer offline (for tests and the quickstart)."""
    from gyre.models.tiny import build_tiny_model

    path = build_tiny_model(out_dir, seed=seed, vocab_size=vocab_size, layers=layers, hidden=hidden)
    typer.echo(str(path))


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

    from gyre.config import load_config

    try:
        cfg = load_config(file, set_, model_dir=model_dir)
    except (ValidationError, ValueError, FileNotFoundError) as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(cfg.model_dump_json(indent=2))


@app.command("version")
def version() -> None:
    """Print Gyre's version."""
    from gyre import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
