"""Engine pool pieces that need no engine: output segments per engine/weights version, placement."""

from gyre.proxy.pool import EngineHandle, EnginePool, _merge, _segments, _unpack
from gyre.trace.record import OutputSegment


def test_segments_split_at_weight_version_marks_and_merge_across_attempts():
    # attempt 1 on engine A produced tokens [0, 5) with a publication after 3 tokens
    a = _segments(0, 5, "A", [(0, 3), (3, 4)])
    assert a == [OutputSegment(0, 3, "A", 3), OutputSegment(3, 5, "A", 4)]
    # attempt 2 (after a drain) on engine B continued at token 5
    b = _segments(5, 9, "B", [(0, 4)])
    assert _merge(a + b) == [OutputSegment(0, 3, "A", 3), OutputSegment(3, 5, "A", 4), OutputSegment(5, 9, "B", 4)]
    assert _segments(0, 2, "C", []) == [OutputSegment(0, 2, "C", -1)]  # engine did not say
    assert _merge(_segments(0, 2, "A", [(0, 1)]) + _segments(2, 4, "A", [(0, 1)])) == [OutputSegment(0, 4, "A", 1)]


def test_unpack_sglang_shapes():
    ids, lps, fin, marks = _unpack({"output_ids": [5, 6], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 6}, "output_token_logprobs": [[-0.5, 5, None], [-0.1, 6, None]],
        "weight_version": "default"}})
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
