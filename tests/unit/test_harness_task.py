"""Task folder loader: the Harbor layout, Gyre's [gyre] extension, and clear errors."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from gyre.harness.task import TaskError, list_builtin_tasksets, load_task, load_taskset


def write_task(
    root: Path,
    toml: str | None = None,
    *,
    repo: str = "environment/repo",
    instruction: str = "Do it.\n",
) -> Path:
    d = root / "task"
    (d / repo).mkdir(parents=True)
    (d / repo / "main.py").write_text("x = 1\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text("exit 0\n")
    (d / "instruction.md").write_text(instruction)
    (d / "task.toml").write_text(
        toml
        if toml is not None
        else textwrap.dedent("""\
        version = "1.0"
        [metadata]
        difficulty = "easy"
        [agent]
        timeout_sec = 30.0
        [verifier]
        timeout_sec = 5.0
        env = { FOO = "bar" }
        [gyre]
        reward = "fraction"
        overall_timeout_sec = 100
        """)
    )
    return d


def test_loads_harbor_layout_with_gyre_extension(tmp_path):
    t = load_task(write_task(tmp_path))
    assert t.name == "task" and t.instruction == "Do it."
    assert (
        t.harness_timeout_s == 30.0 and t.verifier_timeout_s == 5.0 and t.overall_timeout_s == 100.0
    )
    assert t.reward_rule == "fraction" and t.verifier_env == {"FOO": "bar"}
    assert t.repository.name == "repo" and (t.repository / "main.py").exists()
    assert t.solution_dir is None and t.metadata == {"difficulty": "easy"}
    assert t.hidden == t.root


def test_plain_harbor_task_defaults(tmp_path):
    """A Harbor task without [gyre]: binary reward, environment/ itself is the repo minus the Dockerfile."""
    d = write_task(
        tmp_path, toml='version = "1.0"\n[agent]\ntimeout_sec = 12\n', repo="environment"
    )
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11\n")
    t = load_task(d)
    assert (
        t.reward_rule == "binary" and t.harness_timeout_s == 12.0 and t.verifier_timeout_s == 120.0
    )
    assert t.overall_timeout_s is None
    assert t.repository == d / "environment" and "Dockerfile" in t.skip_files


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: (d / "instruction.md").unlink(), "missing instruction.md"),
        (lambda d: (d / "instruction.md").write_text("  \n"), "instruction.md is empty"),
        (lambda d: (d / "task.toml").unlink(), "missing task.toml"),
        (lambda d: (d / "task.toml").write_text("[agent\n"), "not valid TOML"),
        (
            lambda d: (d / "task.toml").write_text("[gyre]\nreward = 'best'\n"),
            "must be 'binary' or 'fraction'",
        ),
        (lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "must be > 0"),
        (
            lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n"),
            "must be a number",
        ),
        (
            lambda d: (d / "task.toml").write_text(
                "[agent]\ntimeout_sec = 50\n[gyre]\noverall_timeout_sec = 10\n"
            ),
            "harness timeout must come first",
        ),
        (
            lambda d: (d / "task.toml").write_text("[gyre]\nrepository = '../../etc'\n"),
            "escapes the task folder",
        ),
        (lambda d: shutil.rmtree(d / "environment"), "starting repository .* is missing"),
        (lambda d: (d / "tests" / "test.sh").unlink(), "missing tests/test.sh"),
        (
            lambda d: (d / "task.toml").write_text("agent = 3\n"),
            r"\[agent\] in task.toml must be a table",
        ),
        # TOML spells infinity and NaN; neither is a timeout (issue 19)
        (lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = inf\n"), "finite, got inf"),
        (
            lambda d: (d / "task.toml").write_text("[verifier]\ntimeout_sec = nan\n"),
            "finite, got nan",
        ),
        (
            lambda d: (d / "task.toml").write_text("[gyre]\noverall_timeout_sec = inf\n"),
            "finite, got inf",
        ),
        (
            lambda d: (d / "task.toml").write_text("[gyre]\nresult = 'score.txt'\n"),
            r"\[gyre\].result must be one of reward.txt, reward.json, junit.xml",
        ),
    ],
)
def test_bad_task_folders_give_clear_errors(tmp_path, breakage, message):
    d = write_task(tmp_path)
    breakage(d)
    with pytest.raises(TaskError, match=message):
        load_task(d)


def test_symlink_loop_is_a_task_error_not_a_traceback(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(TaskError, match="cannot be resolved"):
        load_task(tmp_path / "a")


def test_result_file_is_declared_or_harbors_default(tmp_path):
    assert load_task(write_task(tmp_path / "x")).result_file == "reward.txt"
    d = write_task(tmp_path / "y", toml='[gyre]\nresult = "junit.xml"\n')
    assert load_task(d).result_file == "junit.xml"
    from gyre.harness.task import load_taskset

    assert {t.result_file for t in load_taskset("pyfix")} == {"junit.xml"}
    assert {t.result_file for t in load_taskset("quickstart")} == {"reward.json"}


def test_nonexistent_folder(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        load_task(tmp_path / "nope")


def test_taskset_reports_every_bad_task(tmp_path):
    (tmp_path / "set").mkdir()
    for name in ("a", "b", "c"):
        write_task(tmp_path / name).rename(tmp_path / "set" / name)
    (tmp_path / "set" / "a" / "instruction.md").unlink()
    (tmp_path / "set" / "c" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError) as e:
        load_taskset(tmp_path / "set")
    assert "2 bad task(s)" in str(e.value) and "task a" in str(e.value) and "task c" in str(e.value)
    with pytest.raises(TaskError, match="neither a directory nor a built-in set"):
        load_taskset("no-such-set")


def test_builtin_tasksets_load():
    assert {"pyfix", "quickstart"} <= set(list_builtin_tasksets())
    pyfix = load_taskset("pyfix")
    assert len(pyfix) >= 10
    for t in pyfix:
        assert t.solution_dir is not None and (t.solution_dir / "solve.sh").exists()
        assert t.hidden == t.root.parent  # the whole set is hidden from a sandboxed harness
        assert not any(p.name.endswith("_hidden.py") for p in t.repository.iterdir())
    quick = load_taskset("quickstart")
    assert len(quick) >= 4 and all(t.reward_rule == "fraction" for t in quick)


def _with_verifier(tmp_path: Path, verifier: str) -> Path:
    return write_task(tmp_path, f'version = "1.0"\n[verifier]\ntimeout_sec = 5.0\n{verifier}\n')


@pytest.mark.parametrize(
    "env, message",
    [
        ('LD_PRELOAD = "../tests/probe.so"', "'LD_PRELOAD' steers the loader"),
        ('LD_LIBRARY_PATH = "."', "'LD_LIBRARY_PATH' steers the loader"),
        ('PYTHONPATH = "."', "'PYTHONPATH' steers"),
        ('PYTHONSTARTUP = "x.py"', "'PYTHONSTARTUP' steers"),
        ('PYTHONHOME = "/x"', "'PYTHONHOME' steers"),
        ('BASH_ENV = "x.sh"', "'BASH_ENV' steers"),
        ('ENV = "x.sh"', "'ENV' steers"),
        ('PATH = "."', "'PATH' steers"),
        ('GCONV_PATH = "."', "'GCONV_PATH' steers"),
        ('PERL5OPT = "-Mx"', "'PERL5OPT' steers"),
        ('NODE_OPTIONS = "--require x"', "'NODE_OPTIONS' steers"),
        ('GYRE_REWARD_DIR = "/tmp"', "'GYRE_REWARD_DIR' steers"),
        ('"A=B" = "c"', "'A=B' is not a variable name"),
        ('"" = "c"', "'' is not a variable name"),
        ('"A\\u0000B" = "c"', "is not a variable name"),
        ('FOO = "a\\u0000b"', "'FOO': its value holds a NUL byte"),
        ("FOO = { x = 1 }", "'FOO' must be a string or number, got dict"),
        ("FOO = [1, 2]", "'FOO' must be a string or number, got list"),
    ],
)
def test_verifier_env_that_steers_the_host_or_cannot_be_set_is_refused(tmp_path, env, message):
    """Refused at load, one line naming the key (issue 37: 1 and 8), not at every execution."""
    d = _with_verifier(tmp_path, f"[verifier.env]\n{env}")
    with pytest.raises(TaskError, match=re.escape(message)) as e:
        load_task(d)
    assert "\n" not in str(e.value) and str(e.value).startswith("task task: [verifier].env key")


def test_plain_verifier_env_loads(tmp_path):
    d = _with_verifier(tmp_path, '[verifier.env]\nFOO = "bar"\nN = 3\nLEVEL_2 = "x=y"')
    assert load_task(d).verifier_env == {"FOO": "bar", "N": "3", "LEVEL_2": "x=y"}


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "604801", "0", "-1", "true"])
def test_timeouts_past_a_week_or_not_finite_are_refused(tmp_path, value):
    d = write_task(tmp_path, f'version = "1.0"\n[agent]\ntimeout_sec = {value}\n')
    with pytest.raises(TaskError, match=r"\[agent\]\.timeout_sec must be"):
        load_task(d)


def test_a_week_is_the_longest_timeout(tmp_path):
    d = write_task(tmp_path, 'version = "1.0"\n[verifier]\ntimeout_sec = 604800\n')
    assert load_task(d).verifier_timeout_s == 604800.0
