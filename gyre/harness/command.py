"""The harness's command line for one execution, rendered from its profile.

argv, environment and config files (``home_files``) come from the profile's templates
filled with the execution's values: its folders, its API key, the proxy's base URL in
each SDK's form, the model name and the npm harnesses found on this host. In the
proxy-only sandbox the harness has no network but a loopback bridge to the proxy, so
it is given the bridge's URL (:func:`bridge_target`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .execution import ExecutionError
from .hostguard import GYRE_ROOT
from .launch import Exec
from .model_calls import CALLS_FILE_ENV, CALLS_FILE_NAME
from .profiles import find_npm_harness
from .sandbox import SANDBOX_HOME


def bridge_target(base_url: str) -> tuple[str, int, str]:
    """(proxy host, port, base URL as the sandboxed harness sees it) for the proxy-only network."""
    u = urlsplit(base_url)
    if u.scheme != "http" or not u.hostname:
        raise ExecutionError(
            f"proxy-only sandbox network needs an http:// base URL, got {base_url!r}"
        )
    port = u.port or 80
    # The bridge listens inside as the unprivileged sandbox user: a port below 1024 cannot
    # be bound there, so it is moved up (the harness only ever sees the URL).
    inside = port if port >= 1024 else 20000 + port
    return (
        u.hostname,
        port,
        urlunsplit(("http", f"127.0.0.1:{inside}", u.path, u.query, u.fragment)),
    )


def command_line(
    x: Exec, base_url: str, key: str, sandboxed: bool
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """argv, environment and the profile's rendered ``home_files`` for one execution.

    Stats a dozen paths looking for the npm harnesses: call it off the event loop."""
    spec = x.spec
    base = base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    prof = spec.profile
    values = {
        "instruction": spec.task.instruction,
        "instruction_file": str(x.inputs / "instruction.md"),
        "workspace": str(x.ws),
        "artifacts": str(x.artifacts),
        "home": SANDBOX_HOME if sandboxed else str(x.home),
        "base_url": base_url,
        "openai_base_url": root + "/v1",
        "anthropic_base_url": root,
        "api_key": key,
        "model": spec.model or prof.model,
        "python": sys.executable,
        "python_bin": str(Path(sys.executable).parent),
        "gyre_root": GYRE_ROOT,
        "claude": find_npm_harness("claude") or "claude",
        "qwen": find_npm_harness("qwen") or "qwen",
        "codex": find_npm_harness("codex") or "codex",
        "solution_dir": str(x.inputs / "solution"),
        "execution_id": spec.execution_id,
        "task": spec.task.name,
    }
    argv, penv = prof.render(values)
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {
        "PATH": f"{values['python_bin']}:{path}",
        "HOME": values["home"],
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "PYTHONUNBUFFERED": "1",
        "OPENAI_BASE_URL": values["openai_base_url"],
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": values["anthropic_base_url"],
        "ANTHROPIC_API_KEY": key,
        "GYRE_EXECUTION_ID": spec.execution_id,
        "GYRE_TASK": spec.task.name,
        CALLS_FILE_ENV: str(x.artifacts / CALLS_FILE_NAME),
        **penv,
        **spec.extra_env,
    }
    return argv, env, prof.render_home_files(values)


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``root``, making folders as needed."""
    for rel, text in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
