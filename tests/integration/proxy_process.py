"""Run ProxyServers in processes of their own (kill -9 and soak tests, the soak bench).

    python tests/integration/proxy_process.py '<ProxyConfig JSON>' INFO_PATH [NOFILE[:soft]]
    python tests/integration/proxy_process.py --zygote     # one config JSON + info path per line

One-shot: sets RLIMIT_NOFILE to NOFILE first (when given), starts the proxy,
writes ``{"url", "admin_socket", "token", "pid"}`` to INFO_PATH (mode 0600,
renamed into place so a reader never sees half of it) and serves until stdin
closes. Zygote: imports the proxy and loads the tokenizer once, then forks a
fresh proxy process per input line (``{"config": {...}, "info": path}``), so a
test can SIGKILL and restart a proxy twenty times without paying ~15 s of
imports each time on a loaded machine.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys


def _serve(cfg: dict, info: str, tokenizer=None, wait_stdin: bool = True) -> None:
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import ProxyServer

    if cfg.get("admin_socket") is None:
        cfg = {**cfg, "admin_socket": _admin_beside(info)}
    px = ProxyServer(ProxyConfig(**cfg), tokenizer).start()
    doc = {"url": px.url, "admin_socket": px.admin_socket, "token": px.admin_token}
    doc["pid"] = os.getpid()
    fd = os.open(info + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps(doc).encode())
    os.close(fd)
    os.rename(info + ".tmp", info)
    if wait_stdin:
        sys.stdin.read()
        px.stop()
    else:
        signal.pause()  # until killed


def _admin_beside(info: str) -> str | None:
    """The admin socket next to INFO_PATH when that folder is private (a test's tmp_path), so a
    proxy killed with -9 leaves its socket there, not a ``gyre-admin-*`` folder in /tmp (twenty
    per kill test, before); None (a fresh private temp folder) otherwise."""
    folder = os.path.dirname(os.path.abspath(info))
    st = os.stat(folder)
    path = os.path.join(folder, os.path.basename(info) + ".admin.sock")
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or len(os.fsencode(path)) > 100:
        return None
    return path


def zygote() -> None:
    from transformers import AutoTokenizer

    import gyre.proxy.runner  # noqa: F401  (imported once, before any fork)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped automatically
    toks: dict[str, object] = {}
    for line in sys.stdin:
        req = json.loads(line)
        cfg = req["config"]
        tok = toks.get(cfg["model_dir"])
        if tok is None:
            tok = toks[cfg["model_dir"]] = AutoTokenizer.from_pretrained(cfg["model_dir"])
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _serve(cfg, req["info"], tok, wait_stdin=False)
            finally:
                os._exit(0)


def main() -> None:
    if sys.argv[1] == "--zygote":
        zygote()
        return
    cfg, info = json.loads(sys.argv[1]), sys.argv[2]
    if len(sys.argv) > 3:  # "N": soft and hard; "N:soft": the soft limit only
        n_text, _, which = sys.argv[3].partition(":")
        n = int(n_text)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if which == "soft" else n
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    _serve(cfg, info)


if __name__ == "__main__":
    main()
