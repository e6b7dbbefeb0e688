"""`gyre proxy [CONFIG] [--set proxy.k=v]`: serve. Keep heavy imports inside the command.

The proxy's settings are :class:`~gyre.proxy.config.ProxyConfig`'s (defaults included, the
help texts read them); a run config's ``[proxy]`` serves standalone, and the flags win.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
from pathlib import Path
from typing import Any

import typer

from gyre.proxy.config import ProxyConfig

CLI_PORT = 8000
"""``gyre proxy``'s port when neither a flag nor the config names one (ProxyConfig's own, 0,
is "any free port", what tests and the runtime want)."""


def _default(field: str) -> Any:
    return ProxyConfig.model_fields[field].default


def serve(
    config: Path | None = typer.Argument(
        None,
        help="A run config (TOML; gyre run's): its [proxy] section and model_dir. Flags win.",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override: proxy.field=value (repeatable; after the flags)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="HF model directory (tokenizer + chat template)."
    ),
    engine: list[str] = typer.Option([], "--engine", help="Engine base URL; repeat for a pool."),
    port: int | None = typer.Option(
        None,
        "--port",
        min=0,
        max=65535,
        help=f"Port to listen on (default {CLI_PORT}; 0: a free one).",
    ),
    host: str | None = typer.Option(
        None, "--host", help=f"Interface to bind (default {_default('host')})."
    ),
    trace_dir: str | None = typer.Option(
        None,
        "--trace-dir",
        help=f"Where per-execution JSONL traces go (default {_default('trace_dir')}).",
    ),
    mode: str | None = typer.Option(
        None,
        "--mode",
        help=f"open (any key = its own execution) or managed (default {_default('mode')}).",
    ),
    admin_token_file: str | None = typer.Option(
        None,
        "--admin-token-file",
        help="File holding the bearer token for the admin routes (mode 0600; default: a fresh "
        "token written next to the admin socket). Never on the command line or in the "
        "environment, where a harness could read it.",
    ),
    admin_socket: str | None = typer.Option(
        None,
        "--admin-socket",
        help="Unix socket for the admin routes (its directory must be 0700; default: a fresh "
        "private directory). The API port never serves them.",
    ),
    admin_token: str | None = typer.Option(None, "--admin-token", hidden=True),
    parser: str | None = typer.Option(
        None, "--parser", help=f"Output parser: hermes | plain (default {_default('parser')})."
    ),
    max_context: int | None = typer.Option(
        None, "--max-context", min=1, help="Token limit (default: model config)."
    ),
    no_fsync: bool = typer.Option(
        False, "--no-fsync", help="Do not fsync each trace record (faster, less durable)."
    ),
    max_body_mb: int | None = typer.Option(
        None,
        "--max-body-mb",
        min=1,
        help=f"Largest request body in MiB (default {_default('max_body_bytes') >> 20}; 413 above).",
    ),
    engine_wait: float | None = typer.Option(
        None,
        "--engine-wait",
        min=0,
        help=f"Seconds a call waits for an engine (default {_default('engine_wait_s'):g}).",
    ),
    engine_first_byte_timeout: float | None = typer.Option(
        None,
        "--engine-first-byte-timeout",
        min=0,
        help="Hard limit on an engine's time to first data (default: none; probes catch a "
        "frozen engine).",
    ),
    engine_idle_timeout: float | None = typer.Option(
        None,
        "--engine-idle-timeout",
        min=0,
        help="Hard limit on the silence between stream chunks "
        f"(default {_default('engine_idle_timeout_s'):g}).",
    ),
) -> None:
    """Serve the OpenAI and Anthropic APIs in front of engines, recording token-exact traces."""
    from gyre.cli_errors import fail

    if admin_token is not None:
        fail(
            "proxy",
            "--admin-token would put the token on the command line (readable in /proc); "
            "write it to a file only you can read and pass --admin-token-file",
        )
    given = {
        "model_dir": model,
        "engines": list(engine) or None,
        "port": port,
        "host": host,
        "trace_dir": trace_dir,
        "mode": mode,
        "admin_socket": admin_socket,
        "parser": parser,
        "max_context_tokens": max_context,
        "fsync": False if no_fsync else None,
        "max_body_bytes": None if max_body_mb is None else max_body_mb << 20,
        "engine_wait_s": engine_wait,
        "engine_first_byte_timeout_s": engine_first_byte_timeout,
        "engine_idle_timeout_s": engine_idle_timeout,
    }
    cfg = _config(config, set_, given)
    token = read_admin_token(admin_token_file) if admin_token_file else None
    sock = _check(cfg)
    cfg = cfg.model_copy(update={"admin_token": token or secrets.token_urlsafe(24)})
    _serve(cfg, sock, admin_token_file)


def _config(path: Path | None, overrides: list[str], given: dict[str, Any]) -> ProxyConfig:
    """The proxy's config: CONFIG's [proxy], then the flags typed, then ``--set``; one line
    (exit 2) for anything wrong with it."""
    from pydantic import ValidationError

    from gyre.cli_errors import fail, first_line
    from gyre.config_io import load_section
    from gyre.validation import validation_line

    try:
        data = load_section(path, "proxy", overrides, given)
    except (OSError, ValueError) as e:
        fail("proxy", first_line(e))
    data.setdefault("port", CLI_PORT)
    if not data.get("model_dir"):
        fail("proxy", "give --model DIR (or model_dir in CONFIG)")
    if not data.get("engines"):
        fail("proxy", "give --engine URL (repeat for a pool; or proxy.engines in CONFIG)")
    try:
        # CLI strings and optional limits: pydantic validates them (mode, ranges) as a whole
        return ProxyConfig.model_validate(data)
    except ValidationError as e:
        fail("proxy", validation_line(e))


def _check(cfg: ProxyConfig) -> socket.socket:
    """The checks a user's mistake would otherwise fail minutes later; returns the bound port."""
    from gyre.cli_errors import (
        bind_port,
        fail,
        make_dir,
        require_http_url,
        require_model_dir,
        user_errors,
    )
    from gyre.proxy.parsing import PARSERS

    with user_errors("proxy"):
        require_model_dir(cfg.model_dir, "--model")
        for url in cfg.engines:
            require_http_url(url, "--engine")
        if cfg.parser not in PARSERS:
            fail(
                "proxy",
                f"--parser {cfg.parser!r}: unknown; use one of {', '.join(sorted(PARSERS))}",
            )
        make_dir(cfg.trace_dir, "--trace-dir")
        # Bound before the tokenizer loads (a busy port is reported at once), and here
        # so --port 0 can print the port it got.
        return bind_port(cfg.host, cfg.port)


def _serve(cfg: ProxyConfig, sock: socket.socket, admin_token_file: str | None) -> None:
    from gyre.cli_errors import fail, first_line, user_errors
    from gyre.proxy.app import build_admin_app, build_app
    from gyre.proxy.listeners import Listeners, bind_admin_socket, remove_admin_socket
    from gyre.proxy.render import TemplateRejected
    from gyre.proxy.runner import KEEP_ALIVE_S

    try:
        app = build_app(cfg)
    except TemplateRejected as e:
        sock.close()
        fail("proxy", f"--model {cfg.model_dir}: its chat template is refused: {first_line(e)}")
    except (OSError, ValueError) as e:  # the tokenizer or chat template of --model
        sock.close()
        fail("proxy", f"--model {cfg.model_dir}: cannot load its tokenizer ({first_line(e)})")
    with user_errors("proxy"):
        try:
            admin_sock, admin_path, admin_dir = bind_admin_socket(cfg.admin_socket)
        except (OSError, ValueError) as e:
            sock.close()
            fail("proxy", f"--admin-socket: {first_line(e)}")
    token_note = admin_token_file or str(admin_path.with_name(admin_path.name + ".token"))
    if not admin_token_file:
        assert cfg.admin_token
        write_private(token_note, cfg.admin_token)
    bound = sock.getsockname()[1]
    typer.echo(
        f"gyre proxy on http://{cfg.host}:{bound} -> {', '.join(cfg.engines)} "
        f"(traces: {cfg.trace_dir}, mode {cfg.mode})",
        err=True,
    )
    typer.echo(f"admin routes on unix socket {admin_path} (token in {token_note})", err=True)
    lst = Listeners(
        app,
        build_admin_app(cfg, app.state.service),
        sock,
        admin_sock,
        read_timeout_s=cfg.client_read_timeout_s,
        keep_alive_s=KEEP_ALIVE_S,
        max_connections=cfg.max_client_connections,
    )
    # uvicorn re-raises the signal that stopped it once it is done; as KeyboardInterrupt (also
    # for SIGTERM) it ends here, so the admin socket and the generated token file are removed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(lst.serve())
    except KeyboardInterrupt:
        pass
    finally:
        remove_admin_socket(admin_path, admin_dir)
        if not admin_token_file:
            with contextlib.suppress(OSError):
                os.unlink(token_note)


def read_admin_token(path: str) -> str:
    """The admin token from ``path``, which only its owner may read (the token guards the pool)."""
    from gyre.cli_errors import fail

    try:
        st = os.stat(path)
        token = open(path, encoding="utf-8").read().strip()
    except OSError as e:
        fail("proxy", f"--admin-token-file {path}: {e.strerror}")
    if st.st_mode & 0o077:
        fail("proxy", f"--admin-token-file {path}: readable by others; chmod 600 it")
    if not token:
        fail("proxy", f"--admin-token-file {path}: empty")
    return token


def write_private(path: str, text: str) -> None:
    """Create ``path`` with mode 0600 from the start (no window in which others may read it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
