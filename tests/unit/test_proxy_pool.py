"""Engine pool pieces that need no engine: output segments per engine/weights version, placement."""

from gyre.proxy.attempts import EngineHandle
from gyre.proxy.enginewire import merge_segments, output_segments, unpack
from gyre.proxy.pool import EnginePool
from gyre.trace.record import OutputSegment


def test_segments_split_at_weight_version_marks_and_merge_across_attempts():
    # attempt 1 on engine A produced tokens [0, 5) with a publication after 3 tokens
    a = output_segments(0, 5, "A", [(0, 3), (3, 4)])
    assert a == [OutputSegment(0, 3, "A", 3), OutputSegment(3, 5, "A", 4)]
    # attempt 2 (after a drain) on engine B continued at token 5
    b = output_segments(5, 9, "B", [(0, 4)])
    assert merge_segments(a + b) == [
        OutputSegment(0, 3, "A", 3),
        OutputSegment(3, 5, "A", 4),
        OutputSegment(5, 9, "B", 4),
    ]
    assert output_segments(0, 2, "C", []) == [OutputSegment(0, 2, "C", -1)]  # engine did not say
    assert merge_segments(
        output_segments(0, 2, "A", [(0, 1)]) + output_segments(2, 4, "A", [(0, 1)])
    ) == [OutputSegment(0, 4, "A", 1)]


def test_unpack_sglang_shapes():
    ids, lps, fin, marks = unpack(
        {
            "output_ids": [5, 6],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 6},
                "output_token_logprobs": [[-0.5, 5, None], [-0.1, 6, None]],
                "weight_version": "default",
            },
        }
    )
    assert (ids, lps, fin, marks) == ([5, 6], [-0.5, -0.1], "stop", [(0, -1)])


def test_affinity_and_least_loaded_placement():
    pool = EnginePool([])
    e1 = EngineHandle("u1", [], None, "e1")
    e2 = EngineHandle("u2", [], None, "e2")
    pool.engines = {"u1": e1, "u2": e2}
    e1.inflight = {object(), object()}
    assert pool.pick("x") is e2  # least loaded
    e2.inflight = {object(), object(), object()}
    assert pool.pick("x") is e2  # affinity holds while the engine is active
    e2.state = "draining"
    assert pool.pick("x") is e1  # never a draining engine
    e1.state = "draining"
    assert pool.pick("x") is None


def test_generate_body_is_valid_json_and_never_copies_big_pieces():
    import json

    from gyre.proxy import jsonfast
    from gyre.proxy.enginewire import BIG_PIECE, PartsPayload, coalesce, generate_body

    big = jsonfast.ids_json(range(30000))  # > BIG_PIECE bytes
    assert len(big) >= BIG_PIECE
    parts = [jsonfast.ids_json([1, 2]), big, jsonfast.ids_json([7]), b"", jsonfast.ids_json([8, 9])]
    body = generate_body("r1", parts, [11, 12], {"max_new_tokens": 4}, False)
    assert isinstance(body, PartsPayload)
    data = json.loads(body.joined())
    assert data["input_ids"] == [1, 2] + list(range(30000)) + [7, 8, 9, 11, 12]
    assert data["rid"] == "r1" and data["sampling_params"] == {"max_new_tokens": 4}
    assert data["return_logprob"] is True and data["stream"] is False
    assert any(p is big for p in body.parts)  # handed over as is, not joined
    assert len(body.parts) == 3 and body.size == len(body.joined())
    # no input pieces at all (only resumed output ids) and nothing at all
    assert json.loads(generate_body("r", [], [5], {}, True).joined())["input_ids"] == [5]
    assert json.loads(generate_body("r", [b""], [], {}, True).joined())["input_ids"] == []
    assert coalesce([b"a", b"b", big, b"c"]) == [b"ab", big, b"c"]
    assert coalesce([]) == []


async def test_parts_payload_writes_every_piece_and_honours_a_length():
    from gyre.proxy.enginewire import PartsPayload

    class Writer:
        def __init__(self):
            self.got = []

        async def write(self, chunk):
            self.got.append(bytes(chunk))

    p = PartsPayload([b"abc", b"defgh", b"ij"])
    w = Writer()
    await p.write(w)
    assert b"".join(w.got) == b"abcdefghij" and w.got[1] == b"defgh"
    w = Writer()
    await p.write_with_length(w, 6)
    assert b"".join(w.got) == b"abcdef"
    assert p.decode() == "abcdefghij" and await p.as_bytes() == b"abcdefghij"


async def test_a_lost_engine_leaves_routing_its_waits_end_and_it_comes_back():
    import asyncio

    from gyre.proxy.config import PoolConfig

    pool = EnginePool([])
    seen = []
    pool.listeners.append(seen.append)
    e1 = EngineHandle("u1", [], None, "e1")
    e2 = EngineHandle("u2", [], None, "e2")
    pool.engines = {"u1": e1, "u2": e2}
    e2.inflight = {object()}
    assert pool.pick("x") is e1
    waiting = asyncio.ensure_future(asyncio.wait_for(asyncio.shield(e1.gone_future()), 5))
    cm = asyncio.timeout(None)  # a stream read waiting on it, with no limit of its own
    e1.readers.add(cm)

    async def read() -> str:
        try:
            async with cm:
                await asyncio.sleep(5)
        except TimeoutError:
            return "cut"
        return "slept"

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0)
    pool.lose(e1, "silent", 3.0)
    pool.lose(e1, "silent again", 4.0)  # once only
    assert await asyncio.wait_for(reader, 1) == "cut"  # its waits end at once
    await asyncio.wait_for(waiting, 1)
    assert e1.state == "lost" and "x" not in pool.affinity
    assert pool.pick("x") is e2  # never a lost engine, even a less loaded one
    assert [(ev.kind, ev.url, ev.silent_s) for ev in seen] == [("lost", "u1", 3.0)]
    assert pool.counters.engines_lost == 1
    assert await pool.drain("u1") == 0  # nothing there answers aborts; returns to draining
    pool.back(e1)
    assert e1.state == "draining" and [ev.kind for ev in seen] == ["lost", "back"]
    e1.state = "active"
    pool.lose(e1, "again")
    pool.back(e1)
    assert e1.state == "active"
    strict = EnginePool([], PoolConfig(engine_rejoin=False))
    e3 = EngineHandle("u3", [], None, "e3")
    strict.engines = {"u3": e3}
    strict.lose(e3, "silent")
    strict.back(e3)  # heard, but it stays out until added again
    assert e3.state == "lost" and strict.counters.engines_back == 1


async def test_heartbeat_judges_silence_but_not_its_own_loop_stalling():
    from gyre.proxy.config import PoolConfig

    pool = EnginePool([], PoolConfig(engine_heartbeat_s=1.0, engine_lost_after_s=5.0))
    e = EngineHandle("u1", [], None, "e1", last_alive=100.0)  # no ctl: every ping fails
    pool.engines = {"u1": e}
    hb = pool.heartbeat
    hb.tick(104.0)
    assert e.state == "active"  # silent 4 s < 5 s
    hb.tick(130.0)  # 26 s late: the proxy's loop was blocked, not the engine silent
    assert e.state == "active" and pool.counters.heartbeat_stalls == 1
    hb.tick(131.0)
    assert e.state == "active"  # the pings sent after the stall get two periods
    hb.tick(132.0)
    assert e.state == "lost" and pool.counters.engines_lost == 1
    for t in (133.0, 134.0):
        hb.tick(t)
    assert pool.counters.engines_lost == 1


async def test_removing_an_engine_known_lost_moves_its_calls_without_waiting_on_aborts():
    """The runtime found a cell hung (SIGSTOP): aborts to its engine are never answered until
    the kill lands (~5 s for Ray's kill of a stopped actor). Removed as ``lost``, its calls
    break off at once and count as moved; a plain remove waits on the aborts."""
    import asyncio
    import types

    from gyre.proxy.attempts import InFlight

    class _Hung:
        aborts = 0

        async def abort(self, rid: str) -> None:
            _Hung.aborts += 1
            await asyncio.sleep(3600)  # a stopped process: no answer

        async def aclose(self) -> None:
            pass

    async def close() -> None:
        pass

    def pool_with_calls() -> tuple[EnginePool, EngineHandle, list]:
        pool = EnginePool([])
        seen: list = []
        pool.listeners.append(seen.append)
        e = EngineHandle("u1", types.SimpleNamespace(close=close), _Hung(), "e1")  # type: ignore[arg-type]
        e.inflight = {InFlight(f"r{i}", f"x{i}", e) for i in range(3)}
        pool.engines = {"u1": e}
        pool.affinity = {"x0": "u1"}
        return pool, e, seen

    pool, e, seen = pool_with_calls()
    await asyncio.wait_for(pool.remove("u1", lost="cell 2 hung (heartbeat)"), 1)
    assert "u1" not in pool.engines and e.state == "lost" and not pool.affinity
    assert pool.counters.moved == 3 and _Hung.aborts == 0
    assert [(ev.kind, ev.why) for ev in seen] == [("lost", "cell 2 hung (heartbeat)")]
    plain, _, _ = pool_with_calls()
    try:
        await asyncio.wait_for(plain.remove("u1"), 0.5)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a plain remove did not wait on the hung engine's aborts")
    assert _Hung.aborts >= 1
