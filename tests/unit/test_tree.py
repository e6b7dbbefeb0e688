"""Trajectory tree construction from delta-encoded trace records."""

from __future__ import annotations

from collections import Counter

import pytest

from gyre.trace import OutputSegment, TraceRecord, TraceWriter, build_tree, read_trace
from gyre.trace.roles import Condition, Role, RoleProfile, RoleRule
from gyre.trace.synthetic import case_study_execution, small_execution
from gyre.trace.tree import TreeBuildError


def rec(rid, seq, inp, out, base=None, base_len=0, eid="e", meta=None, lps=None, segs=None):
    out = tuple(out)
    return TraceRecord(
        execution_id=eid,
        request_id=rid,
        seq=seq,
        api="openai.chat",
        base=base,
        base_len=base_len,
        input_suffix=tuple(inp),
        output_ids=out,
        output_logprobs=tuple(lps)
        if lps is not None
        else tuple(-0.1 * (k + 1) for k in range(len(out))),
        segments=segs
        if segs is not None
        else ((OutputSegment(0, len(out), "e0", 7),) if out else ()),
        meta=meta or {},
    )


def full_sequences(records):
    full = {}
    for r in sorted(records, key=lambda r: r.seq):
        base = full[r.base][0] + full[r.base][1] if r.base else []
        inp = base[: r.base_len] + list(r.input_suffix)
        full[r.request_id] = (inp, list(r.output_ids))
    return full


def request_indices(tree, ri):
    out = []
    for _d0, g0, ln in tree.requests[ri].pieces:
        out.extend(range(g0, g0 + ln))
    return out


@pytest.fixture(scope="module")
def case():
    recs = case_study_execution()
    return recs, build_tree(recs)


def test_case_study_shape(case):
    recs, tree = case
    assert len(recs) == 636 and not tree.errors
    assert len(tree.leaves) == 10
    roles = Counter(tree.leaf_role(lf).value for lf in tree.leaves)
    assert roles == {"main": 2, "main-summary": 1, "sub-agent": 6, "sub-agent-summary": 1}
    assert 450_000 <= len(tree) <= 560_000  # ~500K unique tokens
    # expanding the paths repeats shared prefixes
    expanded = sum(len(tree.path_tokens(lf)) for lf in tree.leaves)
    assert expanded > 1.2 * len(tree)  # the paper: 1,716 node occurrences for 1,347 nodes (1.27x)


def test_every_request_reconstructs_and_targets_are_outputs(case):
    recs, tree = case
    full = full_sequences(recs)
    for ri, info in enumerate(tree.requests):
        inp, out = full[info.request_id]
        assert tree.request_sequence(ri) == inp + out
        idx = request_indices(tree, ri)
        # every sampled token is a target at its position, with its behaviour log-prob
        assert all(tree.is_target[g] for g in idx[len(inp) :])
        assert tree.depth[idx[-1]] == len(inp) + len(out) - 1


def test_pasted_summary_is_context_where_pasted(case):
    recs, tree = case
    summ = next(
        r
        for r in recs
        if "Summarize" in r.meta.get("last_user_head", "") and r.meta["system_sha1"] == "main"
    )
    restart = recs[summ.seq + 1]  # phase 2 starts with system + task + summary
    assert restart.base is None
    ri = tree.by_id[restart.request_id]
    idx = request_indices(tree, ri)
    n_in = len(restart.input_suffix)
    pasted = idx[n_in - len(summ.output_ids) : n_in]
    assert [tree.tokens[g] for g in pasted] == list(summ.output_ids)
    assert not any(tree.is_target[g] for g in pasted)
    # while the summary's own output is a target in its original context
    sidx = request_indices(tree, tree.by_id[summ.request_id])
    assert all(tree.is_target[g] for g in sidx[-len(summ.output_ids) :])


def test_branching_and_sharing():
    r0 = rec("a", 0, [1, 2, 3], [4, 5])
    r1 = rec("b", 1, [6], [7], base="a", base_len=5)  # extends a
    r2 = rec("c", 2, [9], [8], base="a", base_len=3)  # diverges after a's input (a retry)
    r3 = rec(
        "d", 3, [1, 2, 3, 4, 5, 6], [7, 2]
    )  # full render that re-joins b's path, then continues
    tree = build_tree([r3, r1, r0, r2])
    assert not tree.errors
    assert len(tree) == 3 + 2 + 2 + 2 + 1  # 1 2 3 | 4 5 6 7 | 9 8 | 2
    assert len(tree.leaves) == 2 and len(tree.nodes) == 3
    # 4 and 5 are a's outputs (targets) even though b and d see them as input
    ga = request_indices(tree, tree.by_id["a"])
    assert [tree.is_target[g] for g in ga] == [0, 0, 0, 1, 1]
    assert [tree.logprob[g] for g in ga[3:]] == [-0.1, -0.2]
    gd = request_indices(tree, tree.by_id["d"])
    assert gd[:7] == request_indices(tree, tree.by_id["b"])  # shared, not duplicated
    # leaf role = last request on its path; d (seq 3) is the last on the b/d path
    leaf_req = {tree.requests[tree.leaf_request[lf]].request_id for lf in tree.leaves}
    assert leaf_req == {"c", "d"}


def test_versions_come_from_segments():
    r0 = rec(
        "a",
        0,
        [1, 2],
        [3, 4, 5, 6],
        segs=(OutputSegment(0, 1, "e0", 3), OutputSegment(1, 4, "e1", 4)),
    )
    tree = build_tree([r0])
    g = request_indices(tree, 0)
    assert [tree.version[x] for x in g] == [-1, -1, 3, 4, 4, 4]


def test_roles_from_profile_and_leaf_takes_last_request_role():
    prof = RoleProfile(
        name="t",
        rules=(
            RoleRule(
                role=Role.SUB_AGENT,
                when=(Condition(key="headers.x-agent", op="equals", value="sub"),),
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY,
                when=(Condition(key="tools", op="contains", value="Summarize"),),
            ),
        ),
    )
    r0 = rec("a", 0, [1, 2], [3], meta={"headers": {"x-agent": "main"}})
    r1 = rec("b", 1, [4], [5], base="a", base_len=3, meta={"tools": ["Summarize"]})
    r2 = rec("c", 2, [9, 9], [8], meta={"headers": {"x-agent": "sub"}})
    tree = build_tree([r0, r1, r2], prof)
    assert [r.role for r in tree.requests] == [Role.MAIN, Role.MAIN_SUMMARY, Role.SUB_AGENT]
    assert sorted(tree.leaf_role(lf).value for lf in tree.leaves) == ["main-summary", "sub-agent"]
    assert RoleProfile.model_validate_json(prof.model_dump_json()) == prof


def test_bad_records_are_named_and_the_rest_is_usable(tmp_path):
    good = [rec("a", 0, [1, 2, 3], [4, 5]), rec("b", 1, [6], [7], base="a", base_len=5)]
    bad = [
        rec("lp", 2, [1], [2, 3], lps=[-0.1]),  # mismatched log-prob length
        rec("oov", 3, [1, 5000], [2]),  # out of vocabulary
        rec("nobase", 4, [1], [2], base="ghost", base_len=1),  # base missing
        rec("child", 5, [1], [2], base="nobase", base_len=2),  # base was unusable
        rec("long", 6, [1], [2], base="a", base_len=99),  # base_len beyond base
        rec("empty", 7, [8], [], base="b", base_len=7),  # empty output: kept as context
        rec("a", 8, [1], [2]),  # duplicate id
        rec("other", 9, [1], [2], eid="f"),  # other execution
    ]
    w = TraceWriter(tmp_path, fsync=False)
    for r in good + bad:
        w.append(r)
    w.close()
    path = tmp_path / "e.jsonl"
    other = tmp_path / "f.jsonl"
    lines = path.read_text().splitlines() + other.read_text().splitlines()
    lines.insert(2, lines[0][: len(lines[0]) // 2])  # a truncated record
    path.write_text("\n".join(lines) + "\n")
    res = read_trace(path, vocab_size=2048)
    assert any("truncated" in e for e in res.errors)
    assert any("'lp'" in e and "log-probs" in e for e in res.errors)
    assert any("'oov'" in e and "5000" in e for e in res.errors)
    tree = build_tree(res.records, vocab_size=2048)
    msgs = "\n".join(tree.errors)
    for rid in ("nobase", "child", "long", "empty", "other"):
        assert f"'{rid}'" in msgs, rid
    assert "duplicate" in msgs
    assert sum(1 for r in tree.requests) == 3  # a, b, empty
    assert tree.request_sequence(tree.by_id["b"]) == [1, 2, 3, 4, 5, 6, 7]
    assert tree.n_targets == 3
    # the tree-level validator also catches records that never went through read_trace
    t2 = build_tree([good[0], rec("lp", 1, [1], [2, 3], lps=[-0.1])], vocab_size=2048)
    assert len(t2.requests) == 1 and "'lp'" in t2.errors[0]
    with pytest.raises(TreeBuildError, match="'nobase'"):
        build_tree(good + [bad[2]], strict=True)


def test_output_without_input_is_rejected():
    tree = build_tree([rec("x", 0, [], [1, 2]), rec("y", 1, [3], [4])])
    assert len(tree.requests) == 1 and "'x'" in tree.errors[0]


def test_small_execution_builds():
    tree = build_tree(small_execution())
    assert not tree.errors and len(tree.leaves) == 7
