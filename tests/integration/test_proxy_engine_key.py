"""The engine API key reaches the pool through ProxyServer.set_engine_api_key (what `gyre run`
calls with the run's secret): a real null engine that wants the key, a real proxy in front."""

from __future__ import annotations

import httpx
import pytest

from gyre.engine.app import create_app
from gyre.engine.client import API_KEY_ENV
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer

KEY = "run-secret"
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def chat(server: ProxyServer) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json=CHAT,
        headers={"authorization": "Bearer client"},
        timeout=60,
    )


def test_the_key_set_before_start_opens_the_engine(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    engine = NullEngine(NullEngineConfig(engine_id="keyed"))
    with ServerRunner(create_app(engine, api_key=KEY), name="keyed") as eng:
        cfg = ProxyConfig(
            model_dir=str(tiny_model_dir), engines=[eng.url], trace_dir=str(tmp_path), fsync=False
        )
        with ProxyServer(cfg, tiny_tokenizer) as bare:  # no key: the engine refuses the pool
            r = chat(bare)
            assert r.status_code == 400 and "engine API key" in r.text, r.text
        keyed = ProxyServer(cfg, tiny_tokenizer)
        keyed.set_engine_api_key(KEY)
        with keyed:
            r = chat(keyed)
            assert r.status_code == 200, r.text
            with pytest.raises(RuntimeError, match="before the proxy starts"):
                keyed.set_engine_api_key("too late")
