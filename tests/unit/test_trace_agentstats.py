"""Per-step agent figures (gyre.trace.agentstats): turns, harness cuts, tree sharing."""

from __future__ import annotations

from gyre.trace.admission import admit
from gyre.trace.agentstats import (
    agent_metrics,
    quantile,
    timeout_sums,
    tree_figures,
    tree_sums,
    turn_histogram,
    turn_sums,
)
from gyre.trace.record import OutputSegment, TraceRecord
from gyre.trace.toolhealth import ToolHealth
from gyre.trace.tree import build_tree


def rec(seq: int, suffix: tuple[int, ...], out: tuple[int, ...] = (8, 9)) -> TraceRecord:
    return TraceRecord(
        execution_id="e",
        request_id=f"e-{seq}",
        seq=seq,
        api="openai.chat",
        base=None,
        base_len=0,
        input_suffix=suffix,
        output_ids=out,
        output_logprobs=tuple(-0.5 for _ in out),
        segments=(OutputSegment(0, len(out), "e0", 0),),
        finish_reason="stop",
        meta={},
    )


def test_turn_histogram_and_quantiles():
    sums = turn_sums([1, 1, 3, 5, 1, 0])
    assert sums == {
        "agentstats/turns/0": 1,
        "agentstats/turns/1": 3,
        "agentstats/turns/3": 1,
        "agentstats/turns/5": 1,
    }
    # two groups' sums added key by key, as a step's record adds them
    more = turn_sums([3, 3])
    step = {k: sums.get(k, 0) + more.get(k, 0) for k in {*sums, *more}}
    hist = turn_histogram({**step, "tools/calls": 9, "agentstats/turns/x": 1})
    assert hist == {0: 1, 1: 3, 3: 3, 5: 1}
    assert quantile(hist, 0.1) == 0  # nearest rank: ceil(0.8) = 1st of 8
    assert quantile(hist, 0.5) == 1  # 4th of 8
    assert quantile(hist, 0.9) == 5  # 8th of 8
    assert quantile(hist, 1.0) == 5
    assert quantile({}, 0.5) is None
    assert turn_sums([]) == {}


def test_timeout_sums():
    outcomes = [
        ("harness_timeout", True),
        ("harness_timeout", False),
        ("exited", True),
        ("overall_timeout", True),
        (None, True),
    ]
    assert timeout_sums(outcomes) == {
        "agentstats/harness_timeout": 2,
        "agentstats/harness_timeout_scored": 1,
    }
    assert timeout_sums([]) == {
        "agentstats/harness_timeout": 0,
        "agentstats/harness_timeout_scored": 0,
    }


def test_tree_figures_count_shared_prefixes_once():
    # three calls sharing the prompt (5, 6): three paths of 3 + 2 tokens each
    recs = [rec(0, (5, 6, 7)), rec(1, (5, 6, 10)), rec(2, (5, 6, 11))]
    tree = build_tree(recs, execution_id="e")
    adm = admit(tree, None, seed=0)
    fig = tree_figures(adm)
    assert fig == {
        "paths": 3,
        "paths_admitted": 3,
        "tokens_unique": 2 + 3 * 3,
        "tokens_flat": 3 * 5,
    }
    # j_max = 1: one path admitted, nothing shared
    one = tree_figures(admit(tree, 1, seed=0))
    assert one == {"paths": 3, "paths_admitted": 1, "tokens_unique": 5, "tokens_flat": 5}
    assert tree_sums([adm, admit(tree, 1, seed=0)]) == {
        "agentstats/tree/paths": 6,
        "agentstats/tree/paths_admitted": 4,
        "agentstats/tree/tokens_unique": 16,
        "agentstats/tree/tokens_flat": 20,
    }
    assert tree_sums([]) == {
        f"agentstats/tree/{k}": 0
        for k in ("paths", "paths_admitted", "tokens_unique", "tokens_flat")
    }


def test_agent_metrics_of_a_step():
    sums = {
        **ToolHealth(executions=4, turns=10, calls=6).sums("reference"),
        **turn_sums([1, 2, 2, 5]),
        **timeout_sums([("harness_timeout", True), ("exited", True)]),
        "agentstats/tree/paths": 6,
        "agentstats/tree/paths_admitted": 4,
        "agentstats/tree/tokens_unique": 16,
        "agentstats/tree/tokens_flat": 20,
    }
    m = agent_metrics(sums)
    assert m == {
        "agent/tool_calls_per_exec_mean": 1.5,
        "agent/turns_mean": 2.5,
        "agent/turns_p10": 1,
        "agent/turns_p50": 2,
        "agent/turns_p90": 5,
        "agent/turns_max": 5,
        "agent/turns_hist": {"1": 1, "2": 2, "5": 1},
        "agent/harness_timeout": 1,
        "agent/harness_timeout_scored": 1,
        "tree/paths": 6,
        "tree/paths_admitted": 4,
        "tree/tokens_unique": 16,
        "tree/tokens_flat": 20,
        "tree/flat_over_tree": 1.25,
    }


def test_agent_metrics_of_nothing():
    assert agent_metrics({}) == {}
    assert agent_metrics({"reward_sum": 1.0, "scored": 2}) == {}
    # a step whose executions were all missing: zero trees, no ratio to divide by
    m = agent_metrics({**tree_sums([]), **timeout_sums([])})
    assert m["tree/flat_over_tree"] == 0.0
    assert m["tree/paths"] == 0 and m["agent/harness_timeout"] == 0
