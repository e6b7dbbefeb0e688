"""`gyre proxy` is mounted with the documented options."""

from typer.testing import CliRunner

from gyre.cli import app


def test_proxy_cli_options():
    out = CliRunner().invoke(app, ["proxy", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    for opt in (
        "--model",
        "--engine",
        "--port",
        "--host",
        "--trace-dir",
        "--mode",
        "--admin-token",
    ):
        assert opt in out.output


def test_proxy_cli_rejects_bad_mode(tmp_path):
    out = CliRunner().invoke(
        app,
        ["proxy", "--model", str(tmp_path), "--engine", "http://127.0.0.1:1", "--mode", "chaos"],
    )
    assert out.exit_code != 0
