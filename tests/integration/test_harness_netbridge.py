"""The proxy-only bridge's child: run as confine's own child (no second interpreter, no
subprocess), with subprocess.call's status, PATH lookup and signal defaults."""

from __future__ import annotations

import os
import signal

from gyre.harness import netbridge

ENV = {"PATH": "/usr/bin:/bin"}


def test_the_childs_status_as_subprocess_call_gives_it():
    assert netbridge.run(["sh", "-c", "exit 3"], ENV) == 3
    assert netbridge.run(["sh", "-c", "kill -TERM $$"], ENV) == -signal.SIGTERM
    assert netbridge.run(["no-such-program-gyre"], ENV) == 127


def test_the_program_is_found_on_the_environments_path_not_the_bridges(tmp_path):
    tool = tmp_path / "gyre-tool"
    tool.write_text("#!/bin/sh\nexit 7\n")
    tool.chmod(0o755)
    assert str(tmp_path) not in os.environ.get("PATH", "")
    assert netbridge.run(["gyre-tool"], {"PATH": f"{tmp_path}:/usr/bin:/bin"}) == 7


def test_sigpipe_and_sigxfsz_are_back_to_their_defaults_in_the_child(tmp_path):
    # Python ignores both; a harness past RLIMIT_FSIZE must get SIGXFSZ as under subprocess
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    out = tmp_path / "status"
    assert netbridge.run(["sh", "-c", f"grep SigIgn /proc/$$/status > {out}"], ENV) == 0
    ignored = int(out.read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))
