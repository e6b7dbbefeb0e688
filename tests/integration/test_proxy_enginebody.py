"""The /generate body goes out as pieces (big cached prefix pieces never joined): a real HTTP server
must receive exactly the JSON a join would have produced, for a first attempt and a resume."""

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gyre.engine.runner import ServerRunner
from gyre.proxy import jsonfast
from gyre.proxy.pool import EnginePool, GenResult


async def test_pieces_arrive_as_one_exact_json_body():
    seen: list[dict] = []

    async def generate(request: Request) -> JSONResponse:
        raw = await request.body()
        assert int(request.headers["content-length"]) == len(raw)
        seen.append(json.loads(raw))
        return JSONResponse(
            {
                "output_ids": [3, 4],
                "meta_info": {
                    "finish_reason": {"type": "length"},
                    "output_token_logprobs": [[-0.5, 3, None], [-0.25, 4, None]],
                },
            }
        )

    server = ServerRunner(
        Starlette(routes=[Route("/generate", generate, methods=["POST"])])
    ).start()
    pool = EnginePool([server.url])
    try:
        await pool.start()
        prefix = list(range(200000))  # ~1.3 MB of JSON, several socket buffers
        parts = [
            jsonfast.ids_json(prefix[:150000]),
            jsonfast.ids_json(prefix[150000:]),
            jsonfast.ids_json([9, 9]),
        ]
        out = None
        async for item in pool.generate(
            "exec-1", parts, 200002, {"max_new_tokens": 2}, stream=False
        ):
            if isinstance(item, GenResult):
                out = item
        assert out is not None and out.output_ids == [3, 4] and out.logprobs == [-0.5, -0.25]
        assert len(seen) == 1
        assert seen[0]["input_ids"] == prefix + [9, 9]
        assert seen[0]["sampling_params"]["max_new_tokens"] == 2 and seen[0]["stream"] is False
    finally:
        await pool.aclose()
        server.stop()
