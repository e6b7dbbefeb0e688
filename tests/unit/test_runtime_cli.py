"""`gyre run`'s fast parts: the checks before start, the task stream, the run directory's config.

No Ray and no cells here: every bad input must be refused before a process starts,
with exit code 2 and one line naming the field (never a traceback).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.config import GyreConfig, load_config
from gyre.ports import free_ports
from gyre.runtime.rundir import RunDir, to_toml
from gyre.runtime.tasks import TaskSetError, TaskStream

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.toml"


BASE = """
seed = 0

[policy]
placement = "elastic"
cells = 3
cell_capacity = 4
group_size = 4
batch_groups = 2
phi = 0.5
mu = 3
total_steps = 4

[run]
taskset = "quickstart"   # four tasks
profile = "reference"
harness_args = ["--max-turns", "1"]
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Only config.json is checked before start: a stub directory keeps these tests fast."""
    d = tmp_path_factory.mktemp("stub-model")
    (d / "config.json").write_text("{}")
    return d


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "base.toml"
    p.write_text(BASE)
    return p


def _run(args: list[str]):
    return CliRunner().invoke(app, ["run", *args])


def _refused(r, *names: str) -> str:
    """Exit 2, exactly one line on stderr naming every one of ``names``, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    for n in names:
        assert n in lines[0], (n, lines[0])
    assert r.stdout.strip() == ""
    return lines[0]


@pytest.mark.parametrize(
    "sets, names",
    [
        (["run.taskset=no-such-set"], ["run.taskset", "no-such-set"]),
        (["run.profile=no-such-profile"], ["run.profile", "no-such-profile"]),
        (["policy.cells=1"], ["policy.cells"]),
        # the set has 4 tasks; phi * B must stay whole (phi 0.5), so B = 6 reaches the split check
        (["policy.batch_groups=6"], ["policy.batch_groups", "4"]),
        (["policy.batch_groups=5", "policy.phi=1"], ["policy.batch_groups"]),
        (["policy.cells=abc"], ["policy.cells"]),
        (['run.train_tasks=["nope"]'], ["run.train_tasks", "nope"]),
        (["run.no_such_field=1"], ["run.no_such_field"]),
        (["policy.cell_capacity=1"], ["policy.cell_capacity"]),
        (['run.cell_resources=[{"node_b": 1}]'], ["run.cell_resources", "policy.cells = 3"]),
        (['run.cell_resources=[{"node_b": -1}, {}, {}]'], ["run.cell_resources"]),
    ],
)
def test_bad_config_is_one_line_naming_the_field(base, model_dir, sets, names):
    args = [str(base), "--set", f"model_dir={model_dir}"]
    for s in sets:
        args += ["--set", s]
    _refused(_run(args), *names)


def test_batch_larger_than_split_names_batch_groups_not_taskset(base, model_dir):
    line = _refused(
        _run([str(base), "--set", f"model_dir={model_dir}", "--set", "policy.batch_groups=6"])
    )
    # the field at fault is the batch size, not the task set
    assert line.startswith("gyre run: policy.batch_groups=6 "), line


def test_missing_model_dir(base, tmp_path):
    _refused(
        _run([str(base), "--set", f"model_dir={tmp_path / 'nope'}"]), "model_dir", "gyre model tiny"
    )


def test_config_file_that_does_not_exist(tmp_path):
    _refused(_run([str(tmp_path / "nope.toml")]), "nope.toml", "does not exist")


def test_toml_syntax_error(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("model_dir = \n[policy\n")
    _refused(_run([str(p)]), "invalid config")


def test_resume_on_a_directory_without_config(tmp_path):
    _refused(_run(["--resume", str(tmp_path)]), "--resume", str(tmp_path))


def test_no_config_and_no_resume():
    _refused(_run([]), "--resume")


def test_bad_log_format(base, model_dir):
    _refused(
        _run([str(base), "--set", f"model_dir={model_dir}", "--log-format", "xml"]), "--log-format"
    )


def test_existing_run_is_not_overwritten(base, model_dir, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("")
    _refused(
        _run(
            [
                str(base),
                "--set",
                f"model_dir={model_dir}",
                "--set",
                f"run.out_dir={tmp_path}",
                "--set",
                "run.name=taken",
            ]
        ),
        "run.name",
        "--resume",
    )


def _finished_run(base, model_dir, path):
    """A run directory whose checkpoint holds both of its 2 steps and that wrote its summary."""
    from gyre.train.checkpoint import TrainerState

    cfg = load_config(base, [f"model_dir={model_dir}", "policy.total_steps=2"])
    rd = RunDir(path).create()
    rd.write_config(cfg)
    ck = rd.checkpoints / "step-2"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(
        json.dumps(TrainerState(2, 2, ["g0", "g1", "g2", "g3"], "m").__dict__)
    )
    (rd.checkpoints / "latest").write_text("step-2")
    rd.write_summary({"steps": 2})
    return rd


def test_resume_of_a_finished_run_exits_0_without_starting(base, model_dir, tmp_path):
    """A run whose checkpoint holds every step and that wrote its summary: nothing to do (and no
    Ray started). Without the summary the resume finishes the run (test_runtime.py)."""

    rd = _finished_run(base, model_dir, tmp_path / "done")
    r = _run(["--resume", str(rd.path)])
    assert r.exit_code == 0, r.output
    assert "already finished" in r.stderr


def test_resume_says_so_when_this_user_did_not_create_the_run(base, model_dir, tmp_path):
    """--resume takes a received run's config.json as it is (sandbox off, any harness command):
    a directory this user's gyre run did not create gets one line saying so (issue 37)."""
    import os
    import shutil

    from gyre.runtime import origin

    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")  # this user's key, made on first use
    try:
        rd = _finished_run(base, model_dir, tmp_path / "mine")
        received = tmp_path / "received"
        shutil.copytree(rd.path, received)
        origin.mark(rd.path)  # what gyre run does when it creates a run directory
        assert oct(os.stat(tmp_path / "state" / "gyre" / "origin.key").st_mode & 0o777) == "0o600"
        r = _run(["--resume", str(rd.path)])
        assert r.exit_code == 0 and "not created by this user" not in r.stderr, r.stderr
        r = _run(["--resume", str(received)])  # no marker
        lines = [ln for ln in r.stderr.splitlines() if "not created by this user" in ln]
        assert r.exit_code == 0 and len(lines) == 1 and "config.json as it is" in lines[0]
        shutil.copy(rd.path / origin.MARKER, received / origin.MARKER)  # a copied marker
        assert "not created by this user" in _run(["--resume", str(received)]).stderr
        (received / origin.MARKER).unlink()
        os.mkfifo(received / origin.MARKER)  # a FIFO does not block the check
        assert "not created by this user" in _run(["--resume", str(received)]).stderr
    finally:
        del os.environ["XDG_STATE_HOME"]


# ---------------------------------------------------------------------------------- task stream
def test_task_stream_is_deterministic_and_covers_each_task_once_per_epoch():
    a = TaskStream("quickstart", [], [], seed=3)
    b = TaskStream("quickstart", [], [], seed=3)
    n = len(a.train)
    assert n == 4
    names = sorted(t.name for t in a.train)
    seq_a = [a.task(g).name for g in range(5 * n)]
    # another instance, asked in another order, gives the same stream
    seq_b = {g: b.task(g).name for g in reversed(range(5 * n))}
    assert seq_a == [seq_b[g] for g in range(5 * n)]
    for e in range(5):
        assert sorted(seq_a[e * n : (e + 1) * n]) == names, (e, seq_a)
    # epochs are reshuffled (not one order repeated) and the seed matters
    epochs = {tuple(seq_a[e * n : (e + 1) * n]) for e in range(5)}
    assert len(epochs) > 1
    others = [
        [TaskStream("quickstart", [], [], seed=s).task(g).name for g in range(5 * n)]
        for s in range(4, 8)
    ]
    assert any(o != seq_a for o in others)
    assert a.eval == a.train and not a.held_out


def test_task_stream_split_and_batch_check():
    s = TaskStream("quickstart", ["upper", "digits"], ["vowels"], seed=0)
    assert [t.name for t in s.eval] == ["vowels"] and s.held_out
    assert {s.task(g).name for g in range(6)} == {"upper", "digits"}
    s.check_batch(2)
    with pytest.raises(TaskSetError, match="batch_groups=3"):
        s.check_batch(3)
    with pytest.raises(TaskSetError, match="eval_tasks"):
        TaskStream("quickstart", [], ["nope"], seed=0)


# ---------------------------------------------------------------------------------- config.toml
def _roundtrip(cfg: GyreConfig) -> GyreConfig:
    text = to_toml(cfg.model_dump(mode="json"))
    data = tomllib.loads(text)
    return GyreConfig.model_validate(data)


def test_to_toml_roundtrip_quickstart(model_dir):
    cfg = load_config(QUICKSTART, [f"model_dir={model_dir}"])
    assert _roundtrip(cfg) == cfg


def test_to_toml_roundtrip_non_defaults(base, model_dir, tmp_path):
    cfg = load_config(
        base,
        [
            f"model_dir={model_dir}",
            "seed=7",
            "policy.placement=colocate",
            "policy.phi=0",
            "policy.mu=4",
            "trainer.optim.betas=[0.8, 0.95]",
            "trainer.objective.adv_eps=1e-9",
            'run.harness_args=["--say", "a \\"quoted\\" word", "ünïcode", "back\\\\slash"]',
            'run.train_tasks=["upper", "digits"]',
            f"trainer.checkpoint.dir={tmp_path}",
            # Ray resource names hold ':' and '.', which are not bare TOML keys
            'run.cell.resources={"node:127.0.0.1": 0.5, "accelerator_type:H100": 1}',
            'run.cell_resources=[{"node_a": 1}, {"node:127.0.0.1": 0.5, "b": 2}, {}]',
        ],
    )
    back = _roundtrip(cfg)
    assert back == cfg
    assert back.run.cell.resources == {"node:127.0.0.1": 0.5, "accelerator_type:H100": 1.0}
    assert back.run.cell_resources == [{"node_a": 1}, {"node:127.0.0.1": 0.5, "b": 2}, {}]


def test_written_config_loads_back_through_load_config(base, model_dir, tmp_path):
    cfg = load_config(base, [f"model_dir={model_dir}", "run.name=x", "policy.total_steps=5"])
    rd = RunDir(tmp_path / "run").create()
    rd.write_config(cfg)
    assert load_config(rd.path / "config.toml") == cfg


def test_resume_keeps_unset_values_toml_cannot_hold(base, model_dir, tmp_path):
    """TOML has no null: `trainer.j_max=null` (no cap) must not come back as the default 5 on resume."""
    from gyre.runtime.cli import resume_config

    cfg = load_config(
        base, [f"model_dir={model_dir}", "trainer.j_max=null", "trainer.optim.grad_clip=null"]
    )
    assert cfg.trainer.j_max is None and cfg.trainer.optim.grad_clip is None
    rd = RunDir(tmp_path / "run").create()
    rd.write_config(cfg)
    assert resume_config(rd.path, []) == cfg
    # an override given at resume still wins
    assert resume_config(rd.path, ["trainer.j_max=3"]).trainer.j_max == 3
    # resume reads config.json alone: config.toml is the copy for people to read
    (rd.path / "config.toml").unlink()
    assert resume_config(rd.path, []) == cfg


def test_unreachable_ray_address_is_one_line_exit_1(tmp_path):
    """A bad --address is reported at once (Ray itself would retry it for minutes), no traceback."""
    from gyre.config import load_config
    from gyre.runtime.ray_setup import RuntimeSetupError, init_ray

    (port,) = free_ports()  # a port nobody listens on
    cfg = load_config(QUICKSTART, [f"model_dir={tmp_path}", f"run.ray.address=127.0.0.1:{port}"])
    with pytest.raises(RuntimeSetupError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        init_ray(cfg)


def test_a_local_ray_starts_no_idle_workers(tmp_path, monkeypatch):
    """A local run's Ray prestarts no idle Python workers: no actor of a run could use them
    (each has its own runtime_env), and their start takes the cores the cells start on."""
    import ray

    from gyre.config import load_config
    from gyre.runtime import ray_setup

    seen: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    ray_setup.init_ray(load_config(QUICKSTART, [f"model_dir={tmp_path}"]))
    assert seen["_system_config"] == {
        "enable_worker_prestart": False,
        "prestart_worker_first_driver": False,
    }
