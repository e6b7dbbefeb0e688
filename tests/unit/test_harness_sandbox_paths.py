"""The sandbox's fresh /tmp must not hide the tools a harness needs (a CI clone or a venv
under /tmp), and must still hide the hidden trees inside what it binds back."""

import sys

from gyre.harness.sandbox import (
    SANDBOX_UID,
    Confinement,
    bwrap_argv,
    harbor_verifier_argv,
    tool_paths,
)


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


def test_sandbox_sees_system_dirs_only_and_runs_without_capabilities(tmp_path):
    """The whole host tree is never bound: no ``--ro-bind / /``, no home, /srv, /run, /var
    (where host unix sockets live); an ordinary user's bwrap drops every capability and
    forbids nested user namespaces; root hands its prepared namespace instead."""
    argv = bwrap_argv(["true"], workspace=tmp_path / "ws", hide=[])
    dests = {argv[i + 2] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind")}
    assert "/" not in dests
    for d in ("/home", "/root", "/srv", "/run", "/var", "/mnt", "/tmp"):
        assert d not in dests
    assert "/usr" in dests and "/etc" in dests
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--disable-userns" in argv and "--unshare-user" in argv
    assert argv[argv.index("--uid") + 1] == str(SANDBOX_UID) != "0"
    # The root filesystem is remounted read-only after every mount point was made.
    ro = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert ro == ["/dev", "/"]  # /dev too: bwrap's own is an unsized, writable tmpfs
    assert argv.index("--remount-ro") > max(i for i, a in enumerate(argv) if a == "--bind")
    shm = argv.index("/dev/shm")  # a sized tmpfs of its own, world-writable with the sticky bit
    assert argv[shm - 1] == "--tmpfs" and argv[shm - 3] == "--size" and argv[shm - 4] == "01777"
    # Limits reach the first process inside; the command follows confine's "--".
    c = Confinement(max_procs=99, max_file_bytes=1234, tmpfs_bytes=5678)
    argv = bwrap_argv(["true"], workspace=tmp_path / "ws", hide=[], confine=c, userns_fd=7)
    assert argv[argv.index("--userns") + 1] == "7" and "--unshare-user" not in argv
    tail = argv[argv.index("--", argv.index("--chdir")) + 1 :]
    assert tail[-1] == "true" and tail[-2] == "--"
    assert ["--nproc", "99"] == tail[tail.index("--nproc") : tail.index("--nproc") + 2]
    assert tail[tail.index("--fsize") + 1] == "1234" and tail[tail.index("--uid") + 1] != "0"
    assert argv[argv.index("--size") + 1] == "5678"


def test_mount_point_parents_are_traversable(tmp_path):
    """Parents bwrap would create 0700 (a workspace under /tmp/..., a Python under /root/...)
    are made 0755 first, before the mounts that need them."""
    ws = tmp_path / "a" / "b" / "ws"
    argv = bwrap_argv(["true"], workspace=ws, hide=[])
    # --perms MODE --dir PATH
    dirs = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert {
        argv[i + 1] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"
    } == {"0755"}
    assert str(ws.parent) in dirs and str(ws) not in dirs
    assert argv.index(str(ws.parent)) < argv.index("--bind")


def test_harbor_paths_are_found_as_paths_only():
    from gyre.harness.scorer import harbor_paths

    assert harbor_paths("cd /app && echo 1 > /logs/verifier/reward.txt") == {"/app", "/logs"}
    assert harbor_paths("bash /tests/run.sh") == {"/tests"}
    assert harbor_paths('cat "$GYRE_TESTS_DIR/x" ./tests/y a/app /appdata ${X}/logs') == set()
    assert harbor_paths("https://example.com/app") == set()


def test_a_scripts_interpreter_is_bound_too(tmp_path, monkeypatch):
    """``#!/usr/bin/env node`` with node outside the system dirs (nvm under a home): its
    folder is bound, or the harness could not start inside."""
    nvm_bin = tmp_path / "nvm" / "bin"
    nvm_bin.mkdir(parents=True)
    node = nvm_bin / "node"
    node.write_text("#!/bin/sh\n")
    node.chmod(0o755)
    cli = tmp_path / "h" / "node_modules" / "pkg" / "cli.js"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/usr/bin/env node\nconsole.log(1)\n")
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{nvm_bin}:/usr/bin:/bin")
    paths = tool_paths([str(cli)])
    assert nvm_bin in paths and tmp_path / "h" / "node_modules" in paths
