"""The proxy dies and comes back (issue 20, item 5): killed the way a crash kills it (every client
connection cut mid-answer), restarted on the same address with the same trace directory, admin
socket and token. The official ``openai`` SDK retries the call the crash cut off; it completes,
continues its execution token-exactly (bridged on the call answered before the crash), and
every answered call is in the trace exactly once."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from helpers.servers import running_engine

from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer
from gyre.trace.store import read_trace

openai = pytest.importorskip("openai")


def _wait_inflight(px: ProxyServer, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.inflight for e in px.service.pool.engines.values()):
        assert time.monotonic() < deadline, "the call never reached the engine"
        time.sleep(0.005)


def test_sdk_call_cut_by_a_proxy_crash_completes_after_restart(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    traces = tmp_path / "traces"
    with running_engine(
        "null", str(tiny_model_dir), engine_id="N", token_delay_s=0.01, num_tokens=4000
    ) as eng:
        px = ProxyServer(
            ProxyConfig(
                model_dir=str(tiny_model_dir),
                engines=[eng.url],
                trace_dir=str(traces),
                mode="managed",
            ),
            tiny_tokenizer,
        ).start()
        try:
            url, admin_path = px.url, px.admin_socket
            admin = px.admin_client()
            key = admin.register("exec-1", label="main")
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=6)
            msgs = [{"role": "user", "content": "hi"}]
            first = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
            msgs2 = msgs + [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "go on"},
            ]
            got: dict = {}

            def second() -> None:  # ~2 s of generation: the crash comes in the middle
                try:
                    got["r"] = client.chat.completions.create(
                        model="m", messages=msgs2, max_tokens=200
                    )
                except BaseException as e:
                    got["e"] = e

            t = threading.Thread(target=second, daemon=True)
            t.start()
            _wait_inflight(px)
            time.sleep(0.3)
            px.kill()
            with pytest.raises(httpx.ConnectError):  # dead: the port refuses
                httpx.get(url + "/health", timeout=2)
            time.sleep(0.3)  # the SDK's first retry meets a refused connection
            t0 = time.monotonic()
            px.restart()
            took = time.monotonic() - t0
            t.join(60)
            assert "e" not in got, got.get("e")
            r = got["r"]
            assert px.url == url and px.admin_socket == admin_path and px.restarts == 1
            assert took < 10.0, took
            assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 200
            # the run's admin client (same socket, same token) still works: registrations kept
            assert admin.executions() == {"exec-1": "main"}
            assert admin.calls("exec-1")["answered"] == 2
            # an SDK retry of the call answered before the crash is a replay, not a new sample
            with httpx.Client() as h:
                again = h.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": msgs, "max_tokens": 8},
                    headers={"authorization": f"Bearer {key}", "x-stainless-retry-count": "1"},
                    timeout=30,
                )
            assert again.status_code == 200
            replayed = again.json()["choices"][0]["message"]["content"]
            assert replayed == first.choices[0].message.content
            assert px.service.counters.retries_replayed == 1
            admin.close()
        finally:
            px.stop()
    recs = read_trace(traces / "exec-1.jsonl").records
    answered = [x for x in recs if x.finish_reason != "abort"]
    assert [x.seq for x in recs] == list(range(len(recs)))  # one numbering across the restart
    assert len(answered) == 2, [(x.seq, x.finish_reason, x.meta.get("bridge")) for x in recs]
    a, b = answered
    assert a.request_id in first.id and b.request_id in r.id
    # the retried call continues the execution token-exactly: bridged on the call answered
    # before the crash, its prompt that call's input + output verbatim
    assert b.base == a.request_id and b.meta["bridge"] == "continuation"
    assert b.base_len == len(a.input_suffix) + len(a.output_ids)


def test_restart_after_a_clean_stop_keeps_the_pool_as_it_was(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """Engines added and removed while it ran are the restarted proxy's pool, not the config's."""
    with (
        running_engine("null", str(tiny_model_dir), engine_id="A") as a,
        running_engine("null", str(tiny_model_dir), engine_id="B") as b,
    ):
        cfg = ProxyConfig(model_dir=str(tiny_model_dir), engines=[a.url], trace_dir=str(tmp_path))
        px = ProxyServer(cfg, tiny_tokenizer).start()
        try:
            px.add_engine(b.url)
            px.remove_engine(a.url)
            port = px.port
            px.stop()
            px.restart()
            assert px.port == port
            assert [e["url"] for e in px.service.pool.status()] == [b.url]
            r = httpx.post(
                px.url + "/v1/chat/completions",
                json={
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "x"}],
                },
                headers={"authorization": "Bearer k"},
                timeout=30,
            )
            assert r.status_code == 200
        finally:
            px.stop()


def test_a_crash_while_the_trace_record_is_written_keeps_one_record(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """The crash lands between the answer's generation and the end of its trace write (fsync
    under way in a thread): the record reaches the disk, so the counters and the retry window
    must know of it; the SDK's retry is a replay, and the trace holds the call once."""
    traces = tmp_path / "traces"
    with running_engine("null", str(tiny_model_dir), engine_id="N") as eng:
        px = ProxyServer(
            ProxyConfig(model_dir=str(tiny_model_dir), engines=[eng.url], trace_dir=str(traces)),
            tiny_tokenizer,
        ).start()
        try:
            writing = threading.Event()
            real = px.service.writer.append

            def slow_append(rec):  # the crash comes while this thread writes
                writing.set()
                time.sleep(0.8)
                real(rec)

            px.service.writer.append = slow_append
            client = openai.OpenAI(base_url=px.url + "/v1", api_key="k", max_retries=6)
            got: dict = {}

            def call() -> None:
                try:
                    got["r"] = client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
                    )
                except BaseException as e:
                    got["e"] = e

            t = threading.Thread(target=call, daemon=True)
            t.start()
            assert writing.wait(30), "the call never reached its trace write"
            px.kill()
            px.restart()
            t.join(60)
            assert "e" not in got, got.get("e")
            assert px.service.counters.retries_replayed == 1
            assert px.service.counters.answered == 1
        finally:
            px.stop()
    (path,) = traces.glob("*.jsonl")
    recs = read_trace(path).records
    assert [x.finish_reason for x in recs] == ["length"], [(x.seq, x.finish_reason) for x in recs]
    assert recs[0].request_id in got["r"].id
