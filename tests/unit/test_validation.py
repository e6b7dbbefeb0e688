"""The one pydantic-error formatter (gyre.validation): CLIs, the engine's 400s and its client."""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from gyre.engine.app import create_app
from gyre.engine.client import EngineClient, EngineRequestError
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine
from gyre.validation import MAX_INPUT_SHOWN, validation_line


class Turn(BaseModel):
    role: str
    tokens: list[int]


class Call(BaseModel):
    turns: list[Turn]
    budget: int


def _error(data) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        Call.model_validate(data)
    return e.value


def test_nested_error_names_the_full_path_with_list_indices():
    e = _error({"turns": [{"role": "user", "tokens": [1, "x"]}], "budget": 3})
    assert validation_line(e) == (
        "turns.0.tokens.1: Input should be a valid integer, unable to parse string as an "
        "integer (got 'x')"
    )


def test_missing_fields_quote_nothing_and_long_inputs_are_not_echoed():
    e = _error({"turns": [{"role": "u" * 100, "tokens": "y" * (MAX_INPUT_SHOWN + 1)}]})
    line = validation_line(e)
    assert line == "turns.0.tokens: Input should be a valid list; budget: Field required"


def test_whole_input_errors_use_the_root_name_or_the_message_alone():
    with pytest.raises(ValidationError) as e:
        Call.model_validate_json(b"{not json")
    assert validation_line(e.value).startswith("config: Invalid JSON")
    assert validation_line(e.value, root=None).startswith("Invalid JSON")


def test_fastapi_error_lists_drop_the_body_prefix():
    errors = [{"loc": ("body", "budget"), "msg": "Field required", "type": "missing"}]
    assert validation_line(errors, root=None, drop=("body",)) == "budget: Field required"
    assert validation_line([]) == "invalid value"


async def test_engine_400_and_client_refusal_read_the_same():
    engine = NullEngine(NullEngineConfig(engine_id="e0"))
    await engine.start()
    transport = httpx.ASGITransport(app=create_app(engine))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as c:
            body = {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}
            r = await c.post("/generate", json=body)
        assert r.status_code == 400
        served = r.json()["error"]["message"]
        assert served.startswith("invalid request: sampling_params.temperature: ")
        assert served.endswith("(got 'hot')")
        async with EngineClient("http://engine", transport=transport) as client:
            with pytest.raises(EngineRequestError) as ei:
                await client.generate([1, 2], {"temperature": "hot"})
        # the client checks the sampling parameters on their own: the path starts there
        field_msg = served.removeprefix("invalid request: sampling_params.")
        assert str(ei.value) == f"invalid request (not sent): {field_msg}"
    finally:
        await engine.stop()
