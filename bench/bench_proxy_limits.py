"""Huge prompts: what a body the proxy must refuse costs it (issue 13, item 6).

For each body size a fresh ``gyre proxy`` process (null engine behind it) gets one
request whose single user message is N MB of words, far beyond the context. Reported:
the status, the wall time, and the proxy's peak RSS growth (VmHWM after - VmRSS before)
per MB of body. A watchdog kills the proxy above ``--rss-cap-gb`` (the old proxy used
~200x the body size), so the bench cannot take the shared machine down.

    python bench/bench_proxy_limits.py                  # 1, 20, 50 MB, default limits
    python bench/bench_proxy_limits.py --sizes 1 20 --max-context 4000000
    python bench/bench_proxy_limits.py --sizes 5 --where tool-desc reasoning think many-tools

``--where`` puts the text elsewhere than a user message (issue 37, finding 4): a tool's
description, an earlier turn's reasoning or ``<think>`` text, or 20,000 small tools.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gyre.ports import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import GYRE, wait_http


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


WHERE = ("user", "tool-desc", "reasoning", "think", "thinking", "many-tools")
"""Where the text goes: one user message; one tool's description; an earlier assistant turn's
reasoning (OpenAI ``reasoning_content``, Anthropic ``thinking`` block); its ``<think>`` text; or
20,000 small tools (``mb`` ignored)."""


def body_of(mb: float, dialect: str, where: str = "user") -> bytes:
    words = ("alpha beta gamma delta file path read write test error value return " * 1).split()
    unit = " ".join(words) + " "
    text = unit * int(mb * (1 << 20) / len(unit))
    an = dialect == "anthropic"
    body: dict = {"model": "m", "max_tokens": 16}
    msgs: list[dict] = [{"role": "user", "content": text if where == "user" else "hi"}]
    if where in ("reasoning", "think", "thinking"):
        if where == "think":
            turn: dict = {"role": "assistant", "content": f"<think>{text}</think>ok"}
        elif an:
            thinking = {"type": "thinking", "thinking": text, "signature": "s"}
            turn = {"role": "assistant", "content": [thinking, {"type": "text", "text": "ok"}]}
        else:
            turn = {"role": "assistant", "content": "ok", "reasoning_content": text}
        msgs += [turn, {"role": "user", "content": "again"}]
    if where in ("tool-desc", "many-tools"):
        n = 20000 if where == "many-tools" else 1
        desc = text if where == "tool-desc" else "Run a command"
        schema = {"type": "object", "properties": {"command": {"type": "string"}}}
        body["tools"] = [
            {"name": f"t{i}", "description": desc, "input_schema": schema}
            if an
            else {
                "type": "function",
                "function": {"name": f"t{i}", "description": desc, "parameters": schema},
            }
            for i in range(n)
        ]
    body["messages"] = msgs
    return json.dumps(body).encode()


def one(
    model_dir: str, mb: float, dialect: str, args: argparse.Namespace, where: str = "user"
) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    work = tempfile.mkdtemp(prefix="gyre-limits-")
    eport, pport = free_ports(2)
    engine = subprocess.Popen(
        [GYRE, "engine", "--kind", "null", "--port", str(eport)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cmd = [GYRE, "proxy", "--model", model_dir, "--engine", f"http://127.0.0.1:{eport}"]
    cmd += ["--port", str(pport), "--trace-dir", work, "--no-fsync"]
    if args.max_context:
        cmd += ["--max-context", str(args.max_context)]
    if args.max_body_mb:
        cmd += ["--max-body-mb", str(args.max_body_mb)]
    proxy = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = threading.Event()
    try:
        wait_http(f"http://127.0.0.1:{eport}/health")
        wait_http(f"http://127.0.0.1:{pport}/health")
        body = body_of(mb, dialect, where)
        rss0 = _kb(proxy.pid, "VmRSS")

        def watch() -> None:
            while proxy.poll() is None:
                try:
                    if _kb(proxy.pid, "VmRSS") > args.rss_cap_gb * (1 << 20):
                        killed.set()
                        proxy.send_signal(signal.SIGKILL)
                        return
                except OSError:
                    return
                time.sleep(0.05)

        threading.Thread(target=watch, daemon=True).start()
        path = "/v1/messages" if dialect == "anthropic" else "/v1/chat/completions"
        t0 = time.monotonic()
        try:
            r = httpx.post(
                f"http://127.0.0.1:{pport}{path}",
                content=body,
                headers={"authorization": "Bearer k", "content-type": "application/json"},
                timeout=600,
            )
            status, msg = r.status_code, r.text[:160]
        except httpx.HTTPError as e:
            status, msg = -1, f"{type(e).__name__}"
        dt = time.monotonic() - t0
        hwm = _kb(proxy.pid, "VmHWM") if proxy.poll() is None else -1
        grow_mb = (hwm - rss0) / 1024 if hwm > 0 else float("nan")
        body_mb = len(body) / (1 << 20)
        return {
            "body_mb": round(body_mb, 1),
            "dialect": dialect,
            "where": where,
            "status": status,
            "seconds": round(dt, 2),
            "rss_before_mb": round(rss0 / 1024),
            "peak_growth_mb": round(grow_mb, 1),
            "growth_per_body_mb": round(grow_mb / body_mb, 2),
            "killed_at_cap": killed.is_set(),
            "message": msg,
        }
    finally:
        for p in (proxy, engine):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 20, 50])
    ap.add_argument("--dialect", choices=["openai", "anthropic"], default="openai")
    ap.add_argument("--where", choices=WHERE, nargs="+", default=["user"])
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--max-body-mb", type=int, default=None)
    ap.add_argument("--rss-cap-gb", type=float, default=6.0)
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    model_dir = args.model_dir
    if model_dir is None:
        from gyre.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="gyre-tiny-"))))
    for where in args.where:
        for mb in args.sizes if where != "many-tools" else args.sizes[:1]:
            print(json.dumps(one(model_dir, mb, args.dialect, args, where)), flush=True)


if __name__ == "__main__":
    main()
