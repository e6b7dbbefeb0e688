"""The first program inside the sandbox: drop to the sandbox user, bound resources, exec.

bwrap runs this (``python -S -I .../confine.py [opts] -- CMD...``) as the
sandbox's first process, before the network bridge and the harness. Stdlib
only, so it starts fast and needs nothing but the interpreter.

- ``--uid``/``--gid``: when Gyre runs as root, bwrap joins a user namespace
  prepared by :mod:`gyre.harness.userns` and starts this as that namespace's
  root; here the bounding set is emptied, supplementary groups cleared and the
  ids switched, so the harness holds no capability in any namespace (the
  kernel clears the permitted and effective sets on the switch from uid 0).
  Without them (Gyre run by an ordinary user) bwrap already switched the ids and
  dropped every capability itself.
- ``--own PATH``: chowned to the sandbox user before the switch (bwrap's own
  tmpfs mounts, ``/tmp`` and ``$HOME``, belong to the namespace's root).
- ``--nproc``: RLIMIT_NPROC, set *inside* the user namespace, where the kernel
  counts processes per (namespace, user): it bounds this sandbox alone, not
  every sandbox of the same host uid. Hard limit too, so it cannot be raised.
- ``--fsize``: RLIMIT_FSIZE, the largest file the harness can write.
- ``--env-fd N``: the program's environment, ``KEY=VALUE\\0`` entries in an inherited fd
  (:func:`gyre.harness.sandbox.env_memfd`), read here, inside the sandbox; the host-side
  ``bwrap`` never had it in its own environment, so nothing in it steered a host process.
- ``--bridge-listen HOST:PORT --bridge-unix SOCK`` (proxy-only network): once confined,
  this same interpreter serves :mod:`gyre.harness.netbridge` and runs the command as its
  child, instead of exec'ing a second Python for the bridge (one interpreter start less
  before every proxy-only harness).
- every inherited file descriptor above 2 is closed (the namespace fd bwrap was
  given must not reach the harness), and no_new_privs is set, so no setuid
  program can give anything back.
"""

# (no `from __future__ import annotations`: importing __future__ is a few ms of every start)
import ctypes
import os
import resource
import sys

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_CAP_LAST = 63


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def drop_to(uid: int, gid: int, own: list[str]) -> None:
    """Chown ``own`` to uid:gid, empty the bounding set, clear groups, switch ids."""
    for p in own:
        os.chown(p, uid, gid)
        os.chmod(p, 0o1777 if p == "/tmp" else 0o700)
    libc = _libc()
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap: fine
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def read_env(fd: int) -> dict[str, str]:
    """The environment written by ``env_memfd`` into ``fd``."""
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    env = {}
    for entry in b"".join(chunks).split(b"\0"):
        k, sep, v = entry.partition(b"=")
        if sep:
            env[os.fsdecode(k)] = os.fsdecode(v)
    return env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(
            "usage: confine.py [--uid N --gid N] [--own PATH]... "
            "[--nproc N] [--fsize BYTES] [--env-fd N] "
            "[--bridge-listen HOST:PORT --bridge-unix PATH] -- CMD...",
            file=sys.stderr,
        )
        return 2
    i = args.index("--")
    opts, cmd = args[:i], args[i + 1 :]
    own: list[str] = []
    o: dict[str, str] = {}
    for k, v in zip(opts[::2], opts[1::2]):
        if k == "--own":
            own.append(v)
        else:
            o[k] = v
    env = read_env(int(o["--env-fd"])) if "--env-fd" in o else dict(os.environ)
    os.closerange(3, 1 << 16)
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        print("confine: cannot set no_new_privs", file=sys.stderr)
        return 126
    if "--uid" in o:
        drop_to(int(o["--uid"]), int(o.get("--gid", o["--uid"])), own)
    if "--nproc" in o:
        n = int(o["--nproc"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    if "--fsize" in o:
        n = int(o["--fsize"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    if not cmd:
        return 0
    if "--bridge-listen" in o:
        # the bridge's module, by its path beside this file (run isolated, its folder is not on
        # sys.path); appended, so nothing there shadows the standard library
        sys.path.append(os.path.dirname(os.path.abspath(__file__)))
        import netbridge  # type: ignore[import-not-found]  # gyre.harness.netbridge

        return netbridge.bridge_and_run(o["--bridge-listen"], o["--bridge-unix"], cmd, env)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"confine: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main())
