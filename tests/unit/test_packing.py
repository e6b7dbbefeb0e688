"""Packing admitted executions into micro-steps (pure python side)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gyre.trace import MicroStep, PackedSequence, PackingError, admit, build_tree, pack
from gyre.trace.synthetic import case_study_execution, small_execution


def _admissions(n=3, j_max=None):
    out = []
    for i in range(n):
        tree = build_tree(small_execution(f"ex{i}", seed=i))
        out.append(admit(tree, j_max, seed=i))
    return out


def _targets(steps):
    got = defaultdict(list)
    for s in steps:
        for row in s.sequences:
            for i, t in enumerate(row.is_target):
                if t:
                    got[s.executions[row.execution_index[i]]].append(row.tree_index[i])
    return got


@pytest.mark.parametrize("mode", ["paths", "tree"])
@pytest.mark.parametrize("budget", [40, 150, 10_000])
def test_pack_covers_every_admitted_target_once_with_unit_weight(mode, budget):
    adms = _admissions()
    steps = pack(adms, mode, budget)
    assert all(isinstance(s, MicroStep) and s.mode == mode for s in steps)
    got = _targets(steps)
    for a in adms:
        want = sorted(t for p in a.paths for t in p.targets.tolist())
        assert sorted(got[a.execution_id]) == want
    wsum = defaultdict(float)
    for s in steps:
        for row in s.sequences:
            row.validate()
            for i, w in enumerate(row.token_weight):
                if w:
                    assert row.is_target[i]
                    wsum[s.executions[row.execution_index[i]]] += w
            # packed tokens carry the tree's data, and a target its model call (1-based)
            for i, t in enumerate(row.is_target):
                if t:
                    assert row.behaviour_logprob[i] < 0 and row.policy_version[i] >= 0
                    a = adms[
                        [x.execution_id for x in adms].index(s.executions[row.execution_index[i]])
                    ]
                    req = a.tree.requests[a.tree.source[row.tree_index[i]]]
                    assert row.turn[i] == req.seq + 1 >= 1
                else:
                    assert row.turn[i] == -1
    assert all(v == pytest.approx(1.0) for v in wsum.values()) and len(wsum) == len(adms)


@pytest.mark.parametrize("mode", ["paths", "tree"])
def test_budget_respected_unless_a_single_path_is_longer(mode):
    adms = _admissions()
    budget = 60
    longest = max(int(a.tree.depth[p.last_target]) + 1 for a in adms for p in a.paths)
    for s in pack(adms, mode, budget):
        assert s.n_tokens <= max(budget, longest)


def test_tree_mode_stores_shared_prefixes_once():
    tree = build_tree(
        case_study_execution(
            n_requests=120,
            n_subagents=3,
            system_len=300,
            task_len=50,
            out_len=(20, 60),
            tool_len=(20, 80),
            summary_len=(30, 60),
        )
    )
    adm = admit(tree, None, 0)
    p = sum(s.n_tokens for s in pack([adm], "paths", 10**7))
    t = sum(s.n_tokens for s in pack([adm], "tree", 10**7))
    assert t < p
    assert t <= len(tree)  # never more than the unique tokens
    (step,) = pack([adm], "tree", 10**7)
    assert len(step.sequences) == 1 and step.executions == [tree.execution_id]


def test_dropped_and_duplicate_executions():
    adms = _admissions(2)
    adms[1].dropped = True
    assert adms[1].weight == 0.0
    steps = pack(adms, "tree", 10_000)
    assert {e for s in steps for e in s.executions} == {adms[0].execution_id}
    with pytest.raises(PackingError, match="twice"):
        pack([adms[0], adms[0]], "tree", 100)
    with pytest.raises(ValueError):
        pack(adms, "bogus", 100)


def test_validate_rejects_broken_rows():
    row = PackedSequence.from_chain([5, 6, 7])
    row.validate()
    row.position_ids[2] = 7
    with pytest.raises(PackingError, match="depth"):
        row.validate()
    row = PackedSequence.from_chain([5, 6, 7])
    row.is_target[0] = True
    with pytest.raises(PackingError, match="predecessor"):
        row.validate()


def test_admissions_pickle_for_ray():
    """Admissions (with their trees) cross process boundaries (Ray) and pack the same afterwards."""
    import pickle

    adms = _admissions(2, j_max=3)
    pack(adms, "tree", 10_000)  # populates the packer's numpy cache on the trees
    again = pickle.loads(pickle.dumps(adms))
    for mode in ("paths", "tree"):
        a = pack(adms, mode, 10_000)
        b = pack(again, mode, 10_000)
        assert [s.sequences for s in a] == [s.sequences for s in b]


def test_weights_sum_to_one_is_one_rule_with_a_named_tolerance():
    from gyre.trace.packing import (
        ACCUMULATED_WEIGHT_SUM_TOL,
        WEIGHT_SUM_TOL,
        weights_sum_to_one,
    )

    third = 1.0 / 3.0
    assert weights_sum_to_one(third + third + third)
    assert weights_sum_to_one(1.0 + WEIGHT_SUM_TOL / 2)
    assert not weights_sum_to_one(1.0 + 2 * WEIGHT_SUM_TOL)
    assert weights_sum_to_one(1.0 + 2 * WEIGHT_SUM_TOL, ACCUMULATED_WEIGHT_SUM_TOL)
    assert not weights_sum_to_one(float("nan"))  # a NaN weight is never "fine"
    assert not weights_sum_to_one(0.5)
