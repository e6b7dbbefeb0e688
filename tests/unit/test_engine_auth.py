"""The engine server's two guards against the real ASGI app (gyre.engine.app): the API key on
every route but /health, and the reload root of /update_weights_from_disk."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from gyre.engine.app import allowed_reload, create_app
from gyre.engine.client import EngineClient, EngineRequestError
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine

KEY = "s3cret-run-key"
ROUTES = [
    ("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("POST", "/pause_generation", {}),
    ("POST", "/continue_generation", None),
    ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
    ("GET", "/get_model_info", None),
    ("GET", "/get_server_info", None),
]


@pytest.fixture
async def served(request):
    """(engine, client factory) for an app built with the test's create_app kwargs."""
    engine = NullEngine(NullEngineConfig(engine_id="e0"))
    await engine.start()
    app = create_app(engine, **request.param)
    transport = httpx.ASGITransport(app=app)
    clients: list[httpx.AsyncClient] = []

    def client(headers: dict[str, str] | None = None) -> httpx.AsyncClient:
        c = httpx.AsyncClient(transport=transport, base_url="http://engine", headers=headers)
        clients.append(c)
        return c

    yield engine, client, transport
    for c in clients:
        await c.aclose()
    await engine.stop()


@pytest.mark.parametrize("served", [{"api_key": KEY}], indirect=True)
async def test_every_route_but_health_wants_the_key(served):
    engine, client, _ = served
    anon, wrong = client(), client({"Authorization": "Bearer not-the-key"})
    bare = client({"Authorization": KEY})  # the key without the scheme
    for method, path, body in ROUTES:
        for c in (anon, wrong, bare):
            r = await c.request(method, path, json=body)
            assert r.status_code == 401, (path, r.status_code, r.text)
            assert r.json()["error"]["type"] == "unauthorized"
    assert not engine.paused and engine.weight_version == 0  # nothing was done
    assert (await anon.get("/health")).status_code == 200


@pytest.mark.parametrize("served", [{"api_key": KEY}], indirect=True)
async def test_the_key_opens_every_route(served):
    engine, client, _ = served
    ok = client({"Authorization": f"Bearer {KEY}"})
    for method, path, body in ROUTES:
        r = await ok.request(method, path, json=body)
        assert r.status_code == 200, (path, r.status_code, r.text)
    assert engine.weight_version == 1  # the reload went through


@pytest.mark.parametrize("served", [{"api_key": KEY}], indirect=True)
async def test_engine_client_sends_the_key_explicitly_or_from_the_environment(served, monkeypatch):
    _, _, transport = served
    async with EngineClient("http://engine", transport=transport) as c:
        with pytest.raises(EngineRequestError, match="401"):
            await c.model_info()
    async with EngineClient("http://engine", transport=transport, api_key=KEY) as c:
        assert (await c.model_info()).engine_id == "e0"
        out = await c.generate([1, 2, 3], {"max_new_tokens": 2})
        assert len(out.output_ids) == 2
    monkeypatch.setenv("GYRE_ENGINE_API_KEY", KEY)  # how a run's cells get it
    async with EngineClient("http://engine", transport=transport) as c:
        await c.pause()
        await c.resume()


@pytest.mark.parametrize("served", [{}], indirect=True)
async def test_without_a_key_the_server_is_open(served):
    _, client, _ = served
    r = await client().get("/get_model_info")
    assert r.status_code == 200


def test_an_empty_key_is_refused():
    with pytest.raises(ValueError, match="empty"):
        create_app(NullEngine(NullEngineConfig()), api_key="")


# ------------------------------------------------------------------ reload root
@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "run" / "weights"
    (r / "v3").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", r / "sneaky")
    return r


def test_allowed_reload_resolves_inside_and_refuses_every_way_out(root, tmp_path):
    assert allowed_reload(str(root / "v3"), root) == str((root / "v3").resolve())
    assert allowed_reload(str(root / "v3" / ".." / "v3"), root) == str((root / "v3").resolve())
    for bad in (
        tmp_path / "elsewhere",
        root / "sneaky",  # a link inside the root to a folder outside it
        root / ".." / "weights-not",
        root / "v3" / ".." / "..",
        Path("/etc"),
    ):
        with pytest.raises(Exception, match="outside this engine's reload root"):
            allowed_reload(str(bad), root)


async def _reload(app, path: str, version: int) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://engine"
    ) as c:
        return await c.post(
            "/update_weights_from_disk", json={"model_path": path, "weight_version": version}
        )


async def test_reloads_outside_the_root_are_403_and_change_nothing(root, tmp_path):
    engine = NullEngine(NullEngineConfig())
    await engine.start()
    try:
        app = create_app(engine, reload_root=str(root))
        for bad in (tmp_path / "elsewhere", root / "sneaky", root / "v3" / ".." / ".."):
            r = await _reload(app, str(bad), 7)
            assert r.status_code == 403, r.text
            assert "reload root" in r.json()["error"]["message"]
            assert engine.weight_version == 0
        r = await _reload(app, str(root / "v3"), 3)
        assert r.status_code == 200 and engine.weight_version == 3
        # without a root (a standalone `gyre engine`), any directory reloads as before
        assert (
            await _reload(create_app(engine), str(tmp_path / "elsewhere"), 4)
        ).status_code == 200
    finally:
        await engine.stop()
