"""`gyre proxy`: serve. Keep heavy imports inside the command."""

from __future__ import annotations

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
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="GYRE_ADMIN_TOKEN",
        help="Bearer token for /admin routes (managed: generated if absent).",
    ),
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
    with user_errors("proxy"):
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
    import uvicorn
    from pydantic import ValidationError

    from gyre.proxy.app import build_app
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.server import KEEP_ALIVE_S

    given = {
        "max_body_bytes": None if max_body_mb is None else max_body_mb << 20,
        "engine_wait_s": engine_wait,
        "engine_first_byte_timeout_s": engine_first_byte_timeout,
        "engine_idle_timeout_s": engine_idle_timeout,
    }
    limits = {k: v for k, v in given.items() if v is not None}  # unset: the config's defaults
    if mode == "managed" and not admin_token:
        admin_token = secrets.token_urlsafe(24)
        typer.echo(f"admin token: {admin_token}", err=True)
    try:
        cfg = ProxyConfig(
            model_dir=model,
            engines=list(engine),
            host=host,
            port=port,
            trace_dir=trace_dir,
            mode=mode,
            admin_token=admin_token,
            parser=parser,
            max_context_tokens=max_context,
            fsync=not no_fsync,
            **limits,
        )
    except ValidationError as e:
        sock.close()
        fail("proxy", validation_line(e))
    try:
        app = build_app(cfg)
    except (OSError, ValueError) as e:  # the tokenizer or chat template of --model
        sock.close()
        fail("proxy", f"--model {model}: cannot load its tokenizer ({first_line(e)})")
    bound = sock.getsockname()[1]
    typer.echo(
        f"gyre proxy on http://{host}:{bound} -> {', '.join(engine)} (traces: {trace_dir}, mode {mode})",
        err=True,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=bound,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run(sockets=[sock])
