"""`gyre proxy`: serve. Keep heavy imports inside the command."""

from __future__ import annotations

import typer


def serve(
    model: str = typer.Option(
        ..., "--model", help="HF model directory (tokenizer + chat template)."
    ),
    engine: list[str] = typer.Option(..., "--engine", help="Engine base URL; repeat for a pool."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: a free one)."),
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

    import uvicorn

    from gyre.proxy.app import build_app
    from gyre.proxy.config import ProxyConfig

    if mode not in ("open", "managed"):
        raise typer.BadParameter("--mode must be open or managed")
    if mode == "managed" and not admin_token:
        admin_token = secrets.token_urlsafe(24)
        typer.echo(f"admin token: {admin_token}", err=True)
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
    app = build_app(cfg)
    import socket

    from gyre.proxy.server import KEEP_ALIVE_S

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))  # bound here so --port 0 can print the port it got
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
