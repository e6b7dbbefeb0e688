"""Soak: many executions through one proxy under a low fd limit (issue 13, item 5).

The proxy runs in its own process with RLIMIT_NOFILE set (``ulimit -n``) before
anything is imported; a null engine serves it. The driver runs N executions the
way the runtime does, ``--concurrency`` at a time: register a key (admin unix
socket), ``--calls`` chat calls that extend one conversation (the first with a
``--body-kb`` user message), revoke. Every ``--every`` executions it samples the
proxy's open fds (/proc/<pid>/fd), RSS (VmRSS) and the count of 5xx answers and
connection errors so far. Before the fix the proxy kept one trace file and one
execution state per execution forever: ~1000 executions under ``ulimit -n 1024``
ended in 500s (EMFILE) and reset connections.

    python bench/bench_proxy_soak.py                          # 10,000 executions, nofile 1024
    python bench/bench_proxy_soak.py --n 2000 --nofile 256    # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve(cfg_json: str, info: str, nofile: int) -> None:
    """Child process: the proxy under RLIMIT_NOFILE ``nofile``; its addresses go to ``info``."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import ProxyServer

    px = ProxyServer(ProxyConfig(**json.loads(cfg_json))).start()
    doc = {"url": px.url, "admin_socket": px.admin_socket, "token": px.admin_token}
    fd = os.open(info + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps({**doc, "pid": os.getpid()}).encode())
    os.close(fd)
    os.rename(info + ".tmp", info)
    sys.stdin.read()  # until the driver closes it
    px.stop()


def sample(pid: int) -> tuple[int, int]:
    """(open fds, RSS in KiB) of ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return fds, rss


async def drive(doc: dict, args: argparse.Namespace) -> dict:
    import httpx

    pid = doc["pid"]
    admin = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=doc["admin_socket"]),
        base_url="http://gyre-admin",
        headers={"authorization": f"Bearer {doc['token']}"},
        timeout=60,
    )
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=8)
    api = httpx.AsyncClient(base_url=doc["url"], timeout=60, limits=limits)
    pad = "lorem ipsum " * (args.body_kb * 1024 // 12)
    counts = {"ok": 0, "4xx": 0, "5xx": 0, "conn_errors": 0, "done": 0}
    rows: list[dict] = []
    t0 = time.monotonic()
    next_id = iter(range(args.n))

    async def one(i: int) -> None:
        eid = f"soak-{i:06d}"
        r = await admin.post("/admin/executions", json={"execution_id": eid, "label": "main"})
        key = r.json()["api_key"]
        msgs = [{"role": "user", "content": f"task {i}: {pad}"}]
        for _ in range(args.calls):
            try:
                r = await api.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": msgs, "max_tokens": 8},
                    headers={"authorization": f"Bearer {key}"},
                )
            except httpx.HTTPError:
                counts["conn_errors"] += 1
                break
            kind = "ok" if r.status_code == 200 else f"{r.status_code // 100}xx"
            counts[kind] = counts.get(kind, 0) + 1
            if r.status_code != 200:
                break
            msgs = msgs + [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
        if not args.no_revoke:
            await admin.delete(f"/admin/executions/{eid}")

    async def worker() -> None:
        for i in next_id:
            await one(i)
            counts["done"] += 1
            if counts["done"] % args.every == 0:
                fds, rss = sample(pid)
                rows.append(
                    {
                        "executions": counts["done"],
                        "fds": fds,
                        "rss_mb": round(rss / 1024, 1),
                        "5xx": counts["5xx"],
                        "conn_errors": counts["conn_errors"],
                        "s": round(time.monotonic() - t0, 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)

    fds0, rss0 = sample(pid)
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    stats = (await admin.get("/admin/stats")).json()
    await admin.aclose()
    await api.aclose()
    return {
        "n": args.n,
        "nofile": args.nofile,
        "concurrency": args.concurrency,
        "calls_per_execution": args.calls,
        "body_kb": args.body_kb,
        "revoked": not args.no_revoke,
        "start": {"fds": fds0, "rss_mb": round(rss0 / 1024, 1)},
        "samples": rows,
        "counts": counts,
        "proxy": {
            "executions_in_memory": stats["executions"],
            "open_trace_files": stats["open_trace_files"],
            "evicted_executions": stats["counters"]["evicted_executions"],
        },
        "seconds": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="executions")
    ap.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of the proxy")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--calls", type=int, default=2, help="chat calls per execution")
    ap.add_argument("--body-kb", type=int, default=16, help="size of the first user message")
    ap.add_argument("--every", type=int, default=500, help="sample every N executions")
    ap.add_argument("--no-revoke", action="store_true", help="never revoke (LRU/idle bound)")
    ap.add_argument("--model", default=None, help="tokenizer dir (default: build the tiny one)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/bench_proxy_soak.json"))
    args = ap.parse_args()

    from gyre.engine.app import create_app
    from gyre.engine.null import NullEngine
    from gyre.engine.runner import ServerRunner

    work = Path(tempfile.mkdtemp(prefix="gyre-soak-"))
    model = args.model
    if model is None:
        from gyre.models.tiny import build_tiny_model

        model = str(build_tiny_model(work / "tiny"))
    eng = ServerRunner(create_app(NullEngine()), name="null-engine").start()
    cfg = {
        "model_dir": model,
        "engines": [eng.url],
        "mode": "managed",
        "trace_dir": str(work / "traces"),
        "fsync": False,
        "max_context_tokens": 1 << 20,
    }
    info = work / "info.json"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", json.dumps(cfg), str(info), str(args.nofile)],
        stdin=subprocess.PIPE,
    )
    try:
        while not info.exists():
            if proc.poll() is not None:
                sys.exit(f"proxy exited with {proc.returncode} before it was ready")
            time.sleep(0.05)
        out = asyncio.run(drive(json.loads(info.read_text()), args))
    finally:
        proc.stdin.close()
        proc.wait(30)
        eng.stop()
    s = out["samples"]
    if s:
        first, last = s[0], s[-1]
        out["fds_min_max"] = [min(r["fds"] for r in s), max(r["fds"] for r in s)]
        out["rss_mb_first_last"] = [first["rss_mb"], last["rss_mb"]]
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
