"""Modes a harness leaves behind are cut to its owner's rwx before anything copies them."""

from __future__ import annotations

import os
import stat
import subprocess

from gyre.harness.fsmode import safe_mode, strip_tree


def test_safe_mode_drops_setid_sticky_group_other():
    assert safe_mode(stat.S_IFREG | 0o6777) == 0o700
    assert safe_mode(stat.S_IFREG | 0o4755) == 0o700
    assert safe_mode(stat.S_IFREG | 0o000) == 0o600  # the owner can always read what is left
    assert safe_mode(stat.S_IFDIR | 0o3777) == 0o700
    assert safe_mode(stat.S_IFDIR | 0o000) == 0o700


def test_strip_tree_setuid_deep_locked_and_links(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "suid").write_text("#!/bin/sh\n")
    os.chmod(ws / "suid", 0o6777)
    locked = ws / "locked"
    locked.mkdir()
    (locked / "inner").write_text("x")
    os.chmod(locked / "inner", 0o4000)
    os.chmod(locked, 0o000)
    deep = ws
    for _ in range(1200):  # past Python's recursion limit (os.makedirs, rmtree recurse)
        deep = deep / "d"
        deep.mkdir()
    (deep / "s").write_text("x")
    os.chmod(deep / "s", 0o2755)
    host = tmp_path / "host-file"
    host.write_text("host")
    os.chmod(host, 0o4755)
    (ws / "link").symlink_to(host)
    os.chmod(ws, 0o2777)
    changed, failed = strip_tree(ws)
    assert failed == 0 and changed >= 5
    assert stat.S_IMODE(os.stat(ws).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(ws / "suid").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(locked).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(locked / "inner").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(deep / "s").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(host).st_mode) == 0o4755  # a link is never followed
    subprocess.run(["rm", "-rf", str(ws)], check=True)  # shutil.rmtree would recurse
