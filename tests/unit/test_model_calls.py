"""The 'did the policy act?' rule, the harness's calls file, and the proxy's per-execution tally."""

from __future__ import annotations

import json

from gyre.harness.execution import HarnessRun
from gyre.harness.model_calls import (
    CALLS_FILE_ENV,
    ModelCalls,
    read_calls_file,
    read_calls_report,
    write_calls_file,
)
from gyre.proxy.calltally import CallTallies


def test_rule_drops_only_executions_whose_calls_all_failed():
    assert ModelCalls(attempted=3, answered=0).unreachable
    assert not ModelCalls(attempted=3, answered=1).unreachable  # the policy acted once: scored
    assert not ModelCalls(attempted=0, answered=0).unreachable  # no call at all (oracle): scored
    d = ModelCalls(attempted=2, answered=0, last_error="HTTP 503: no engine", source="proxy")
    assert d.detail() == (
        "2 model calls attempted, none answered by the policy (at the proxy): HTTP 503: no engine"
    )


def test_calls_file_round_trip_and_bad_files(tmp_path, monkeypatch):
    f = tmp_path / "model_calls.json"
    write_calls_file(1, 0)  # no env: a no-op, never an error
    assert not f.exists()
    monkeypatch.setenv(CALLS_FILE_ENV, str(f))
    write_calls_file(2, 1, "APIError: boom")
    assert read_calls_file(f) == ModelCalls(2, 1, "APIError: boom", "harness")
    assert read_calls_file(tmp_path / "absent.json") is None
    for bad in (
        "{",
        "[]",
        '{"attempted": -1, "answered": 0}',
        '{"attempted": true, "answered": 0}',
    ):
        f.write_text(bad)
        assert read_calls_file(f) is None, bad
    monkeypatch.setenv(CALLS_FILE_ENV, str(tmp_path / "no-such-dir" / "x.json"))
    write_calls_file(1, 0)  # unwritable: silently skipped


def test_calls_file_carries_the_first_call_and_last_answer_times(tmp_path, monkeypatch):
    f = tmp_path / "model_calls.json"
    monkeypatch.setenv(CALLS_FILE_ENV, str(f))
    write_calls_file(1, 0, first_call_at=100.5)  # sent, not answered yet: no times to record
    assert read_calls_report(f) == (ModelCalls(1, 0, "", "harness"), None)
    write_calls_file(1, 1, first_call_at=100.5, last_answer_at=101.25)
    assert read_calls_report(f) == (ModelCalls(1, 1, "", "harness"), (100.5, 101.25))
    for bad in ('"x"', "true", "-1", "1e300"):  # a time that is no time: counts kept, no times
        f.write_text(
            f'{{"attempted": 1, "answered": 1, "first_call_at": {bad}, "last_answer_at": 2}}'
        )
        assert read_calls_report(f) == (ModelCalls(1, 1, "", "harness"), None), bad


def test_counts_survive_result_json():
    run = HarnessRun(model_calls=ModelCalls(4, 0, "x", "proxy"))
    back = HarnessRun.model_validate(json.loads(run.model_dump_json()))
    assert back.model_calls == ModelCalls(4, 0, "x", "proxy")


def test_proxy_tally_counts_per_execution_and_forgets_on_drop():
    t = CallTallies(cap=2)
    t.attempt("a")
    t.fail("a", "HTTP 503: no engine")
    t.attempt("a")
    t.answer("a")
    assert t.get("a") == {
        "execution_id": "a",
        "attempted": 2,
        "answered": 1,
        "last_error": "HTTP 503: no engine",
    }
    assert t.get("never")["attempted"] == 0
    t.attempt("b")
    t.attempt("c")  # over the cap: the oldest entry goes
    assert t.get("a")["attempted"] == 0 and t.get("c")["attempted"] == 1
    t.drop("c")
    assert t.get("c")["attempted"] == 0
