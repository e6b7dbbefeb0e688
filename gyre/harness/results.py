"""The verifier's result file: which one is read, and what counts as a valid result.

A task names its result file in ``task.toml`` (``[gyre].result``, default
``"reward.txt"``, Harbor's convention) and only that file is read: the code
under test runs inside many verifiers (pytest imports the harness's module), so
it can write any file the verifier can; a ``reward.json`` planted next to
pytest's ``junit.xml`` must not win because it happens to be looked at first.

Each format is checked, not trusted (:class:`ResultError` says what is wrong,
quoting a few bytes at most):

- ``reward.txt``: one finite number in [0, 1];
- ``reward.json``: ``{"reward": x}`` with x a finite number in [0, 1], or
  ``{"passed": p, "total": t}`` with integers ``0 <= p <= t <= 10**9``;
- ``junit.xml``: every ``testsuite``'s ``tests``/``failures``/``errors``/
  ``skipped`` are plain non-negative integers (at most 9 digits),
  ``failures + errors + skipped <= tests``, and at least one test in all.

So every rule's result lies in [0, 1]. Parsing is pure (bytes in, result out);
reading goes through :mod:`gyre.harness.safe_read`.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from .safe_read import UnsafeFile, quote, read_at

RESULT_FILES = ("reward.txt", "reward.json", "junit.xml")
_MAX_COUNT = 10**9
_COUNT = re.compile(r"[0-9]{1,9}")
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")
_TOLERANCE = 1e-9  # 1.0000000001 from float arithmetic is still 1


class ResultError(Exception):
    """The verifier's result file is not a valid result; the message says why."""


@dataclass(frozen=True)
class VerifierResult:
    reward: float | None  # None: counts instead
    passed: int | None
    total: int | None
    source: str


def read_result(reward_dir_fd: int, name: str) -> VerifierResult | None:
    """The result in file ``name`` of the reward folder, or None if the verifier wrote none."""
    try:
        data = read_at(reward_dir_fd, name)
    except UnsafeFile as e:
        raise ResultError(str(e)) from None
    return None if data is None else parse_result(name, data)


def parse_result(name: str, data: bytes) -> VerifierResult:
    """Check and parse the bytes of result file ``name``; pure."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ResultError(f"{name} is not UTF-8 text (starts {quote(data)})") from None
    if name == "reward.txt":
        return VerifierResult(_reward(text.strip(), name), None, None, name)
    if name == "reward.json":
        return _reward_json(text)
    if name == "junit.xml":
        return _junit(text)
    raise ResultError(f"unknown result file {name!r} (one of {', '.join(RESULT_FILES)})")


def _reward(v: Any, where: str) -> float:
    if isinstance(v, str):
        if len(v) > 40 or not _NUMBER.fullmatch(v):
            raise ResultError(f"{where}: {quote(v)} is not a number")
        x = float(v)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            x = float(v)
        except OverflowError:  # a 5000-digit JSON integer
            raise ResultError(f"{where}: the reward is not a finite number") from None
    else:
        raise ResultError(f"{where}: the reward {quote(repr(v))} is not a number")
    if not math.isfinite(x) or not -_TOLERANCE <= x <= 1 + _TOLERANCE:
        raise ResultError(f"{where}: the reward {quote(repr(x))} is not a number in [0, 1]")
    return min(1.0, max(0.0, x))


def _count(v: Any, what: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_COUNT:
        raise ResultError(
            f"{where}: {what} must be an integer in [0, {_MAX_COUNT}], got {quote(repr(v))}"
        )
    return v


def _reward_json(text: str) -> VerifierResult:
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):  # bad JSON, a 5000-digit integer, 100k nested lists
        raise ResultError(f"reward.json is not valid JSON (starts {quote(text)})") from None
    if not isinstance(d, dict):
        raise ResultError("reward.json must hold an object")
    if "passed" in d and "total" in d:
        p = _count(d["passed"], "passed", "reward.json")
        t = _count(d["total"], "total", "reward.json")
        if p > t:
            raise ResultError(f"reward.json: passed ({p}) is more than total ({t})")
        return VerifierResult(None, p, t, "reward.json")
    if "reward" in d:
        return VerifierResult(_reward(d["reward"], "reward.json"), None, None, "reward.json")
    raise ResultError("reward.json has neither 'reward' nor 'passed'/'total'")


def _junit(text: str) -> VerifierResult:
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, ValueError, RecursionError):
        raise ResultError(f"junit.xml is not well-formed XML (starts {quote(text)})") from None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = bad = skipped = 0
    for s in suites:
        n = {k: _junit_count(s.get(k, "0"), k) for k in ("tests", "failures", "errors", "skipped")}
        if n["failures"] + n["errors"] + n["skipped"] > n["tests"]:
            raise ResultError(
                f"junit.xml: failures + errors + skipped ({n['failures']} + {n['errors']} + "
                f"{n['skipped']}) is more than tests ({n['tests']})"
            )
        tests += n["tests"]
        bad += n["failures"] + n["errors"]
        skipped += n["skipped"]
    if tests < 1 or tests > _MAX_COUNT:
        raise ResultError(f"junit.xml reports {tests} tests (at least 1 expected)")
    total = tests - skipped
    return VerifierResult(None, total - bad, total, "junit.xml")


def _junit_count(v: str, what: str) -> int:
    if not _COUNT.fullmatch(v):
        raise ResultError(f"junit.xml: {what}={quote(v)} is not a non-negative integer")
    return int(v)
