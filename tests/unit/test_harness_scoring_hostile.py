"""Hostile result files, calls files and workspaces, one rule at a time (issue 19: 1-4, 9).

The pure parts (result checks, the model-call verdict) and the bounded I/O helpers
(no-follow, non-blocking reads; the iterative copy and removal) on their own; the
same situations through the real executor are in tests/integration/test_harness_hostile_scoring.py.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.model_calls import ModelCalls, decide, read_calls_file
from gyre.harness.results import ResultError, parse_result, read_result
from gyre.harness.safe_read import UnsafeFile, open_dir, quote, read_at, read_file
from gyre.harness.safecopy import CopyLimits, WorkspaceRefused, copy_workspace, remove_tree

SECRET = "TOPSECRET-host-only-4c1d"


# ---- result checks: every rule's result in [0, 1], or an error quoting a few bytes -------------


@pytest.mark.parametrize(
    "name, body, why",
    [
        ("junit.xml", '<testsuite tests="5" failures="-999995"/>', "not a non-negative integer"),
        ("junit.xml", '<testsuite tests="abc"/>', "not a non-negative integer"),
        ("junit.xml", '<testsuite tests="3.0"/>', "not a non-negative integer"),
        ("junit.xml", '<testsuite tests="2" failures="3"/>', "is more than tests"),
        ("junit.xml", '<testsuite tests="0"/>', "at least 1 expected"),
        ("junit.xml", "<testsuites/>", "at least 1 expected"),
        ("junit.xml", '<testsuite tests="1' + "0" * 5000 + '"/>', "not a non-negative integer"),
        ("reward.json", '{"passed": 1' + "0" * 5000 + ', "total": 1}', "not valid JSON"),
        ("reward.json", '{"reward": 1e400}', "not a number in [0, 1]"),
        ("reward.json", '{"reward": true}', "not a number"),
        ("reward.json", '{"passed": 2.0, "total": 2}', "must be an integer"),
        ("reward.json", '{"passed": -1, "total": 2}', "must be an integer"),
        ("reward.json", "[" * 60_000, "not valid JSON"),
        ("reward.txt", "nan", "is not a number"),
        ("reward.txt", "inf", "is not a number"),
        ("reward.txt", "200000", "not a number in [0, 1]"),
        ("reward.txt", "-0.5", "not a number in [0, 1]"),
        ("reward.txt", "1" * 5000, "is not a number"),
    ],
)
def test_bad_results_are_errors_that_quote_little(name, body, why):
    with pytest.raises(ResultError, match=f".*{why.replace('[', '.').replace(']', '.')}") as e:
        parse_result(name, body.encode())
    assert len(str(e.value)) < 200


def test_invalid_utf8_is_an_error():
    with pytest.raises(ResultError, match="not UTF-8"):
        parse_result("reward.txt", b"\xff\xfe0.5")


def test_good_results_stay_in_range():
    assert parse_result("reward.txt", b"1.0000000001\n").reward == 1.0
    assert parse_result("reward.txt", b" 0.25 ").reward == 0.25
    r = parse_result("junit.xml", b'<testsuite tests="4" failures="1" errors="1" skipped="0"/>')
    assert (r.passed, r.total) == (2, 4)
    r = parse_result("junit.xml", b'<testsuite tests="2" skipped="2"/>')  # all skipped: 0 of 0
    assert (r.passed, r.total) == (0, 0)


def test_quote_is_short():
    assert quote(SECRET * 10) == repr(SECRET[:16]) + "…"


# ---- no-follow, non-blocking, bounded reads ----------------------------------------------------


@pytest.fixture
def rdir(tmp_path):
    d = tmp_path / "reward"
    d.mkdir()
    fd = open_dir(d)
    yield d, fd
    os.close(fd)


def test_links_fifos_sockets_devices_and_big_files_are_refused_fast(rdir, tmp_path):
    d, fd = rdir
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    (d / "link").symlink_to(secret)
    (d / "zero").symlink_to("/dev/zero")
    os.mkfifo(d / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "sock"))
    with open(d / "sparse", "wb") as f:
        f.truncate(512 << 20)
    t0 = time.monotonic()
    for name, why in [
        ("link", "symbolic link"),
        ("zero", "symbolic link"),
        ("fifo", "not a regular file"),
        ("sock", "unreadable"),
        ("sparse", "536870912 bytes"),
    ]:
        with pytest.raises(UnsafeFile, match=why) as e:
            read_at(fd, name)
        assert SECRET not in str(e.value)
    s.close()
    assert time.monotonic() - t0 < 2  # nothing waited on, nothing loaded
    assert read_at(fd, "absent") is None
    (d / "ok").write_text("0.5")
    assert read_at(fd, "ok") == b"0.5"


def test_reward_folder_swapped_for_a_link_after_opening_is_not_followed(rdir, tmp_path):
    """The verifier may rename its reward folder and put a link to a host folder there:
    the result is read from the folder that was opened before it ran."""
    d, fd = rdir
    host = tmp_path / "host"
    host.mkdir()
    (host / "reward.txt").write_text("1")
    d.rename(tmp_path / "moved")
    d.symlink_to(host)
    assert read_result(fd, "reward.txt") is None


def test_calls_file_that_is_a_fifo_or_link_reads_as_none(tmp_path):
    art = tmp_path / "artifacts"
    art.mkdir()
    os.mkfifo(art / "model_calls.json")
    t0 = time.monotonic()
    assert read_calls_file(art / "model_calls.json") is None
    (art / "model_calls.json").unlink()
    (art / "model_calls.json").symlink_to("/dev/zero")
    assert read_calls_file(art / "model_calls.json") is None
    assert time.monotonic() - t0 < 1
    (art / "model_calls.json").unlink()
    (art / "model_calls.json").write_text('{"attempted": 1' + "0" * 5000 + ', "answered": 0}')
    assert read_calls_file(art / "model_calls.json") is None
    (art / "model_calls.json").write_text('{"attempted": 2, "answered": 1}')
    assert read_calls_file(art / "model_calls.json") == ModelCalls(2, 1, "", "harness")


# ---- the model-call verdict: only what the harness cannot forge drops it unscored --------------


@pytest.mark.parametrize(
    "proxy, own, want",
    [
        (ModelCalls(2, 0, "HTTP 503: no inference engine", "proxy"), None, "drop"),
        (
            ModelCalls(2, 0, "HTTP 400: request body is not valid JSON", "proxy"),
            None,
            "drop_if_positive",
        ),
        (
            ModelCalls(1, 0, "the client went away before the answer", "proxy"),
            None,
            "drop_if_positive",
        ),
        (ModelCalls(3, 1, "HTTP 503", "proxy"), ModelCalls(3, 0, "", "harness"), "score"),
        (ModelCalls(0, 0, "", "proxy"), ModelCalls(3, 0, "refused", "harness"), "drop_if_positive"),
        (None, ModelCalls(3, 0, "refused", "harness"), "drop_if_positive"),
        (None, None, "score"),
        (ModelCalls(0, 0, "", "proxy"), None, "score"),
    ],
)
def test_calls_verdict(proxy, own, want):
    assert decide(proxy, own)[1] == want


# ---- the scoring copy: iterative, bounded, no specials, no set-id bits -------------------------


def test_copy_skips_specials_strips_setid_and_keeps_links(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "tool").write_text("#!/bin/sh\n")
    os.chmod(src / "sub" / "tool", 0o6755)
    os.mkfifo(src / "fifo")
    (src / "shadow").symlink_to("/etc/shadow")
    rep = copy_workspace(src, tmp_path / "dst")
    assert rep.skipped == ["fifo"] and rep.files == 4
    assert os.stat(tmp_path / "dst" / "sub" / "tool").st_mode & 0o7777 == 0o755
    assert os.readlink(tmp_path / "dst" / "shadow") == "/etc/shadow"  # a link, not its target


def _blocks(root: Path) -> int:
    return sum(os.lstat(p).st_blocks * 512 for p in root.rglob("*"))


def test_copy_keeps_holes_as_holes(tmp_path):
    """Issue 37, finding 6: 2 x 64 MiB of holes take nothing under the workspace quota (which
    counts allocated blocks); the scoring copy wrote them out, 128 MiB of the host's disk."""
    src = tmp_path / "src"
    src.mkdir()
    mib = 1 << 20
    for name in ("a", "b"):
        with open(src / name, "wb") as f:
            f.truncate(64 * mib)
    with open(src / "b", "r+b") as f:  # data between holes, and at the very end
        f.seek(10 * mib)
        f.write(b"middle")
        f.seek(64 * mib - 3)
        f.write(b"end")
    if _blocks(src) > mib:
        pytest.skip("this filesystem does not keep holes")
    copy_workspace(src, tmp_path / "dst")
    dst = tmp_path / "dst"
    assert _blocks(dst) <= mib, f"{_blocks(dst)} bytes on disk for {_blocks(src)} in the workspace"
    for name in ("a", "b"):
        assert os.path.getsize(dst / name) == 64 * mib
        with open(src / name, "rb") as f, open(dst / name, "rb") as g:
            while chunk := f.read(4 * mib):
                assert g.read(4 * mib) == chunk
            assert g.read(1) == b""
        assert os.stat(dst / name).st_mode & 0o777 == os.stat(src / name).st_mode & 0o777


def test_copy_of_a_dense_file_and_an_empty_one(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(3 << 20)
    (src / "dense").write_bytes(data)
    (src / "empty").write_bytes(b"")
    copy_workspace(src, tmp_path / "dst")
    assert (tmp_path / "dst" / "dense").read_bytes() == data
    assert (tmp_path / "dst" / "empty").read_bytes() == b""


@pytest.mark.parametrize(
    "limits, why",
    [
        (CopyLimits(max_depth=50), "levels deep"),
        (CopyLimits(max_files=100), "more than 100 entries"),
        (CopyLimits(max_bytes=1000), "more than 1000 bytes"),
    ],
)
def test_copy_limits_refuse_without_recursion(tmp_path, limits, why):
    src = tmp_path / "src"
    if limits.max_depth < 128:  # 700 deep: shutil.copytree's recursion ended the run here
        (src / "/".join(["d"] * 700)).mkdir(parents=True)
    else:
        (src / "many").mkdir(parents=True)
        for i in range(150):
            (src / "many" / str(i)).write_bytes(b"x" * 10)
    with pytest.raises(WorkspaceRefused, match=why):
        copy_workspace(src, tmp_path / "dst", limits)
    assert remove_tree(tmp_path / "dst") == 0


def test_a_workspace_replaced_by_a_link_is_not_followed(tmp_path):
    (tmp_path / "ws").symlink_to("/")
    with pytest.raises(WorkspaceRefused, match="not a folder"):
        copy_workspace(tmp_path / "ws", tmp_path / "dst")
    with pytest.raises(WorkspaceRefused, match="gone"):
        copy_workspace(tmp_path / "nothing", tmp_path / "dst2")
    assert not (tmp_path / "dst").exists()


def test_remove_tree_deep_unreadable_and_links(tmp_path):
    root = tmp_path / "t"
    deep = root / "/".join(["d"] * 700)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (root / "link").symlink_to(outside)
    locked = root / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "f").write_text("x")
    os.chmod(locked / "inner", 0)
    os.chmod(locked, 0)
    assert remove_tree(root) == 0
    assert not root.exists() and (outside / "keep").read_text() == "keep"
    assert remove_tree(root) == 0  # already gone


# ---- configs: no infinite or NaN timeouts ------------------------------------------------------


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf"])
def test_configs_refuse_non_finite_seconds(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite number"):
        ExecutorConfig.model_validate({"kill_grace_s": value})
    with pytest.raises(ValidationError, match="finite number"):
        ExecutorConfig.model_validate({"sandbox": {"disk_check_s": value}})
    from gyre.runtime.config import RunConfig

    for run in ({"harness_timeout_s": value}, {"longtail": {"overall_timeout_s": value}}):
        with pytest.raises(ValidationError, match="finite number"):
            RunConfig.model_validate(run)
    with pytest.raises(ValidationError, match="harness_timeout_s"):
        ExecutionSpec.model_validate(
            {
                "execution_id": "e",
                "task": None,
                "profile": None,
                "base_url": "http://x",
                "harness_timeout_s": value,
            }
        )


def test_result_dir_file_names_are_plain(tmp_path):
    fd = open_dir(tmp_path)
    try:
        for bad in ("../x", "", "."):
            with pytest.raises(ValueError):
                read_at(fd, bad)
    finally:
        os.close(fd)
    assert read_file(tmp_path / "missing-dir" / "f") is None
