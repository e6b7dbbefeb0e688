"""A user namespace for a sandbox launched by root: the harness's host uid is not 0.

bwrap run by root with ``--unshare-user`` can only map the sandbox's ids onto
the caller's, uid 0: root's files stay the harness's own, and the kernel
exempts uid 0 from RLIMIT_NPROC. Dropping to an unprivileged uid *before* bwrap
does not work either, since bwrap then cannot reach tools installed under a
private home (a pyenv Python under ``/root``). So root prepares the namespace
itself and hands it to bwrap (``--userns FD``):

- a short-lived helper unshares a user namespace; root writes its maps:
  0 -> 0 (bwrap sets the sandbox up as the namespace's root, reading tools
  under ``/root``) and ``uid`` -> ``uid`` (the harness's ids, on the host too);
- the helper, being that namespace's root, sets ``user.max_user_namespaces``
  to 0 inside it, so nothing in the sandbox can create a nested user namespace
  (bwrap's ``--disable-userns`` needs ``--unshare-user``);
- :mod:`gyre.harness.confine`, the sandbox's first process, then switches to
  ``uid`` and so leaves every capability behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_HELPER = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) != 0:
    sys.stdout.write("error unshare(CLONE_NEWUSER): errno %d\n" % ctypes.get_errno())
    sys.exit(1)
sys.stdout.write("ready\n"); sys.stdout.flush()
if sys.stdin.readline().strip() != "mapped":
    sys.exit(1)
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("0\n")
sys.stdout.write("sealed\n"); sys.stdout.flush()
sys.stdin.read()
"""


class UsernsError(OSError):
    """The namespace could not be prepared (the message says which step failed)."""


def make_userns(uid: int, gid: int) -> int:
    """An fd on a fresh user namespace mapping 0 and ``uid``/``gid`` to themselves (root only).

    The caller passes it to bwrap (``--userns FD``) and closes it afterwards;
    the namespace lives as long as something holds it.
    """
    if os.geteuid() != 0:
        raise UsernsError("make_userns needs root (an ordinary user lets bwrap map the ids)")
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert helper.stdin is not None and helper.stdout is not None
    try:
        line = helper.stdout.readline().strip()
        if line != "ready":
            raise UsernsError(f"user namespace helper failed: {line or 'no answer'}")
        pid = helper.pid
        for name, own in (("uid_map", uid), ("gid_map", gid)):
            extra = "" if own == 0 else f"{own} {own} 1\n"
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 0 1\n{extra}")
        helper.stdin.write("mapped\n")
        helper.stdin.flush()
        if helper.stdout.readline().strip() != "sealed":
            raise UsernsError("user namespace helper could not disable nested user namespaces")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if isinstance(e, UsernsError):
            raise
        raise UsernsError(f"could not prepare the sandbox's user namespace: {e}") from None
    finally:
        try:
            helper.stdin.close()
        except OSError:
            pass
        try:
            helper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Hand a tree the sandbox writes (a workspace, a scoring copy) to the sandbox user.

    Only when root launches Gyre (an ordinary user's files are already the
    sandbox user's, through the namespace's map). Symlinks are not followed.
    """
    os.chown(path, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.chown(os.path.join(root, n), uid, gid, follow_symlinks=False)
