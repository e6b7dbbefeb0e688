"""`gyre proxy`: serve. Keep heavy imports inside the command."""

import typer


def serve() -> None:
    """Not implemented yet."""
    typer.echo("gyre proxy: not implemented yet", err=True)
    raise typer.Exit(2)
