"""Rewards: missing is not zero; all-equal groups give no gradient; bad input is refused."""

import math

import pytest

from gyre.trace.assessment import Missing, MissingReason
from gyre.train.rewards import group_advantages


def crashed(detail: str = "evaluator crashed") -> Missing:
    return Missing(reason=MissingReason.evaluator_error, detail=detail)


def test_missing_leaves_the_group():
    scored = {"a": 1.0, "b": 0.0, "c": 0.5}
    with_missing = group_advantages({**scored, "d": crashed()})
    only_scored = group_advantages(scored)
    assert with_missing.missing == ["d"] and with_missing.n_scored == 3
    assert with_missing.advantages == pytest.approx(only_scored.advantages)
    assert "d" not in with_missing.advantages
    # hand check: mean 0.5, population std sqrt(1/6)
    sd = math.sqrt(((0.5) ** 2 + 0.5**2 + 0) / 3)
    assert with_missing.advantages["a"] == pytest.approx(0.5 / (sd + 1e-6))


def test_missing_differs_from_zero():
    missing = group_advantages({"a": 1.0, "b": 0.0, "c": 0.5, "d": crashed()})
    zero = group_advantages({"a": 1.0, "b": 0.0, "c": 0.5, "d": 0.0})
    assert zero.n_scored == 4 and "d" in zero.advantages
    for e in ("a", "b", "c"):
        assert missing.advantages[e] != pytest.approx(zero.advantages[e])
    # None is no longer a way to say "missing": it is refused like any non-number
    with pytest.raises(ValueError, match="must be a number or Missing, got NoneType"):
        group_advantages({"a": 1.0, "d": None})  # type: ignore[dict-item]


def test_all_equal_group_gives_no_gradient():
    ga = group_advantages({"a": 0.0, "b": 0.0, "c": crashed()})
    assert ga.all_equal and ga.advantages == {"a": 0.0, "b": 0.0} and ga.n_scored == 2
    assert group_advantages({"a": crashed()}).n_scored == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", True, [1]])
def test_bad_rewards_are_refused(bad):
    with pytest.raises(ValueError, match="execution 'x'"):
        group_advantages({"x": bad, "y": 1.0})


def test_sample_std_option():
    p = group_advantages({"a": 1.0, "b": 0.0})
    s = group_advantages({"a": 1.0, "b": 0.0}, std="sample")
    assert p.advantages["a"] == pytest.approx(1.0, rel=1e-5)
    assert s.advantages["a"] == pytest.approx(0.5 / math.sqrt(0.5), rel=1e-5)
