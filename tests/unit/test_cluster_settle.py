"""The run's end waits a bounded time for each cell's and engine's stop (``_settle``): one that
hangs is named in the driver's log and left to the kill that follows, never waited out."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gyre.runtime.cluster import SETTLE_S, _settle


async def _stop(seconds: float, fail: bool = False) -> str:
    await asyncio.sleep(seconds)
    if fail:
        raise RuntimeError("the stop itself failed")
    return "stopped"


def test_a_hung_stop_is_named_and_not_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> float:
        t0 = time.perf_counter()
        await _settle([_stop(0.0), _stop(60.0), _stop(0.0, fail=True)], "cells", 0.3)
        return time.perf_counter() - t0

    with caplog.at_level(logging.WARNING, logger="gyre.runtime.cluster"):
        took = asyncio.run(go())
    assert took < 5.0  # the timeout, not the hung stop's 60 s
    (rec,) = [r for r in caplog.records if "did not stop" in r.getMessage()]
    assert rec.getMessage() == "cells [1] did not stop within 0.3 s: killed"


def test_stops_that_answer_log_nothing_and_their_errors_are_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gyre.runtime.cluster"):
        asyncio.run(_settle([_stop(0.0), _stop(0.0, fail=True)], "standalone", 5.0))
        asyncio.run(_settle([], "standalone", 5.0))
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]


def test_an_embedded_engine_gets_less_time_than_a_vllm_server() -> None:
    assert SETTLE_S["embedded"] < SETTLE_S["vllm"]
