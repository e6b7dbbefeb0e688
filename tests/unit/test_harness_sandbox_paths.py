"""The sandbox's fresh /tmp must not hide the tools a harness needs (a CI clone or a venv
under /tmp), and must still hide the hidden trees inside what it binds back."""

import sys

from gyre.harness.sandbox import bwrap_argv, harbor_verifier_argv, tool_paths


def _pairs(argv, flag):
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_tools_under_tmp_are_bound_back_and_hidden_trees_inside_stay_hidden(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(venv))
    bin_dir = tmp_path / "h" / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "claude"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    secret = venv / "tasks"
    secret.mkdir()
    elsewhere = tmp_path / "other-workspaces"
    elsewhere.mkdir()

    # The executable sits behind a wrapper (the network bridge), as in proxy-only mode.
    argv = bwrap_argv(
        [sys.executable, "-m", "wrapper", "--", str(exe)],
        workspace=tmp_path / "ws",
        hide=[secret, elsewhere],
    )
    ro = _pairs(argv, "--ro-bind")
    assert (str(venv), str(venv)) in ro
    assert (str(tmp_path / "h" / "node_modules"),) * 2 in ro
    tmpfs = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
    # A hidden tree inside a bound-back tool path is covered again, after the bind.
    assert str(secret) in tmpfs
    assert argv.index(str(secret)) > argv.index(str(venv))
    # A hidden tree under /tmp that nothing re-exposed is already gone with /tmp.
    assert str(elsewhere) not in tmpfs

    v = harbor_verifier_argv(
        ["bash", "/tests/test.sh"],
        workspace_copy=tmp_path,
        tests=tmp_path,
        reward_dir=tmp_path,
        hide=[secret],
        home="/tmp/h",
    )
    assert (str(venv), str(venv)) in _pairs(v, "--ro-bind")
    assert str(secret) in [v[i + 1] for i, a in enumerate(v) if a == "--tmpfs"]


def test_tool_paths_are_minimal():
    paths = tool_paths([])
    for a in paths:
        assert not any(b != a and b in a.parents for b in paths)
