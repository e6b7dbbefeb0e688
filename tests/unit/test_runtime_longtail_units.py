"""The long-tail workload of ``gyre run``: draw -> execution mapping, the paced synthetic harness,
and the costs measured from a run's records (gyre.runtime.longtail, gyre.runtime.measure)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from gyre.config import load_config
from gyre.harness.synthetic import main as synthetic
from gyre.runtime import measure
from gyre.runtime.longtail import (
    CALL_EVERY_ENV,
    DURATION_ENV,
    POOL_EXTRA_BATCHES,
    LongTail,
    LongTailConfig,
)
from gyre.runtime.measure import Call
from gyre.sim.config import WorkloadConfig
from gyre.sim.workload import draw_workload

CFG = LongTailConfig(median_s=4.0, tail=0.8, query_sigma=0.5, harness_timeout_s=12.0)


def test_execution_g_a_gets_entry_g_a_of_the_simulators_draw():
    lt = LongTail(CFG, seed=3, total_steps=12, batch_groups=2, n=8)
    ref = draw_workload(
        WorkloadConfig(median_h=4.0, tail=0.8, query_sigma=0.5, harness_timeout_h=12.0),
        2 * (12 + POOL_EXTRA_BATCHES),
        8,
        3,
    )
    assert lt.groups == ref.groups
    for g in range(lt.groups):
        for a in range(8):
            p = lt.planned(g, a)
            assert p.duration_s == ref.duration_h[g, a]
            assert p.harness_timeout == bool(ref.harness_timeout[g, a])
    # a long tail: the slowest attempt of a group is far above the typical one
    assert ref.query_h().mean() > 2 * np.median(ref.duration_h)


def test_the_draw_depends_on_seed_steps_and_b_only_so_every_placement_sees_it():
    """(phi, mu) and the placement are not inputs: the pool is B * (steps + 8) for all of them."""
    a = LongTail(CFG, 0, 12, 2, 8)
    b = LongTail(CFG, 0, 12, 2, 8)
    assert np.array_equal(a.draw.duration_h, b.draw.duration_h)
    assert not np.array_equal(a.draw.duration_h, LongTail(CFG, 1, 12, 2, 8).draw.duration_h)


def test_capped_executions_stop_at_the_cap_themselves_the_executor_is_only_a_safety_net():
    lt = LongTail(CFG, 0, 12, 2, 8)
    capped = [(g, a) for g in range(lt.groups) for a in range(8) if lt.draw.harness_timeout[g, a]]
    assert capped, "the draw should hit the 12 s harness timeout somewhere"
    g, a = capped[0]
    p = lt.planned(g, a)
    assert p.duration_s == p.run_s == CFG.harness_timeout_s  # the same cap in every placement
    assert lt.executor_harness_timeout_s == CFG.harness_timeout_s + 2.0
    env = lt.env(g, a)
    assert float(env[DURATION_ENV]) == pytest.approx(p.run_s) and env[CALL_EVERY_ENV] == "1.5"
    free = next(
        (g, a) for g in range(lt.groups) for a in range(8) if not lt.draw.harness_timeout[g, a]
    )
    assert lt.planned(*free).run_s == lt.planned(*free).duration_s


def test_overall_timeout_makes_missing_executions():
    cfg = CFG.model_copy(update={"overall_timeout_s": 6.0, "harness_timeout_s": 30.0})
    lt = LongTail(cfg, 0, 12, 2, 8)
    missing = np.argwhere(lt.draw.missing)
    assert len(missing)
    p = lt.planned(*map(int, missing[0]))
    assert p.missing and p.duration_s == 6.0 and p.run_s > 6.0


def test_a_group_beyond_the_pool_is_refused_with_the_reason():
    lt = LongTail(CFG, 0, 2, 2, 4)
    with pytest.raises(ValueError, match="beyond the long-tail draw"):
        lt.planned(lt.groups, 0)


def test_run_longtail_section_parses(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('model_dir = "m"\n[policy]\nplacement = "elastic"\n[run.longtail]\nmedian_s = 2\n')
    cfg = load_config(str(p), [])
    assert cfg.run.longtail is not None and cfg.run.longtail.median_s == 2.0
    with pytest.raises(ValueError):
        load_config(str(p), ["run.longtail.median_s=0"])


# ------------------------------------------------------------------ the paced synthetic harness
class _Chat(BaseHTTPRequestHandler):
    calls: list[float] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        _Chat.calls.append(time.monotonic())
        body = json.dumps({"choices": [{"message": {"content": "aaa"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_paced_harness_runs_for_the_given_duration_and_writes_its_reply(tmp_path, monkeypatch):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DURATION_ENV, "0.6")
    monkeypatch.setenv(CALL_EVERY_ENV, "0.2")
    _Chat.calls = []
    t0 = time.monotonic()
    try:
        rc = synthetic(
            ["--base-url", f"http://127.0.0.1:{srv.server_port}/v1", "--reply-file", "answer.txt"]
        )
    finally:
        srv.shutdown()
    took = time.monotonic() - t0
    assert rc == 0
    assert len(_Chat.calls) == 3  # round(0.6 / 0.2)
    assert 0.6 <= took < 1.5
    # calls spread over the duration on the wall clock, not bunched at the start
    assert _Chat.calls[-1] - _Chat.calls[0] == pytest.approx(0.4, abs=0.15)
    assert (tmp_path / "answer.txt").read_text() == "aaa"


# ------------------------------------------------------------------ costs from the run's records
def test_microstep_is_the_mean_over_claims_empty_shares_included():
    micros = [(0, 1, 0.0, 0.4), (1, -1, 0.0, 0.0), (1, -1, 1.0, 1.0), (0, 1, 2.0, 2.4)]
    assert measure.microstep_s(micros) == pytest.approx(0.2)
    assert measure.microstep_s([]) is None


def test_refresh_is_the_extra_time_of_a_satellites_first_micro_step_at_a_new_version():
    segments = [[], [(0.0, 10.0, "training"), (10.0, 12.0, "to_rollout"), (12.0, 20.0, "training")]]
    micros = [
        (1, 3, 1.0, 1.1),
        (1, 3, 2.0, 2.1),
        (1, 4, 3.0, 3.4),  # version changed within the stint: pulled the new snapshot
        (1, 4, 4.0, 4.1),
        (1, 5, 13.0, 13.1),  # first in a new stint: the switch loaded it, no refresh
        (0, 4, 3.0, 3.1),  # the core never pulls
    ]
    assert measure.refresh_s(micros, segments) == pytest.approx(0.3)
    assert measure.refresh_s(micros[:2], segments) is None


def _call(start, end, engines=1, versions=((0, 8),), tokens=8):
    return Call(0, 0, start, end, tokens, engines, versions)


def test_reroute_delay_and_token_staleness():
    calls = [_call(0, 0.1), _call(1, 1.1), _call(2, 2.1), _call(3, 3.6, engines=2)]
    assert measure.reroute_delay_s(calls) == pytest.approx(0.5)
    assert measure.reroute_delay_s(calls[:3]) is None
    # 8 tokens served at version 2, 24 at version 4: trained at version 5 -> (8*3 + 24*1) / 32
    st = measure.token_staleness(5, [_call(0, 1, versions=((2, 8), (4, 24)))])
    assert st == pytest.approx(1.5)
    assert measure.steady_from(1.5, 1) == 3 and measure.steady_from(0.0, 4) == 4


def test_rollout_speed_is_relative_to_the_least_loaded_bin():
    capacity = [(0.0, 100.0, 4.0)]
    # one execution running during calls at t=1 (occupancy 1/4), four during t=51 (occupancy 1)
    execs = [(0.0, 100.0)] + [(50.0, 60.0)] * 3
    calls = [_call(1, 2, tokens=10), _call(51, 53, tokens=10)]
    assert measure.rollout_speed(calls, execs, capacity) == [[0.25, 1.0], [1.0, 0.5]]
    assert measure.rollout_speed([], execs, capacity) == []


def test_serving_staleness_weighs_executions_alike_tokens_weigh_long_ones_more():
    long = [_call(0, 9, versions=((2, 30),))]  # a long-tail execution: many tokens, old weights
    short = [_call(0, 1, versions=((5, 2),))]
    assert measure.serving_staleness(5, [long, short, []]) == pytest.approx(1.5)
    assert measure.token_staleness(5, long + short) == pytest.approx(90 / 32)
    assert measure.serving_staleness(5, [[]]) is None
