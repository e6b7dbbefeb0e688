"""The chaos audit's verdicts from a run directory written by hand: a core restart's new
segment counts its proxy's answers against its own trace records only, and a kill whose
restart was under way at the end is told apart from one handled."""

from __future__ import annotations

import json
from pathlib import Path

from gyre.runtime.chaos_audit import audit


def _rec(eid: str, seq: int, t_end: float, finish: str = "stop") -> str:
    return json.dumps({"execution_id": eid, "seq": seq, "t_end": t_end, "finish_reason": finish})


def _rundir(tmp_path: Path, answered: int, faults: list[dict], chaos: list[dict]) -> Path:
    rd = tmp_path / "run"
    (rd / "traces").mkdir(parents=True)
    # segment 0 answered two calls (and one aborted); segment 1, from t=100, three
    (rd / "traces" / "r0-g00000-a00.jsonl").write_text(
        "\n".join([_rec("r0-g00000-a00", 0, 10.0), _rec("r0-g00000-a00", 1, 20.0)]) + "\n"
    )
    (rd / "traces" / "r1-g00000-a00.jsonl").write_text(
        "\n".join(
            [
                _rec("r1-g00000-a00", 0, 30.0, "abort"),
                _rec("r1-g00000-a00", 1, 101.0),
                _rec("r1-g00000-a00", 2, 102.0),
                _rec("r1-g00000-a00", 3, 103.0),
            ]
        )
        + "\n"
    )
    rows = [
        {
            "group": 0,
            "attempt": 0,
            "execution": "r1-g00000-a00",
            "failed": False,
            "model_calls": {"attempted": 3, "answered": 3},
        },
    ]
    (rd / "executions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rd / "metrics.jsonl").write_text(json.dumps({"groups": ["g0"]}) + "\n")
    summary = {
        "steps": 1,
        "makespan_s": 50.0,
        "faults": faults,
        "chaos": chaos,
        "proxy": {"answered": answered, "errors_5xx": 0},
    }
    (rd / "summary.json").write_text(json.dumps(summary))
    return rd


CORE = {
    "cell": 0,
    "kind": "died",
    "core_restart": 1,
    "restart_unix_time": 100.0,
    "executions_cut": 1,
    "time": 5.0,
}


def test_a_new_segment_counts_its_own_answers_only(tmp_path):
    a = audit(_rundir(tmp_path, 3, [CORE], []), group_size=1)
    assert a["answered_counter_gap"] == 0 and a["answered_missing"] == 0
    assert a["cut_by_core_restart"] == 1


def test_a_missing_record_in_the_segment_shows_as_a_gap(tmp_path):
    assert audit(_rundir(tmp_path, 4, [CORE], []), group_size=1)["answered_counter_gap"] == 1
    # one segment: every record counts (the counter saw all five answers)
    assert audit(_rundir(tmp_path / "b", 5, [], []), group_size=1)["answered_counter_gap"] == 0


def test_a_restart_under_way_at_the_end_is_not_counted_handled(tmp_path):
    kills = [
        {
            "kind": "rollout_cell",
            "time": 5.0,
            "target": {"cell": 1},
            "action": "restart",
            "handled": True,
            "back_s": 9.0,
        },
        {"kind": "satellite", "time": 45.0, "target": {"cell": 2}, "action": "restart"},
    ]
    a = audit(_rundir(tmp_path, 5, [], kills), group_size=1)
    assert a["handled"] == 1 and a["restarting_at_end"] == 1
    assert a["kills"] == {"rollout_cell": 1, "satellite": 1}
