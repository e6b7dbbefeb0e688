"""Links that leave a task (or a task set) are refused: no host file and no other set's hidden
tests reach a workspace, a prompt or the sandbox through them."""

from __future__ import annotations

import shutil

import pytest
from test_harness_task import write_task

from gyre.harness.task import TaskError, load_task, load_taskset


@pytest.mark.parametrize(
    "part",
    [
        "environment/repo",
        "environment",
        "instruction.md",
        "task.toml",
        "tests",
        "tests/test.sh",
        "solution",
    ],
)
def test_task_parts_linking_out_are_refused(tmp_path, part):
    task = write_task(tmp_path / "set")
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST SECRET\n")
    (outside / "test.sh").write_text("exit 0\n")
    (outside / "repo").mkdir()
    (task / "solution").mkdir()
    target = task / part
    if target.is_dir():
        shutil.rmtree(target)
        dest = outside / "repo" if part.startswith("environment") else outside
        if part == "environment":
            (outside / "env").mkdir()
            (outside / "env" / "repo").mkdir()
            dest = outside / "env"
    else:
        target.unlink()
        dest = outside / ("secret.txt" if part == "instruction.md" else "test.sh")
        if part == "task.toml":
            (outside / "task.toml").write_text("[agent]\ntimeout_sec = 1\n")
            dest = outside / "task.toml"
    target.symlink_to(dest)
    with pytest.raises(TaskError) as e:
        load_task(task)
    msg = str(e.value)
    assert "\n" not in msg and "links out of the task folder" in msg and part in msg, msg


def test_links_inside_the_task_are_fine(tmp_path):
    task = write_task(tmp_path)
    shutil.move(task / "instruction.md", task / "docs.md")
    (task / "instruction.md").symlink_to("docs.md")
    assert load_task(task).instruction == "Do it."


def test_taskset_entry_linking_out_of_the_set_is_refused(tmp_path):
    other = write_task(tmp_path / "other-set")  # another set's task, with its hidden tests
    s = tmp_path / "set"
    write_task(s)
    (s / "borrowed").symlink_to(other)
    with pytest.raises(TaskError) as e:
        load_taskset(s)
    assert "borrowed" in str(e.value) and "links out of the task set" in str(e.value)


def test_taskset_hides_resolved_paths(tmp_path):
    s = tmp_path / "set"
    write_task(s)
    (tmp_path / "alias").symlink_to(s)
    (t,) = load_taskset(tmp_path / "alias")
    assert t.hidden == s.resolve() and t.tests_dir.is_relative_to(s.resolve())
