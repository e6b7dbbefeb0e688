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
import threading
from pathlib import Path

# A long-lived helper (one per Gyre process, started on first use): it forks one child per
# namespace, which a single-threaded process can do safely, and a namespace then costs a
# fork (~ms) instead of a Python start (~100 ms on a busy machine). Line protocol on stdin /
# stdout: "new UID GID" -> "ok PID" (the child holds the sealed namespace) or "error WHY";
# "done PID" lets the child go. EOF on stdin: every child goes, and the helper exits.
_FACTORY = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)

def child(r, w):
    if libc.unshare(0x10000000) != 0:
        os.write(w, b"Eunshare(CLONE_NEWUSER): errno %d" % ctypes.get_errno())
        os._exit(1)
    os.write(w, b"u")
    if os.read(r, 1) != b"m":
        os._exit(1)
    try:
        fd = os.open("/proc/sys/user/max_user_namespaces", os.O_WRONLY)
        os.write(fd, b"0\n")
        os.close(fd)
    except OSError as e:
        os.write(w, b"Edisabling nested user namespaces: %s" % e.strerror.encode())
        os._exit(1)
    os.write(w, b"s")
    os.read(r, 1)
    os._exit(0)

kids = {}
for line in sys.stdin:
    cmd = line.split()
    if cmd and cmd[0] == "new":
        uid, gid = int(cmd[1]), int(cmd[2])
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w1)
            os.close(r2)
            child(r1, w2)
        os.close(r1)
        os.close(w2)
        try:
            got = os.read(r2, 200)
            if got != b"u":
                raise OSError(got[1:].decode() or "the namespace child died")
            for name, own in (("uid_map", uid), ("gid_map", gid)):
                with open("/proc/%d/%s" % (pid, name), "w") as f:
                    f.write("0 0 1\n" + ("%d %d 1\n" % (own, own) if own else ""))
            os.write(w1, b"m")
            got = os.read(r2, 200)
            if got != b"s":
                raise OSError(got[1:].decode() or "the namespace child died")
            kids[pid] = (w1, r2)
            sys.stdout.write("ok %d\n" % pid)
        except OSError as e:
            os.close(w1)
            os.close(r2)
            os.waitpid(pid, 0)
            sys.stdout.write("error %s\n" % (e.strerror or e))
        sys.stdout.flush()
    elif cmd and cmd[0] == "done" and int(cmd[1]) in kids:
        pid = int(cmd[1])
        for fd in kids.pop(pid):
            os.close(fd)
        os.waitpid(pid, 0)
"""


class UsernsError(OSError):
    """The namespace could not be prepared (the message says which step failed)."""


class _Factory:
    """The helper process and a lock: executions ask for namespaces from many threads."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _FACTORY],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # a Ctrl-C for Gyre is not one for the helper
            )
        return self._proc

    def new(self, uid: int, gid: int) -> int:
        with self._lock:
            for attempt in (1, 2):  # a helper that died is restarted once
                proc = self._started()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(f"new {uid} {gid}\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline().strip()
                except (BrokenPipeError, OSError):
                    line = ""
                if line.startswith("ok "):
                    break
                if line.startswith("error ") or attempt == 2:
                    raise UsernsError(
                        f"could not prepare the sandbox's user namespace: {line[6:] or 'no answer'}"
                    )
                proc.kill()
                proc.wait()
            pid, stdin = int(line.split()[1]), proc.stdin
            assert stdin is not None
            try:
                return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            finally:
                try:
                    stdin.write(f"done {pid}\n")
                    stdin.flush()
                except OSError:  # the helper died: its children went with it
                    pass


_factory = _Factory()


def make_userns(uid: int, gid: int) -> int:
    """An fd on a fresh user namespace mapping 0 and ``uid``/``gid`` to themselves (root only),
    in which no further user namespace can be created.

    The caller passes it to bwrap (``--userns FD``) and closes it afterwards;
    the namespace lives as long as something holds it.
    """
    if os.geteuid() != 0:
        raise UsernsError("make_userns needs root (an ordinary user lets bwrap map the ids)")
    return _factory.new(uid, gid)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Hand a tree the sandbox writes (a workspace, a scoring copy) to the sandbox user.

    Only when root launches Gyre (an ordinary user's files are already the
    sandbox user's, through the namespace's map). Symlinks are not followed.
    """
    os.chown(path, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.chown(os.path.join(root, n), uid, gid, follow_symlinks=False)
