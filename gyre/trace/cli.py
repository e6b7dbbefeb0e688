"""`gyre tree ...` commands. Keep heavy imports inside the commands."""

import typer

app = typer.Typer(help="tree commands (not implemented yet)", no_args_is_help=True)


@app.command("todo")
def _todo() -> None:
    """Placeholder until this package's CLI lands."""
    raise typer.Exit(2)
