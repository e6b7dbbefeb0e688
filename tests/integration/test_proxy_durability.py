"""Issue 13 item 4: every call the proxy answers is in the trace.

* a torn last line (a crash mid-write) is cut off before the next record is appended;
* a full disk (a real ENOSPC on a 64 KiB tmpfs) answers 507, never a 200 it did not record;
* kill -9 of the proxy process twenty times under load: every call a client saw
  answered (200 with its request id) is in its execution's trace.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gyre.engine.app import create_app
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer
from gyre.trace import OutputSegment, TraceRecord, TraceWriter, read_trace, trace_path
from gyre.trace.store import torn_path

PROC = str(Path(__file__).with_name("proxy_process.py"))


def open_id(key: str) -> str:
    return "open-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def chat(url: str, key: str, text: str, stream: bool = False, timeout: float = 30):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    if stream:
        body["stream"] = True
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=timeout,
    )


@pytest.fixture
def engine():
    eng = ServerRunner(create_app(NullEngine()), name="null-engine").start()
    yield eng
    eng.stop()


def proxy(tiny_model_dir, tiny_tokenizer, engine, trace_dir, **kw) -> ProxyServer:
    cfg = ProxyConfig(
        model_dir=str(tiny_model_dir), engines=[engine.url], trace_dir=str(trace_dir), **kw
    )
    return ProxyServer(cfg, tiny_tokenizer).start()


def test_torn_tail_does_not_swallow_the_next_answered_call(
    tiny_model_dir, tiny_tokenizer, engine, tmp_path
):
    key = "tear-key"
    ex = open_id(key)
    w = TraceWriter(tmp_path)
    w.append(
        TraceRecord(
            execution_id=ex,
            request_id="before",
            seq=0,
            api="openai.chat",
            base=None,
            base_len=0,
            input_suffix=(1, 2),
            output_ids=(3,),
            output_logprobs=(-0.1,),
            segments=(OutputSegment(0, 1, "e0", 0),),
        )
    )
    w.close()
    path = trace_path(tmp_path, ex)
    with open(path, "a") as f:  # the proxy died while writing the next record
        f.write('{"format":1,"execution_id":"' + ex + '","request_id":"torn","seq":1,"outp')
    px = proxy(tiny_model_dir, tiny_tokenizer, engine, tmp_path)
    try:
        r = chat(px.url, key, "after the crash")
        assert r.status_code == 200
        rid = r.headers["x-gyre-request-id"]
    finally:
        px.stop()
    res = read_trace(path)
    assert res.errors == []
    assert [(x.request_id, x.seq) for x in res.records] == [("before", 0), (rid, 1)]
    assert b'"request_id":"torn"' in torn_path(path).read_bytes()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {r.stderr.decode()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_answers_507_and_never_an_unrecorded_200(
    tiny_model_dir, tiny_tokenizer, engine, tiny_tmpfs
):
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"x" * (24 << 10))  # removed later to free space
    px = proxy(tiny_model_dir, tiny_tokenizer, engine, tiny_tmpfs / "traces", fsync=True)
    key = "disk-key"
    answered, refused = [], []
    try:
        for i in range(400):
            r = chat(px.url, key, f"call {i} " + "pad " * 50)
            if r.status_code == 200:
                answered.append(r.headers["x-gyre-request-id"])
            else:
                assert r.status_code == 507, r.text
                assert r.json()["error"]["type"] == "server_error"
                refused.append(i)
                if len(refused) >= 3:
                    break
        assert answered and len(refused) == 3, "the disk never filled up"
        s = chat(px.url, key, "streamed 999 " + "pad " * 50, stream=True)  # as big as refused
        # refused before the first byte (a plain 507), or mid-stream: an error event, no [DONE]
        assert s.status_code == 507 or (b"[DONE]" not in s.content and b"error" in s.content)
        filler.unlink()  # space again: calls are answered and recorded again
        for i in range(3):
            r = chat(px.url, key, f"after {i}")
            assert r.status_code == 200, r.text
            answered.append(r.headers["x-gyre-request-id"])
    finally:
        px.stop()
    res = read_trace(trace_path(tiny_tmpfs / "traces", open_id(key)))
    assert res.errors == []
    recorded = [x.request_id for x in res.records]
    assert [a for a in answered if a not in recorded] == []  # answered but missing: 0
    seqs = [x.seq for x in res.records]
    assert len(seqs) == len(set(seqs))


@pytest.mark.slow
def test_kill9_twenty_times_under_load_loses_no_answered_call(engine, tiny_model_dir, tmp_path):
    traces = tmp_path / "traces"
    keys = [f"load-{i}" for i in range(4)]
    answered: dict[str, list[str]] = {k: [] for k in keys}
    port = [0]
    stop = threading.Event()
    errors: list[str] = []

    def load(key: str) -> None:
        n = 0
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                if not port[0]:
                    time.sleep(0.01)
                    continue
                n += 1
                body = {"model": "m", "messages": [{"role": "user", "content": f"{key} {n}"}]}
                try:
                    r = http.post(
                        f"http://127.0.0.1:{port[0]}/v1/chat/completions",
                        json={**body, "max_tokens": 4},
                        headers={"authorization": f"Bearer {key}"},
                    )
                except httpx.HTTPError:
                    time.sleep(0.02)  # the proxy is down (killed): try again
                    continue
                if r.status_code == 200:
                    answered[key].append(r.headers["x-gyre-request-id"])
                else:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    zygote = subprocess.Popen(
        [sys.executable, PROC, "--zygote"], stdin=subprocess.PIPE, text=True, cwd=tmp_path
    )
    threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in keys]
    for t in threads:
        t.start()
    cfg = {
        "model_dir": str(tiny_model_dir),
        "engines": [engine.url],
        "trace_dir": str(traces),
        "fsync": False,
    }
    rng = random.Random(0)
    kills = 0
    try:
        for i in range(21):
            info = tmp_path / f"info{i}"
            zygote.stdin.write(json.dumps({"config": cfg, "info": str(info)}) + "\n")
            zygote.stdin.flush()
            deadline = time.monotonic() + 120
            while not info.exists():
                assert time.monotonic() < deadline, "proxy did not start"
                assert zygote.poll() is None, "zygote died"
                time.sleep(0.02)
            doc = json.loads(info.read_text())
            cfg["port"] = int(doc["url"].rsplit(":", 1)[1])  # restart on the same port
            port[0] = cfg["port"]
            before = sum(map(len, answered.values()))
            time.sleep(rng.uniform(0.3, 1.0))
            if i == 20:  # the last one lives: let every client get a call through it
                time.sleep(1.0)
                break
            os.kill(doc["pid"], signal.SIGKILL)
            kills += 1
            assert sum(map(len, answered.values())) > before, "no call got through"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        zygote.stdin.close()
        zygote.wait(30)
        if "doc" in locals():
            with_pid = doc["pid"]
            try:
                os.kill(with_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert kills == 20
    assert errors == []
    missing, total = 0, 0
    for key in keys:
        res = read_trace(trace_path(traces, open_id(key)))
        recorded = {r.request_id for r in res.records}
        total += len(answered[key])
        missing += sum(1 for a in answered[key] if a not in recorded)
        seqs = [r.seq for r in res.records]
        assert len(seqs) == len(set(seqs))
    print(f"kill -9 x{kills}: {total} answered calls, missing from traces: {missing}")
    assert total > 100 and missing == 0
