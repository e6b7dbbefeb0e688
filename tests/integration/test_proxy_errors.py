"""Bad input, identity, retries, disconnects: API-shaped 4xx, never a 500, never a lost/corrupt trace."""

import asyncio
import json
import time

import httpx
import pytest
from helpers.servers import running_engine, running_proxy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.proxy import ProxyAdminClient
from gyre.trace.store import read_trace, trace_path

TURNS = [{"text": "Hello there, this is a scripted answer that takes a while to stream out. " * 10}]
OA = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
AN = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def env(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    with (
        running_engine("scripted", tiny_model_dir, turns=TURNS, token_delay_s=0.02) as eng,
        running_proxy(
            tiny_model_dir,
            [eng.url],
            traces,
            tiny_tokenizer,
            fsync=False,
            mode="managed",
            admin_token="admin-secret",
            max_body_bytes=200 << 20,
            max_context_tokens=4096,
        ) as px,
    ):
        admin = ProxyAdminClient(px.admin_socket, "admin-secret")
        keys = {name: admin.register(f"exec-{name}", label=name) for name in ("a", "b", "c", "d")}
        yield px, traces, keys, admin, eng


def post(px, path, body, key, raw=None, headers=None, timeout=60):
    h = {"authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})}
    return httpx.post(
        px.url + path,
        content=raw if raw is not None else json.dumps(body),
        headers=h,
        timeout=timeout,
    )


def _check_openai_error(r, status):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["type"]


def _check_anthropic_error(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]


def test_bad_input_list(env):
    px, traces, keys, _, _ = env
    k = keys["a"]
    _check_openai_error(post(px, "/v1/chat/completions", None, k, raw=b"{not json"), 400)
    _check_anthropic_error(post(px, "/v1/messages", None, k, raw=b'{"model": '), 400)
    _check_openai_error(post(px, "/v1/chat/completions", {"model": "m", "messages": "hi"}, k), 400)
    _check_openai_error(post(px, "/v1/chat/completions", {"model": "m"}, k), 400)
    _check_anthropic_error(post(px, "/v1/messages", {"model": "m", "messages": []}, k), 400)
    _check_openai_error(post(px, "/v1/chat/completions", {**OA, "n": 3}, k), 400)
    _check_openai_error(post(px, "/v1/responses", None, k, raw=b"{not json"), 400)
    _check_openai_error(post(px, "/v1/responses", {"model": "m", "input": {}}, k), 400)
    _check_openai_error(post(px, "/v1/chat/completions", {**OA, "temperature": "hot"}, k), 400)
    huge = "word " * 6000  # > max_context_tokens=4096
    r = post(
        px,
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": huge}]},
        k,
    )
    _check_openai_error(r, 400)
    assert r.json()["error"]["code"] == "context_length_exceeded"
    _check_anthropic_error(
        post(px, "/v1/messages", {**AN, "messages": [{"role": "user", "content": huge}]}, k), 400
    )
    # unknown key (managed mode) and missing key
    _check_openai_error(post(px, "/v1/chat/completions", OA, "not-registered"), 401)
    _check_anthropic_error(httpx.post(px.url + "/v1/messages?beta=true", json=AN), 401)
    # oversized body (limit 200 MB): refused with the API's 413 before anything is recorded
    _check_openai_error(
        post(px, "/v1/chat/completions", None, k, raw=b" " * ((200 << 20) + 10)), 413
    )
    # unknown route / method: JSON errors too
    assert httpx.get(px.url + "/v1/nothing").json()["error"]
    assert not (traces / "exec-a.jsonl").exists()  # none of the above wrote a record


def test_unknown_fields_and_huge_bodies_are_accepted(env):
    px, traces, keys, _, _ = env
    big = "x" * (120 << 20)  # 120 MB of a field the proxy ignores
    body = {
        **AN,
        "thinking": {"type": "enabled", "budget_tokens": 5},
        "context_management": {"edits": []},
        "output_config": {"effort": "low"},
        "metadata": {"blob": big},
    }
    r = post(
        px, "/v1/messages?beta=true", body, keys["b"], headers={"anthropic-beta": "x"}, timeout=120
    )
    assert r.status_code == 200, r.text[:300]
    tool_out = (
        "line of tool output\n" * 500
    )  # a 10 KB tool result (rendered; the context limit here is 4096)
    body = {
        **OA,
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "run it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": tool_out},
        ],
    }
    r = post(px, "/v1/chat/completions", body, keys["b"])
    assert r.status_code == 200, r.text[:300]
    recs = read_trace(trace_path(traces, "exec-b")).records
    assert len(recs) == 2 and recs[0].meta["key_label"] == "b"


def test_each_key_writes_only_its_own_execution(env):
    px, traces, keys, admin, _ = env
    for name in ("c", "d"):
        assert (
            post(
                px, "/v1/chat/completions", {**OA, "model": f"model-{name}"}, keys[name]
            ).status_code
            == 200
        )
    for name in ("c", "d"):
        recs = read_trace(trace_path(traces, f"exec-{name}")).records
        assert [r.meta["model"] for r in recs] == [f"model-{name}"]
        assert all(r.execution_id == f"exec-{name}" for r in recs)
    admin.revoke("exec-d")
    _check_openai_error(post(px, "/v1/chat/completions", OA, keys["d"]), 401)
    assert "exec-d" not in admin.executions()
    # admin routes are not on the API port at all, even with the admin token
    for auth in (keys["a"], "admin-secret"):
        r = httpx.post(
            px.url + "/admin/executions",
            json={"execution_id": "x"},
            headers={"authorization": f"Bearer {auth}"},
        )
        assert r.status_code == 404
    # on the admin socket they still need the admin token
    assert ProxyAdminClient(px.admin_socket, keys["a"])._http.get("/admin/stats").status_code == 401


def test_sdk_retry_is_replayed_or_coalesced_not_resampled(env):
    px, traces, keys, _, _ = env
    k = keys["c"]
    body = {**OA, "messages": [{"role": "user", "content": "retry me"}]}
    path = trace_path(traces, "exec-c")
    n0 = len(read_trace(path).records) if path.exists() else 0

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            h = {"authorization": f"Bearer {k}"}
            first = asyncio.create_task(
                c.post(px.url + "/v1/chat/completions", json=body, headers=h)
            )
            await asyncio.sleep(0.3)  # the original is still streaming out of the slow engine
            retry = await c.post(
                px.url + "/v1/chat/completions",
                json=body,
                headers={**h, "x-stainless-retry-count": "1"},
            )
            first = await first
            later = await c.post(
                px.url + "/v1/chat/completions",
                json=body,
                headers={**h, "x-stainless-retry-count": "2"},
            )
            return first, retry, later

    first, retry, later = asyncio.run(go())
    assert first.status_code == retry.status_code == later.status_code == 200
    text = first.json()["choices"][0]["message"]["content"]
    assert (
        retry.json()["choices"][0]["message"]["content"]
        == text
        == later.json()["choices"][0]["message"]["content"]
    )
    assert len(read_trace(trace_path(traces, "exec-c")).records) == n0 + 1  # one sample, one record
    stats = px.service.counters
    assert stats.retries_coalesced >= 1 and stats.retries_replayed >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_engine_request(env, stream):
    px, traces, keys, _, eng = env
    k = keys["a"]
    engine = eng.app.state.engine
    body = {
        **OA,
        "stream": stream,
        "messages": [{"role": "user", "content": f"disconnect {stream}"}],
    }
    with httpx.Client(timeout=60) as c:
        if stream:
            with c.stream(
                "POST",
                px.url + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {k}"},
            ) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    break  # read one event, then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                c.post(
                    px.url + "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {k}"},
                    timeout=0.4,
                )
    deadline = time.monotonic() + 10
    while engine.live_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.live_requests == 0  # no orphan holds the engine
    res = read_trace(trace_path(traces, "exec-a"))
    assert res.errors == []
    mine = [r for r in res.records if r.meta["last_user_head"] == f"disconnect {stream}"]
    if stream:  # the tokens streamed so far are recorded, marked as never answered
        assert [r.finish_reason for r in mine] == ["abort"] and mine[0].meta.get(
            "client_disconnected"
        )
        assert 0 < len(mine[0].output_ids) < 200
    else:  # nothing reached the proxy before the abort: nothing is recorded as answered
        assert all(r.finish_reason == "abort" for r in mine)
    # the proxy still serves that execution normally
    assert post(px, "/v1/chat/completions", OA, k).status_code == 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 5) | st.text(max_size=5),
    lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=5), i, max_size=3),
    max_leaves=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(
        ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]
    ),
    body=st.dictionaries(
        st.sampled_from(
            ["model", "messages", "max_tokens", "stream", "tools", "system", "n", "input"]
        ),
        json_values,
        max_size=5,
    ),
)
def test_fuzz_over_http_never_500(env, path, body):
    px, _, keys, _, _ = env
    r = post(px, path, body, keys["a"])
    assert r.status_code < 500, (body, r.text)


def test_restart_keeps_every_recorded_call(tiny_model_dir, tiny_tokenizer, tmp_path):
    """Records are durable before the answer ends; a new proxy on the same trace dir continues them."""
    with running_engine("scripted", tiny_model_dir, turns=[{"text": "hi"}]) as eng:
        for round_ in range(2):
            with running_proxy(
                tiny_model_dir, [eng.url], tmp_path, tiny_tokenizer
            ) as px:  # fsync on
                for i in range(2):
                    r = post(
                        px,
                        "/v1/chat/completions",
                        {**OA, "messages": [{"role": "user", "content": f"r{round_} c{i}"}]},
                        "same-key",
                    )
                    assert r.status_code == 200
    (path,) = list(tmp_path.glob("*.jsonl"))
    res = read_trace(path, vocab_size=len(tiny_tokenizer))
    assert res.errors == [] and [r.seq for r in res.records] == [0, 1, 2, 3]
    assert len({r.request_id for r in res.records}) == 4


def test_admin_drain_and_readd_engine_over_http(env):
    """With its only engine drained a call waits (one slow call, not an error) until an engine returns."""
    import concurrent.futures

    px, traces, keys, admin, eng = env
    assert admin.drain(eng.url) == 0
    assert [e["state"] for e in admin.stats()["pool"]["engines"]] == ["draining"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(post, px, "/v1/chat/completions", {**OA, "max_tokens": 5}, keys["a"])
        time.sleep(0.8)
        assert not fut.done()
        admin.add_engine(eng.url)  # the cell is back in rollout
        r = fut.result(timeout=60)
    assert r.status_code == 200
    assert [e["state"] for e in admin.stats()["pool"]["engines"]] == ["active"]
