"""Trace store durability and bounds (issue 13 items 4, 5, 8): injective file names, torn
tails cut before appending, failed writes undone, a bounded number of open files."""

from __future__ import annotations

import errno
import os

import pytest

from gyre.trace import OutputSegment, TraceRecord, TraceWriter, read_trace, trace_path
from gyre.trace.store import repair_tail, torn_path, trace_name


def _rec(ex: str, i: int) -> TraceRecord:
    return TraceRecord(
        execution_id=ex,
        request_id=f"{ex}-r{i}",
        seq=i,
        api="openai.chat",
        base=None,
        base_len=0,
        input_suffix=(1, 2, 3),
        output_ids=(4, 5),
        output_logprobs=(-0.1, -0.2),
        segments=(OutputSegment(0, 2, "e0", 0),),
    )


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_names_are_injective_and_path_safe(tmp_path):
    ids = [
        "job/1",
        "job_1",
        "job 1",
        "job%2F1",
        "job%1",
        ".hidden",
        "..",
        "é",
        "a" * 300,
        "a" * 299 + "b",
        "../../etc/passwd",
        "x\x00y",
        "job-1.ok",
    ]
    names = [trace_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    for n in names:
        assert "/" not in n and "\x00" not in n and not n.startswith(".")
        assert len(n.encode()) <= 200
        assert trace_path(tmp_path, "x").parent == tmp_path
    assert trace_name("r0-g00001-a00") == "r0-g00001-a00"  # ordinary ids keep their name
    with pytest.raises(ValueError):
        trace_name("")


def test_three_similar_ids_get_three_files_and_own_seqs(tmp_path):
    w = TraceWriter(tmp_path)
    for ex in ("job/1", "job_1", "job 1"):
        w.append(_rec(ex, 0))
    w.close()
    files = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert len(files) == 3
    for ex in ("job/1", "job_1", "job 1"):
        res = read_trace(trace_path(tmp_path, ex))
        assert [(r.execution_id, r.seq) for r in res.records] == [(ex, 0)]


def test_torn_tail_is_cut_before_the_next_record(tmp_path):
    w = TraceWriter(tmp_path)
    w.append(_rec("e", 0))
    w.close()
    p = trace_path(tmp_path, "e")
    with open(p, "a") as f:  # a crash mid-write: half a line, no newline
        f.write('{"format":1,"execution_id":"e","request_id":"torn","se')
    w = TraceWriter(tmp_path)
    w.append(_rec("e", 1))
    w.close()
    res = read_trace(p)
    assert res.errors == []
    assert [r.seq for r in res.records] == [0, 1]
    assert w.repaired_bytes > 0
    assert b'"request_id":"torn"' in torn_path(p).read_bytes()


def test_repair_without_any_newline_and_on_clean_files(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"partial')
    assert repair_tail(p) == len(b'{"partial')
    assert p.read_bytes() == b""
    p.write_bytes(b"{}\n")
    assert repair_tail(p) == 0 and p.read_bytes() == b"{}\n"
    assert repair_tail(tmp_path / "missing.jsonl") == 0


def test_failed_write_is_undone_and_raised(tmp_path, monkeypatch):
    w = TraceWriter(tmp_path, fsync=False)
    w.append(_rec("e", 0))
    real_write = os.write
    calls = {"n": 0}

    def half_then_enospc(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_enospc)
    with pytest.raises(OSError):
        w.append(_rec("e", 1))
    monkeypatch.setattr(os, "write", real_write)
    w.append(_rec("e", 2))
    w.close()
    res = read_trace(trace_path(tmp_path, "e"))
    assert res.errors == [] and [r.seq for r in res.records] == [0, 2]


def test_open_files_are_bounded_and_reopened(tmp_path):
    before = _fds()
    w = TraceWriter(tmp_path, fsync=False, max_open=8)
    for i in range(200):
        w.append(_rec(f"e{i}", 0))
        assert w.open_files <= 8
    assert _fds() - before <= 8
    for i in range(200):  # reopened for append on demand
        w.append(_rec(f"e{i}", 1))
    assert w.close_idle(0.0) == 8 and w.open_files == 0
    w.close()
    assert _fds() == before
    for i in (0, 117, 199):
        assert [r.seq for r in read_trace(trace_path(tmp_path, f"e{i}")).records] == [0, 1]
