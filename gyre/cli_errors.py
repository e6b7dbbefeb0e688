"""User mistakes become one line on stderr and a non-zero exit, never a traceback.

Every ``gyre`` sub-CLI checks what a user can get wrong (a path, a URL, a port, a
config value) before it loads anything heavy, and reports it the same way:
``gyre <command>: <what is wrong>; <how to fix it>``, exit status 2 (click's own
usage errors use 2 as well). The checks live here so the wording is the same in
every command and the tests can hold all of them to it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import typer

from gyre.validation import validation_line

USAGE = 2
"""Exit status for a user mistake."""


class UserError(Exception):
    """A mistake the user can fix; ``str(e)`` is the whole message, one line."""


def fail(command: str, message: str, code: int = USAGE) -> NoReturn:
    """Print ``gyre COMMAND: MESSAGE`` on stderr and exit with ``code``."""
    typer.echo(f"gyre {command}: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(command: str) -> Iterator[None]:
    """Turn a :class:`UserError` raised inside the block into :func:`fail`."""
    try:
        yield
    except UserError as e:
        fail(command, str(e))


def error_line(e: BaseException) -> str:
    """``str(e)``, with a pydantic error it wraps (``raise X(f"...: {ve}")``) shown by
    :func:`validation_line`: libraries embed the whole multi-line text, links included."""
    from pydantic import ValidationError

    text = str(e)
    inner = e.__cause__ or e.__context__
    if isinstance(inner, ValidationError) and str(inner) in text:
        text = text.replace(str(inner), validation_line(inner))
    return text


def model_dir_problem(
    path: str | Path, option: str = "--model", *, need_config: bool = True
) -> str | None:
    """Why ``path`` is not a Hugging Face model directory with a tokenizer, or None if it is.

    ``need_config=False`` accepts a tokenizer-only directory (the scripted engine's).
    """
    p = Path(path)
    hint = "give a Hugging Face model directory (build one with `gyre model tiny DIR`)"
    if not p.exists():
        return f"{option} {path}: no such directory; {hint}"
    if not p.is_dir():
        return f"{option} {path}: not a directory; {hint}"
    if need_config and not (p / "config.json").is_file():
        return f"{option} {path}: no config.json in it; {hint}"
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return f"{option} {path}: no tokenizer (tokenizer.json) in it; {hint}"
    return None


def require_model_dir(
    path: str | Path, option: str = "--model", *, need_config: bool = True
) -> Path:
    """``path`` as a Path, or :class:`UserError` saying why it is not a model directory."""
    problem = model_dir_problem(path, option, need_config=need_config)
    if problem:
        raise UserError(problem)
    return Path(path)


def require_http_url(url: str, option: str) -> str:
    """``url`` if it is ``http(s)://HOST[:PORT][/path]``, else :class:`UserError`."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError as e:
        raise UserError(f"{option} {url!r}: {e}; expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{option} {url!r} is not a URL; expected http://HOST:PORT")
    del port
    return url


def bind_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), or :class:`UserError` naming the port and the fix.

    Servers bind before they load a model, so a busy port is reported in a second,
    not after the model has loaded.
    """
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: must be 0-65535 (0: any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(
            f"--host {host!r}: cannot resolve it ({e}); use an address of this machine, "
            "e.g. 127.0.0.1"
        ) from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(
                f"--port {port}: already in use on {host}; stop what holds it or pick another "
                "port (--port 0: any free one)"
            ) from None
        if e.errno == errno.EACCES:
            raise UserError(
                f"--port {port}: permission denied on {host}; use a port above 1023"
            ) from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise UserError(
                f"--host {host}: not an address of this machine; use e.g. 127.0.0.1 or 0.0.0.0"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def make_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` (and its parents), or :class:`UserError` naming it and the reason."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot create it ({os_reason(e)})") from None
    if not os.access(p, os.W_OK):
        raise UserError(f"{what} {path}: not writable; pick a directory you can write to")
    return p


def os_reason(e: OSError) -> str:
    """The reason part of an OSError, without the path the message names anyway."""
    return e.strerror or str(e)


def path_error_line(e: OSError) -> str | None:
    """One line for an OSError about a user's path (``None`` if it names no path)."""
    if e.filename is None:
        return None
    return f"{e.filename}: {os_reason(e)}"


WEIGHTS_REFUSED = (
    "refused the model's weights: a pickle (pytorch_model.bin, *.pt) that holds more than "
    "tensors, which could run code when loaded; use safetensors weights from a source you trust"
)


def weights_refusal(text: str) -> str | None:
    """:data:`WEIGHTS_REFUSED` when ``text`` (an error or its traceback) is torch's
    ``weights_only`` refusal of a pickle, whose own message is a dozen lines of advice ending
    in a link, and whose advice (load it with ``weights_only=False``) runs the pickle's code."""
    if "UnpicklingError" in text or "Weights only load failed" in text:
        return WEIGHTS_REFUSED
    return None


class _StartupFailureLine(logging.Filter):
    """Turns the traceback uvicorn logs when an app's startup fails into one line."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def filter(self, record: logging.LogRecord) -> bool:
        if "lifespan" not in record.pathname:
            return True
        text = record.getMessage()
        if text.startswith("Application startup failed"):
            return False  # the line below already said so
        if text.startswith("Traceback (most recent call last)"):
            last = [ln for ln in text.splitlines() if ln.strip()][-1].strip()
            last = weights_refusal(text) or last
            sys.stderr.write(f"gyre {self.command}: startup failed: {last}\n")
            return False
        return True


def one_line_startup_failures(command: str) -> None:
    """Report a failed server startup (a model that will not load) as one line, not the
    traceback uvicorn logs; uvicorn still exits non-zero. Call after ``uvicorn.Config``,
    which configures its loggers."""
    logging.getLogger("uvicorn.error").addFilter(_StartupFailureLine(command))


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_third_party() -> None:
    """Keep third-party progress bars and hints out of Gyre's output.

    Set in the environment (before transformers is imported) so processes that
    Gyre starts, which import transformers themselves, stay quiet too. A user's
    own setting wins.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # ray.init's start-up notice about token authentication (Ray 2.5x) is a WARNING through
    # Python's last-resort handler, printed into the live view on every local run; the
    # cluster keeps the token auth it announces. Ray's real errors still come through.
    logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)


def first_line(e: BaseException | Any) -> str:
    """The first non-empty line of an exception's message (third-party messages run long);
    a pydantic error, raw or wrapped, as :func:`validation_line`."""
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        return validation_line(e)
    text = error_line(e) if isinstance(e, BaseException) else str(e)
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__
