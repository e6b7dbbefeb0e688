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
        None, "--max-context", help="Token limit (default: model config)."
    ),
    no_fsync: bool = typer.Option(
        False, "--no-fsync", help="Do not fsync each trace record (faster, less durable)."
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
