"""Engine health in the proxy's pool (issue 20, item 2): engine processes killed (SIGKILL) and
frozen (SIGSTOP) mid-stream are found by the heartbeat, leave routing, and the calls they held
finish on the remaining engine with the tokens generated so far; a frozen one that resumes
comes back.

Engines are real ``gyre engine`` processes on loopback (null engines, and embedded ones with the
tiny model for the token-exact case). The in-request probes and read timeouts are switched off,
so only the heartbeat can rescue a call held by a frozen engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gyre.ports import free_ports
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer
from gyre.trace.store import read_trace

GYRE = str(Path(sys.executable).parent / "gyre")
SLOW_NULL = (  # a null engine whose stream takes 10 ms a token (gyre engine has no flag for it)
    "import sys, uvicorn; from gyre.engine.app import create_app; "
    "from gyre.engine.config import NullEngineConfig; from gyre.engine.null import NullEngine; "
    "uvicorn.run(create_app(NullEngine(NullEngineConfig(engine_id=sys.argv[2], "
    "token_delay_s=0.01, num_tokens=4000))), host='127.0.0.1', port=int(sys.argv[1]), "
    "log_level='warning')"
)
HEARTBEAT = dict(  # the heartbeat alone: no per-call probe, no read timeouts
    engine_heartbeat_s=0.2,
    engine_lost_after_s=1.0,
    engine_probe_after_s=None,
    engine_first_byte_timeout_s=None,
    engine_idle_timeout_s=None,
    fsync=False,
)


def spawn_engines(*argv: list[str], timeout: float = 180.0) -> list[tuple[subprocess.Popen, str]]:
    """Start ``gyre engine`` processes (one per argv) and wait until each answers."""
    out = []
    for args, port in zip(argv, free_ports(len(argv))):
        cmd = (
            [sys.executable, "-c", SLOW_NULL, str(port), args[1]]
            if args[0] == "slow-null"
            else [GYRE, "engine", "--port", str(port), *args]
        )
        p = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out.append((p, f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + timeout
    for p, url in out:
        while True:
            try:
                if httpx.get(url + "/get_model_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                stop_engines(out)
                raise AssertionError(f"engine {url} did not start")
            time.sleep(0.2)
    return out


def stop_engines(engines: list[tuple[subprocess.Popen, str]]) -> None:
    for p, _ in engines:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(10)


def open_id(key: str) -> str:
    return "open-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class Events:
    """The pool's lost/back events, with the monotonic time each arrived."""

    def __init__(self, px: ProxyServer) -> None:
        self.seen: list[tuple[float, object]] = []
        px.on_engine_event(lambda ev: self.seen.append((time.monotonic(), ev)))

    def at(self, kind: str, url: str) -> float | None:
        return next(
            (t for t, ev in self.seen if ev.kind == kind and ev.url == url),  # type: ignore[attr-defined]
            None,
        )

    def wait(self, kind: str, url: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while (t := self.at(kind, url)) is None:
            assert time.monotonic() < deadline, f"no {kind} event for {url}: {self.seen}"
            time.sleep(0.02)
        return t


class Streamer(threading.Thread):
    """One streamed chat call in a thread: the SSE chunks as they come."""

    def __init__(self, url: str, key: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.body = url, key, body
        self.chunks: list[dict] = []
        self.status = 0
        self.done_marker = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                self.url + "/v1/chat/completions",
                json={**self.body, "stream": True},
                headers={"authorization": f"Bearer {self.key}"},
                timeout=120,
            ) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done_marker = True
                    elif line.startswith("data: "):
                        self.chunks.append(json.loads(line[6:]))
        except BaseException as e:
            self.error = e

    def text(self) -> str:
        return "".join(
            c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c["choices"]
        )


def _post(url: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def _wait_chunks(streams: list[Streamer], n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while min(len(s.chunks) for s in streams) < n:
        assert time.monotonic() < deadline, [len(s.chunks) for s in streams]
        assert all(s.is_alive() for s in streams), [
            (s.error, s.status, len(s.chunks)) for s in streams
        ]
        time.sleep(0.005)


def _kill_and_freeze(a, b) -> tuple[float, float]:
    os.kill(a.pid, signal.SIGKILL)
    t_kill = time.monotonic()
    os.kill(b.pid, signal.SIGSTOP)
    return t_kill, time.monotonic()


def test_killed_and_frozen_null_engines_are_lost_and_their_calls_move(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    engines = spawn_engines(["slow-null", "A"], ["slow-null", "B"], ["slow-null", "C"])
    (pa, ua), (pb, ub), (_, uc) = engines
    try:
        cfg = ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[ua, ub, uc],
            trace_dir=str(tmp_path),
            **HEARTBEAT,
        )
        with ProxyServer(cfg, tiny_tokenizer) as px:
            events = Events(px)
            pool = px.service.pool
            pool.affinity[open_id("ka")] = ua
            pool.affinity[open_id("kb")] = ub
            body = {
                "model": "m",
                "max_tokens": 300,
                "messages": [{"role": "user", "content": "hi"}],
            }
            pool.affinity[open_id("kp")] = ub
            streams = [Streamer(px.url, "ka", body), Streamer(px.url, "kb", body)]
            for s in streams:
                s.start()
            plain: dict = {}  # a non-streamed call held by the engine that freezes
            waiter = threading.Thread(
                target=lambda: plain.update(r=_post(px.url, "kp", body)), daemon=True
            )
            waiter.start()
            _wait_chunks(streams, 5)
            deadline = time.monotonic() + 30
            while len(pool.engines[ub].inflight) < 2:  # the stream and the plain call
                assert time.monotonic() < deadline
                time.sleep(0.005)
            t_kill, t_stop = _kill_and_freeze(pa, pb)
            for s in streams:
                s.join(60)
                assert s.error is None and s.status == 200 and s.done_marker, s.error
            waiter.join(60)
            assert plain["r"].status_code == 200, plain
            (rec,) = read_trace(tmp_path / f"{open_id('kp')}.jsonl").records
            assert len(rec.output_ids) == 300 and [s.engine_id for s in rec.segments] == ["C"]
            lost_a = events.wait("lost", ua, 10) - t_kill
            lost_b = events.wait("lost", ub, 10) - t_stop
            print(
                f"detection: killed {lost_a:.2f} s, frozen {lost_b:.2f} s (lost_after 1.0, beat 0.2)"
            )
            assert lost_a < 6.0 and lost_b < 6.0  # bound: lost_after + beat, generous under load
            states = {e["url"]: e["state"] for e in pool.status()}
            assert states == {ua: "lost", ub: "lost", uc: "active"}
            for key, url, eid in (("ka", ua, "A"), ("kb", ub, "B")):
                (rec,) = read_trace(tmp_path / f"{open_id(key)}.jsonl").records
                assert len(rec.output_ids) == 300 and rec.finish_reason == "length"
                assert [s.engine_id for s in rec.segments] == [eid, "C"], rec.segments
                moved_at = rec.segments[0].end
                assert 5 <= moved_at < 300  # the lost engine's tokens kept, the rest from C
            assert pool.counters.engines_lost == 2
            os.kill(pb.pid, signal.SIGCONT)  # the frozen one resumes: it comes back
            t_cont = time.monotonic()
            back_b = events.wait("back", ub, 10) - t_cont
            assert back_b < 5.0
            assert {e["url"]: e["state"] for e in pool.status()}[ub] == "active"
            assert events.at("back", ua) is None  # the killed one stays lost
            r = httpx.post(
                px.url + "/v1/chat/completions",
                json={**body, "max_tokens": 4},
                headers={"authorization": "Bearer kc"},
                timeout=30,
            )
            assert r.status_code == 200
    finally:
        stop_engines(engines)


@pytest.mark.slow
async def test_killed_and_frozen_embedded_engines_resume_token_exactly(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """Real model, greedy: both calls finish on the third engine with exactly the output of an
    undisturbed call, each keeping the tokens its lost engine produced."""
    import openai

    emb = ["--kind", "embedded", "--model", str(tiny_model_dir), "--torch-threads", "1"]
    engines = spawn_engines(*(emb + ["--engine-id", f"E{i}"] for i in (1, 2, 3)))
    (p1, u1), (p2, u2), (_, u3) = engines
    try:
        cfg = ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[u1, u2, u3],
            trace_dir=str(tmp_path),
            **{**HEARTBEAT, "engine_lost_after_s": 2.0},
        )
        with ProxyServer(cfg, tiny_tokenizer) as px:
            events = Events(px)
            pool = px.service.pool
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "def main():"}],
                "max_tokens": 200,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            c = openai.AsyncOpenAI(base_url=px.url + "/v1", api_key="ref", max_retries=0)
            kw = {k: v for k, v in body.items() if k != "ignore_eos"}
            ref = await c.chat.completions.create(**kw, extra_body={"ignore_eos": True})
            await c.close()
            pool.affinity[open_id("k1")] = u1
            pool.affinity[open_id("k2")] = u2
            streams = [Streamer(px.url, "k1", body), Streamer(px.url, "k2", body)]
            for s in streams:
                s.start()
            await asyncio.to_thread(_wait_chunks, streams, 10)
            t_kill, t_stop = _kill_and_freeze(p1, p2)
            for s in streams:
                await asyncio.to_thread(s.join, 120)
                assert s.error is None and s.status == 200 and s.done_marker, s.error
                assert s.text() == ref.choices[0].message.content
            lost1 = await asyncio.to_thread(events.wait, "lost", u1, 20)
            lost2 = await asyncio.to_thread(events.wait, "lost", u2, 20)
            print(
                f"detection: killed {lost1 - t_kill:.2f} s, frozen {lost2 - t_stop:.2f} s "
                "(lost_after 2.0, beat 0.2)"
            )
            assert lost1 - t_kill < 10.0 and lost2 - t_stop < 10.0
        ref_rec = read_trace(tmp_path / f"{open_id('ref')}.jsonl").records[0]
        for key, eid in (("k1", "E1"), ("k2", "E2")):
            (rec,) = read_trace(tmp_path / f"{open_id(key)}.jsonl").records
            assert rec.output_ids == ref_rec.output_ids  # token-exact across the move
            assert [s.engine_id for s in rec.segments] == [eid, "E3"], rec.segments
            assert 10 <= rec.segments[0].end < 200
    finally:
        stop_engines(engines)
