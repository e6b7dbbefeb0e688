"""`gyre proxy`: serve. Keep heavy imports inside the command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import typer


def serve(
    model: str = typer.Option(
        ..., "--model", help="HF model directory (tokenizer + chat template)."
    ),
    engine: list[str] = typer.Option(..., "--engine", help="Engine base URL; repeat for a pool."),
    port: int = typer.Option(
        8000, "--port", min=0, max=65535, help="Port to listen on (0: a free one)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
    trace_dir: str = typer.Option(
        "traces", "--trace-dir", help="Where per-execution JSONL traces go."
    ),
    mode: str = typer.Option(
        "open", "--mode", help="open (any key = its own execution) or managed."
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
    parser: str = typer.Option("hermes", "--parser", help="Output parser: hermes | plain."),
    max_context: int | None = typer.Option(
        None, "--max-context", min=1, help="Token limit (default: model config)."
    ),
    no_fsync: bool = typer.Option(
        False, "--no-fsync", help="Do not fsync each trace record (faster, less durable)."
    ),
    max_body_mb: int | None = typer.Option(
        None, "--max-body-mb", min=1, help="Largest request body in MiB (default 64; 413 above)."
    ),
    engine_wait: float | None = typer.Option(
        None, "--engine-wait", min=0, help="Seconds a call waits for an engine (default 600)."
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
        help="Hard limit on the silence between stream chunks (default 600).",
    ),
) -> None:
    """Serve the OpenAI and Anthropic APIs in front of engines, recording token-exact traces."""
    import secrets

    from gyre.cli_errors import (
        bind_port,
        fail,
        first_line,
        make_dir,
        require_http_url,
        require_model_dir,
        user_errors,
        validation_line,
    )

    if mode not in ("open", "managed"):
        raise typer.BadParameter("--mode must be open or managed")
    if admin_token is not None:
        fail(
            "proxy",
            "--admin-token would put the token on the command line (readable in /proc); "
            "write it to a file only you can read and pass --admin-token-file",
        )
    with user_errors("proxy"):
        token = read_admin_token(admin_token_file) if admin_token_file else None
        require_model_dir(model, "--model")
        for url in engine:
            require_http_url(url, "--engine")
        from gyre.proxy.parsing import PARSERS

        if parser not in PARSERS:
            fail("proxy", f"--parser {parser!r}: unknown; use one of {', '.join(sorted(PARSERS))}")
        make_dir(trace_dir, "--trace-dir")
        # Bound before the tokenizer loads (a busy port is reported at once), and here
        # so --port 0 can print the port it got.
        sock = bind_port(host, port)
    from pydantic import ValidationError

    from gyre.proxy.app import build_admin_app, build_app
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import KEEP_ALIVE_S

    given = {
        "max_body_bytes": None if max_body_mb is None else max_body_mb << 20,
        "engine_wait_s": engine_wait,
        "engine_first_byte_timeout_s": engine_first_byte_timeout,
        "engine_idle_timeout_s": engine_idle_timeout,
    }
    limits = {k: v for k, v in given.items() if v is not None}  # unset: the config's defaults
    token = token or secrets.token_urlsafe(24)
    try:
        # CLI strings and optional limits: pydantic validates them (mode, ranges) as a whole
        cfg = ProxyConfig.model_validate(
            dict(
                model_dir=model,
                engines=list(engine),
                host=host,
                port=port,
                trace_dir=trace_dir,
                mode=mode,
                admin_token=token,
                admin_socket=admin_socket,
                parser=parser,
                max_context_tokens=max_context,
                fsync=not no_fsync,
                **limits,
            )
        )
    except ValidationError as e:
        sock.close()
        fail("proxy", validation_line(e))
    try:
        app = build_app(cfg)
    except (OSError, ValueError) as e:  # the tokenizer or chat template of --model
        sock.close()
        fail("proxy", f"--model {model}: cannot load its tokenizer ({first_line(e)})")
    from gyre.proxy.listeners import Listeners, bind_admin_socket, remove_admin_socket

    with user_errors("proxy"):
        try:
            admin_sock, admin_path, admin_dir = bind_admin_socket(admin_socket)
        except (OSError, ValueError) as e:
            sock.close()
            fail("proxy", f"--admin-socket: {first_line(e)}")
    token_note = admin_token_file or str(admin_path.with_name(admin_path.name + ".token"))
    if not admin_token_file:
        write_private(token_note, token)
    bound = sock.getsockname()[1]
    typer.echo(
        f"gyre proxy on http://{host}:{bound} -> {', '.join(engine)} (traces: {trace_dir}, mode {mode})",
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
