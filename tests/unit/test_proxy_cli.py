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
        "--admin-token-file",
        "--admin-socket",
    ):
        assert opt in out.output
    assert "--admin-token " not in out.output  # a token on the command line is readable in /proc


def test_proxy_cli_rejects_bad_mode(tmp_path):
    out = CliRunner().invoke(
        app,
        ["proxy", "--model", str(tmp_path), "--engine", "http://127.0.0.1:1", "--mode", "chaos"],
    )
    assert out.exit_code != 0


def test_proxy_cli_refuses_a_token_on_the_command_line(tmp_path):
    args = ["proxy", "--model", str(tmp_path), "--engine", "http://127.0.0.1:1"]
    out = CliRunner().invoke(app, [*args, "--admin-token", "s3cret"])
    assert out.exit_code != 0
    assert "--admin-token-file" in out.output and "Traceback" not in out.output


def test_proxy_cli_refuses_a_token_file_others_can_read(tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    f.chmod(0o644)
    args = ["proxy", "--model", str(tmp_path), "--engine", "http://127.0.0.1:1"]
    out = CliRunner().invoke(app, [*args, "--admin-token-file", str(f)])
    assert out.exit_code != 0
    assert "chmod 600" in out.output and "s3cret" not in out.output
