"""Cells as separate OS processes (torch.distributed gloo on 127.0.0.1, TCPStore claim queue).

One spawn of 3 processes runs several scenarios in turn (process + torch start-up is
paid once): the same batch trained by the core alone, by 3 cells splitting the
micro-steps evenly, by 3 cells of which two join after micro-steps were done, and
streamed (groups landing one by one) with late joiners. The same spawn then trains 3 steps
uninterrupted, and 3 steps with checkpoints in which satellite 1 is SIGKILLed mid-step
(ending the spawn); a second spawn of 2 cells resumes from the last checkpoint, then runs
the schedule again and SIGKILLs the core mid-step; a third spawn resumes that one.
"""

import json
import re

import pytest
from safetensors.torch import load_file

from gyre.train.config import CheckpointConfig, OptimConfig, StreamConfig, TrainerConfig
from gyre.train.demo.local import JoinPlan, KillPlan, LocalRun, SyntheticData, run_local

pytestmark = pytest.mark.slow


def _cfg(model_dir, **kw):
    return TrainerConfig(
        model_dir=str(model_dir),
        dtype="float64",
        stream=kw.pop("stream", StreamConfig(batch_groups=4, token_budget=64, stall_timeout_s=60)),
        optim=OptimConfig(lr=1e-3),
        **kw,
    )


def _diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


# run_local notices the SIGKILLed cell at once and stops the others; the stall timeout is only a backstop
STREAM_KILL = StreamConfig(batch_groups=2, token_budget=64, stall_timeout_s=60)
KILL_DATA = SyntheticData(n_groups=6, group_size=3, seed=11)
KILL_JOINS = {1: JoinPlan(after_done=1)}
KILL_CORE_CLAIMS = (
    1  # the core takes one micro-step per step, so satellite 1 always joins and works
)


@pytest.fixture(scope="module")
def cells_run(tiny_model_dir, tmp_path_factory):
    """One spawn of 3 cells runs every scenario; the last one kills satellite 1 mid-step,
    which ends the spawn (that is the point). Returns (out dir, the spawn's error)."""
    out = tmp_path_factory.mktemp("cells")
    cfg = _cfg(
        tiny_model_dir, stream=StreamConfig(batch_groups=6, token_budget=64, stall_timeout_s=60)
    )
    data = SyntheticData(
        n_groups=6, group_size=3, seed=1
    )  # packs into 12 micro-steps (asserted below)
    ck = CheckpointConfig(dir=str(out / "ck"))
    split_cfg = _cfg(
        tiny_model_dir, stream=StreamConfig(batch_groups=3, token_budget=96, stall_timeout_s=60)
    )
    split_data = SyntheticData(
        n_groups=3, group_size=3, seed=1, branches=3
    )  # 12 micro-steps, 4 split
    runs = [
        LocalRun(name="core_alone", cfg=cfg, data=data),
        LocalRun(
            name="even",
            cfg=cfg,
            data=data,
            core_max_claims=4,
            joins={1: JoinPlan(max_claims=4), 2: JoinPlan(max_claims=4)},
        ),
        # claim caps make sure every late joiner gets work (else the core could finish alone)
        LocalRun(
            name="late",
            cfg=cfg,
            data=data,
            core_max_claims=5,
            joins={1: JoinPlan(after_done=2, max_claims=4), 2: JoinPlan(after_done=4)},
        ),
        LocalRun(
            name="streamed_late",
            cfg=cfg,
            data=data,
            source="one_per_pump",
            core_max_claims=2,
            joins={1: JoinPlan(after_done=1, max_claims=6), 2: JoinPlan(after_done=2)},
        ),
        # executions of 3 branches over a 96-token budget: 4 of them span several micro-steps, whose
        # s_e pre-pass reads the other micro-steps from the store, whichever cell claimed them
        LocalRun(name="split_alone", cfg=split_cfg, data=split_data),
        LocalRun(
            name="split_even",
            cfg=split_cfg,
            data=split_data,
            core_max_claims=4,
            joins={1: JoinPlan(max_claims=4), 2: JoinPlan(max_claims=4)},
        ),
        LocalRun(
            name="full",
            cfg=_cfg(tiny_model_dir, stream=STREAM_KILL),
            data=KILL_DATA,
            steps=3,
            joins=KILL_JOINS,
            core_max_claims=KILL_CORE_CLAIMS,
        ),
        LocalRun(
            name="killed",
            cfg=_cfg(tiny_model_dir, stream=STREAM_KILL, checkpoint=ck),
            data=KILL_DATA,
            steps=3,
            joins=KILL_JOINS,
            core_max_claims=KILL_CORE_CLAIMS,
            kill=KillPlan(cell=1, step=2, after_micro_steps=1),
        ),
    ]
    err = None
    try:
        run_local(3, runs, out, timeout_s=300)
    except Exception as e:  # expected: the killed run
        err = e
    return out, err, ck


def test_one_vs_three_cells_vs_late_joiners(cells_run, tiny_model_dir):
    out, _, _ = cells_run
    names = ["core_alone", "even", "late", "streamed_late"]
    final = {n: load_file(str(out / n / "final.safetensors")) for n in names}
    m = {n: _lines(out / n / "metrics.jsonl")[0] for n in names}
    assert m["core_alone"]["train/participants"] == 1 and m["core_alone"]["train/micro_steps"] == 12
    # even split: 12 micro-steps, 4 each, over the 3-cell communicator
    assert m["even"]["train/participants"] == 3 and m["even"]["claims"] == {"0": 4, "1": 4, "2": 4}
    # late joiners: they joined after micro-steps were done, and still did work
    for name in ("late", "streamed_late"):
        cells = [json.loads((out / name / f"cell{c}.json").read_text())[0] for c in (1, 2)]
        assert all(c["joined"] and c["micro_steps"] >= 1 for c in cells), (name, cells)
        assert m[name]["train/participants"] == 3
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max(float((final["core_alone"][k] - base[k].double()).abs().max()) for k in base)
    assert moved > 5e-4  # the step changed the weights (AdamW first step ~ lr)
    for name in ("even", "late", "streamed_late"):
        assert _diff(final["core_alone"], final[name]) < 1e-9, name
        assert m[name]["actor/grad_norm"] == pytest.approx(
            m["core_alone"]["actor/grad_norm"], rel=1e-9
        )
        assert m[name]["actor/loss"] == pytest.approx(
            m["core_alone"]["actor/loss"], rel=1e-6
        )  # float32 l_t sums
        # the mismatch counters sum and its max max-reduces over the cells (summed, the max of
        # 3 cells' shares would exceed the one cell's)
        for c in ("same", "other"):
            for key in (f"tokens_{c}_version", f"max_abs_{c}_version", f"kl_{c}_version"):
                assert m[name][f"mismatch/{key}"] == pytest.approx(
                    m["core_alone"][f"mismatch/{key}"], rel=1e-6
                ), (name, key)
    # synthetic groups are sampled at versions g % 3 with noise: both classes, d != 0
    assert m["core_alone"]["mismatch/tokens_same_version"] > 0
    assert m["core_alone"]["mismatch/tokens_other_version"] > 0
    assert m["core_alone"]["mismatch/max_abs_same_version"] > 1e-4


def test_split_executions_across_cells(cells_run):
    out, _, _ = cells_run
    a, b = (_lines(out / n / "metrics.jsonl")[0] for n in ("split_alone", "split_even"))
    assert a["batch/executions_split"] == b["batch/executions_split"] == 4
    assert b["claims"] == {"0": 4, "1": 4, "2": 4}
    fa, fb = (load_file(str(out / n / "final.safetensors")) for n in ("split_alone", "split_even"))
    assert _diff(fa, fb) < 1e-9
    assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-9)


def _same_as_full(out, name):
    after = _lines(out / name / "metrics.jsonl")
    assert [d["step"] for d in after] == [0, 1, 2]
    full_m = _lines(out / "full" / "metrics.jsonl")
    trained = [g for d in after for g in d["groups"]]
    assert len(trained) == len(set(trained)) == 6  # no group twice, none lost
    assert [d["groups"] for d in after] == [d["groups"] for d in full_m]
    a = load_file(str(out / "full" / "final.safetensors"))
    b = load_file(str(out / name / "final.safetensors"))
    assert _diff(a, b) < 1e-12
    return after


def test_kill_a_replica_mid_step_and_resume(cells_run, tiny_model_dir, tmp_path):
    out, err, ck = cells_run
    assert err is not None and re.search("SIGKILL|StepStalled|signal", str(err)), err
    assert (out / "full" / "final.safetensors").exists()
    done = _lines(out / "killed" / "metrics.jsonl")
    assert [d["step"] for d in done] == [0, 1]  # step 2 never committed
    assert all(d["train/participants"] == 2 for d in done)
    # resume with a different number of cells (2): the checkpoint holds only core state.
    # The same spawn then runs the schedule again and SIGKILLs the *core* mid-step 1.
    resumed = LocalRun(
        name="killed",
        cfg=_cfg(tiny_model_dir, stream=STREAM_KILL, checkpoint=ck),
        data=KILL_DATA,
        steps=3,
        joins=KILL_JOINS,
        core_max_claims=KILL_CORE_CLAIMS,
        resume=True,
        fresh_store_namespace="-resume",
    )
    ck2 = CheckpointConfig(dir=str(out / "ck2"))
    core_killed = LocalRun(
        name="core_killed",
        cfg=_cfg(tiny_model_dir, stream=STREAM_KILL, checkpoint=ck2),
        data=KILL_DATA,
        steps=3,
        joins=KILL_JOINS,
        core_max_claims=KILL_CORE_CLAIMS,
        kill=KillPlan(cell=0, step=1, after_micro_steps=1),
    )
    with pytest.raises(Exception, match="SIGKILL|signal"):
        run_local(2, [resumed, core_killed], out, timeout_s=240)
    after = _same_as_full(out, "killed")
    assert after[2]["train/participants"] == 2
    assert [d["step"] for d in _lines(out / "core_killed" / "metrics.jsonl")] == [0]
    run_local(
        2,
        [
            core_killed.model_copy(
                update={"kill": None, "resume": True, "fresh_store_namespace": "-r"}
            )
        ],
        out,
        timeout_s=240,
    )
    _same_as_full(out, "core_killed")
