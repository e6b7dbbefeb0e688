"""Issue 37 finding 5: what the proxy keeps of requests after their answer is bounded in all
(``max_held_body_bytes``), and continuation stays token-exact for executions that dropped it.

The bytes held are measured on the data structures themselves (the kept bodies, the retry
window's bodies, each call's raw messages), not with RSS."""

from __future__ import annotations

import json

import httpx
import pytest

from gyre.engine.app import create_app
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer
from gyre.trace import read_trace, trace_path

PART = 4 << 20  # an unknown content part of 4 MB: the template shows a one-line note for it
BUDGET = 24 << 20


@pytest.fixture
def make_proxy(tiny_model_dir, tiny_tokenizer, tmp_path):
    started: list[ProxyServer] = []
    eng = ServerRunner(create_app(NullEngine(NullEngineConfig(engine_id="null"))), name="n")
    eng.start()

    def make(**kw) -> ProxyServer:
        cfg = ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[eng.url],
            trace_dir=str(tmp_path / "traces"),
            fsync=False,
            **kw,
        )
        px = ProxyServer(cfg, tiny_tokenizer).start()
        started.append(px)
        return px

    yield make
    for px in started:
        px.stop()
    eng.stop()


def _user(text: str, blob: str | None) -> dict:
    parts: list[dict] = [{"type": "text", "text": text}]
    if blob is not None:
        parts.append({"type": "x_unknown_part", "data": blob})
    return {"role": "user", "content": parts}


def _post(c: httpx.Client, px: ProxyServer, key: str, messages: list[dict]) -> dict:
    r = c.post(
        px.url + "/v1/chat/completions",
        json={"model": "m", "max_tokens": 4, "messages": messages},
        headers={"authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text[:300]
    return r.json()


def _held_by_structures(px: ProxyServer) -> int:
    """Bytes of request data the execution states reference, walked here (not their counter):
    distinct kept bodies, and the raw messages each recorded call still holds (JSON size)."""
    total = 0
    for _, ex in px.service.executions.items():
        bodies = {id(p.body): len(p.body) for p in ex.bodies.recent}
        bodies.update((id(e.body), len(e.body)) for e in ex.retries.entries)
        total += sum(bodies.values())
        for node in ex.state.nodes:
            if node.raw_items is not None:
                total += len(json.dumps(node.raw_items))
    return total


def test_bodies_held_after_their_answers_stay_within_the_budget(make_proxy):
    px = make_proxy(max_held_body_bytes=BUDGET)
    blob = "x" * PART
    with httpx.Client(timeout=120) as c:
        for k in range(10):
            for i in range(4):
                _post(c, px, f"key{k}", [_user(f"call {i}", blob)])
    held = _held_by_structures(px)
    # what one execution may hold (never shed while it is the one calling): 4 bodies, each
    # parsed into raw messages of about the same size, and a retry window of the same bodies
    one_execution = 2 * 4 * (PART + 4096)
    assert held <= BUDGET + one_execution, held  # 10 keys used to hold 10 x that (~330 MB)
    ex = px.service.executions
    assert ex.held_bytes == sum(e.count_held() for _, e in ex.items())  # the counter is right
    stats = px.service.stats()
    assert stats["held_body_bytes"] == ex.held_bytes
    assert stats["counters"]["shed_bodies"] > 0


def test_continuation_is_token_exact_for_executions_that_shed_everything(make_proxy):
    """Budget 0: every other execution drops its bodies and raw messages at each call; two
    interleaved conversations still continue token for token (matched on normalised messages)."""
    px = make_proxy(max_held_body_bytes=0, mode="open")
    blob = "y" * (256 << 10)
    convs: dict[str, list[dict]] = {
        "alice": [{"role": "system", "content": "be brief"}, _user("first", blob)],
        "bob": [_user("hello", blob)],
    }
    with httpx.Client(timeout=120) as c:
        for turn in range(3):
            for key, msgs in convs.items():
                out = _post(c, px, key, msgs)
                msgs.append(
                    {"role": "assistant", "content": out["choices"][0]["message"]["content"]}
                )
                msgs.append(_user(f"turn {turn} of {key}", None))
                held = [e.held for _, e in px.service.executions.items()]
                assert sum(h > 0 for h in held) == 1, held  # only the one that just called
    assert px.service.counters.shed_bodies > 0
    for key in convs:
        ident = px.service.keys.resolve(key)
        assert ident is not None
        records = read_trace(trace_path(px.config.trace_dir, ident.execution_id)).records
        assert len(records) == 3
        full: dict[str, list[int]] = {}
        for prev, cur in zip(records, records[1:]):
            assert cur.meta["bridge"] == "continuation" and cur.base == prev.request_id
        for r in records:
            base = full[r.base][: r.base_len] if r.base else []
            inp = base + list(r.input_suffix)
            full[r.request_id] = inp + list(r.output_ids)
        for prev, cur in zip(records, records[1:]):
            assert cur.base_len == len(full[prev.request_id])
