"""Assessments (scored vs missing), reward rules and verifier result parsing."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter

from gyre.harness.results import ResultError, VerifierResult, parse_result
from gyre.harness.scorer import apply_rule
from gyre.trace.assessment import (
    Assessment,
    Missing,
    MissingReason,
    Scored,
    mean_reward,
    summarize,
)


def test_missing_is_never_a_zero():
    a = [
        Scored(reward=1.0, rule="binary"),
        Missing(reason=MissingReason.evaluator_timeout),
        Scored(reward=0.0, rule="binary"),
        Missing(reason=MissingReason.overall_timeout),
    ]
    assert mean_reward(a) == 0.5  # (1 + 0) / 2, not / 4
    assert mean_reward([Missing(reason=MissingReason.evaluator_error)]) is None
    assert mean_reward([]) is None
    assert summarize(a) == {"executions": 4, "scored": 2, "missing": 2, "mean_reward": 0.5}
    with pytest.raises(AttributeError):
        Missing(reason=MissingReason.cancelled).reward  # noqa: B018 - no reward to average by accident


def test_assessment_round_trips_as_a_tagged_union():
    ta = TypeAdapter(Assessment)
    for a in (
        Scored(reward=0.25, rule="fraction", passed=1, total=4),
        Missing(reason=MissingReason.launch_failed, detail="x"),
    ):
        back = ta.validate_json(ta.dump_json(a))
        assert back == a and type(back) is type(a)


@pytest.mark.parametrize(
    "rule, reward, passed, total, want",
    [
        ("binary", None, 4, 4, 1.0),
        ("binary", None, 3, 4, 0.0),
        ("binary", None, 0, 0, 0.0),
        ("fraction", None, 3, 4, 0.75),
        ("fraction", None, 0, 0, 0.0),
        ("binary", 1.0, None, None, 1.0),
        ("binary", 0.99, None, None, 0.0),
        ("fraction", 0.4, None, None, 0.4),
        ("fraction", 7.0, None, None, 1.0),
        ("fraction", -1.0, None, None, 0.0),
    ],
)
def test_reward_rules(rule, reward, passed, total, want):
    assert apply_rule(rule, reward, passed, total) == want


def test_result_files():
    junit = b'<testsuites><testsuite name="a" tests="5" failures="1" errors="1" skipped="1"/></testsuites>'
    assert parse_result("junit.xml", junit) == VerifierResult(None, 2, 4, "junit.xml")
    assert parse_result("reward.txt", b"0.5\n") == VerifierResult(0.5, None, None, "reward.txt")
    body = json.dumps({"passed": 3, "total": 4}).encode()
    assert parse_result("reward.json", body) == VerifierResult(None, 3, 4, "reward.json")
    assert parse_result("reward.json", b'{"reward": 1}').reward == 1.0


@pytest.mark.parametrize(
    "name, content",
    [
        ("reward.json", "{not json"),
        ("reward.json", "[1]"),
        ("reward.json", '{"score": 1}'),
        ("reward.json", '{"passed": 5, "total": 4}'),
        ("reward.txt", "nan"),
        ("reward.txt", "one"),
        ("junit.xml", "<testsuite"),
    ],
)
def test_unreadable_results_raise(name, content):
    with pytest.raises(ResultError):
        parse_result(name, content.encode())
