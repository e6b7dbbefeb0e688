"""Proxy-only networking for sandboxed harnesses: TCP inside the sandbox -> unix socket -> proxy.

With ``--unshare-net`` a sandbox has its own, empty network namespace (only
its own loopback), so a harness cannot reach the host's engines, Ray, or
anything else -- and also not the proxy. This module bridges exactly one
endpoint through the filesystem:

- outside, :class:`gyre.harness.forwarder.UnixForwarder` (asyncio, in the
  executor) accepts connections on a unix socket and pipes each to the
  proxy's TCP address;
- inside, ``python -m gyre.harness.netbridge --listen 127.0.0.1:PORT --unix
  SOCK -- CMD...`` (stdlib only, started by bwrap) listens on the sandbox's
  loopback, pipes each connection to the unix socket, runs ``CMD`` as its
  child and exits with its status.

The harness keeps using ``http://127.0.0.1:PORT`` and can reach nothing else.
This module runs first in every proxy-only sandbox, before the harness, so it
imports only what it needs (no asyncio: that import alone was ~0.1-0.2 s of each
execution's start on a loaded 2-core machine; no subprocess either). The sandbox runs
it inside :mod:`gyre.harness.confine`'s interpreter (``confine.py --bridge-listen
HOST:PORT --bridge-unix SOCK -- CMD``: :func:`bridge_and_run`), not as a Python process of
its own, which saved one interpreter start per execution (docs/measurements.md,
"Around each execution"); ``python -m gyre.harness.netbridge`` still runs it alone.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

_BUF = 64 * 1024


# ---- inside the sandbox (stdlib only, threads) -----------------------------------------
def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            c, _ = listener.accept()
        except OSError:
            return
        try:
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(unix_path)
        except OSError:
            c.close()
            continue
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=_copy, args=(a, b), daemon=True).start()


def listen(address: str, unix_path: str) -> None:
    """Listen on ``HOST:PORT`` and pipe each connection to ``unix_path``, on a daemon thread."""
    host, _, port = address.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # close-on-exec
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    threading.Thread(target=_serve, args=(listener, unix_path), daemon=True).start()


def _which(name: str, env: dict[str, str]) -> str:
    """``name`` looked up on ``env``'s PATH (not this process's), as ``execvpe`` does."""
    if "/" in name:
        return name
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(2, "No such file or directory", name)


def run(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` as a child and return its status as ``subprocess.call`` does (-N: killed
    by signal N). SIGPIPE and SIGXFSZ are reset to their defaults in the child, as
    ``subprocess`` resets them (Python ignores both)."""
    try:
        pid = os.posix_spawn(
            _which(cmd[0], env), cmd, env, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
        )
    except OSError as e:
        print(f"netbridge: cannot start {cmd[:1]}: {e}", file=sys.stderr)
        return 127
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def bridge_and_run(address: str, unix_path: str, cmd: list[str], env: dict[str, str]) -> int:
    """The bridge on ``address``, then ``cmd`` with ``env``; ``cmd``'s exit status."""
    listen(address, unix_path)
    return run(cmd, env)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(
            "usage: python -m gyre.harness.netbridge --listen HOST:PORT --unix PATH -- CMD...",
            file=sys.stderr,
        )
        return 2
    i = args.index("--")
    opts, cmd = args[:i], args[i + 1 :]
    o = dict(zip(opts[::2], opts[1::2]))
    if not cmd:
        return 0
    return bridge_and_run(o["--listen"], o["--unix"], cmd, dict(os.environ))


if __name__ == "__main__":
    os.environ.pop("PYTHONINSPECT", None)
    sys.exit(main())
