import json

import pytest

from gyre.trace import (
    OutputSegment,
    TraceFormatError,
    TraceRecord,
    TraceWriter,
    read_trace,
    trace_path,
)


def _rec(i: int, **kw) -> TraceRecord:
    d = dict(
        execution_id="ex/1",
        request_id=f"r{i}",
        seq=i,
        api="openai.chat",
        base=None,
        base_len=0,
        input_suffix=(1, 2, 3),
        output_ids=(4, 5),
        output_logprobs=(-0.1, -0.2),
        segments=(OutputSegment(0, 2, "e0", 0),),
    )
    d.update(kw)
    return TraceRecord(**d)


def test_roundtrip_and_sanitised_path(tmp_path):
    w = TraceWriter(tmp_path)
    w.append(_rec(0))
    w.append(_rec(1, base="r0", base_len=5, input_suffix=(6,)))
    w.close()
    p = trace_path(tmp_path, "ex/1")
    assert p.parent == tmp_path and "/" not in p.name
    res = read_trace(p)
    assert res.errors == []
    assert [r.request_id for r in res.records] == ["r0", "r1"]
    assert res.records[1].base == "r0" and res.records[1].input_suffix == (6,)


def test_bad_records_are_named_and_rest_kept(tmp_path):
    p = tmp_path / "x.jsonl"
    good = json.dumps(_rec(0).to_json())
    mismatched = json.dumps(_rec(1, output_logprobs=(-0.1,)).to_json())
    oov = json.dumps(
        _rec(
            2,
            output_ids=(4, 99999),
            output_logprobs=(-0.1, -0.1),
            segments=(OutputSegment(0, 2, "e0", 0),),
        ).to_json()
    )
    p.write_text(good + "\n" + mismatched + "\n" + oov + "\n" + good[: len(good) // 2])
    res = read_trace(p, vocab_size=1000)
    assert [r.request_id for r in res.records] == ["r0"]
    assert len(res.errors) == 3
    assert "'r1'" in res.errors[0] and "log-probs" in res.errors[0]
    assert "'r2'" in res.errors[1] and "99999" in res.errors[1]
    assert "truncated" in res.errors[2]


def test_validate_rejects_positive_logprob():
    with pytest.raises(TraceFormatError, match="r0"):
        _rec(0, output_logprobs=(0.5, -0.1)).validate()


def test_a_trace_written_with_the_old_name_of_the_segment_version_reads_the_same():
    """Segments name their version ``policy_version``; traces written before 2026-12-08 call
    it ``weights_version``. Both read to the same record, and it is written back in the new
    name."""
    d = _rec(0, segments=(OutputSegment(0, 1, "e0", 3), OutputSegment(1, 2, "e1", 4))).to_json()
    assert [s["policy_version"] for s in d["segments"]] == [3, 4]
    old = {**d, "segments": [
        {k if k != "policy_version" else "weights_version": v for k, v in s.items()}
        for s in d["segments"]
    ]}  # fmt: skip
    assert TraceRecord.from_json(old) == TraceRecord.from_json(d)
    assert TraceRecord.from_json(old).to_json() == d
    bad = {**d, "segments": [{"start": 0, "end": 2, "engine_id": "e0"}]}  # no version at all
    with pytest.raises(TraceFormatError):
        TraceRecord.from_json(bad)
