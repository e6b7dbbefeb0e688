"""The files of a run directory that may come from someone else, read and written safely.

Run directories are shared like data sets, so ``gyre runs`` treats one as hostile input:

- An input is read only when it is a regular file whose real path lies inside the run
  directory. A link out of it (``timeline.png -> ~/.ssh/id_ed25519``) would put the viewer's
  file into the page; a FIFO or a device would block the read forever or never end. Such a
  file is skipped as if absent, with one line on stderr naming it and why, so one planted
  file does not cost the rest of the report (the page says so where it would have shown it).
- An output is written to a new file in the same folder (``O_EXCL | O_NOFOLLOW``) that is then
  renamed over the name: a rename replaces a link at the name instead of writing through it,
  so ``report.html -> ~/.ssh/authorized_keys`` leaves the target as it was.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path

from gyre.textsafe import printable

_warned: set[str] = set()


def warn(path: Path, why: str) -> None:
    """One line on stderr per skipped file (the name printed safely: it comes from the run)."""
    key = f"{path}\0{why}"
    if key not in _warned:
        _warned.add(key)
        print(f"gyre runs: skipped {printable(str(path))}: {why}", file=sys.stderr)


def refusal(root: Path, path: Path) -> str | None:
    """Why ``path`` may not be read as one of ``root``'s files (None: it may, or it is
    absent): a link that leads out of ``root``, or something other than a regular file."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # absent or a dangling link: read as absent
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        return "a link out of the run directory"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return None


def read_bytes(root: Path, path: Path) -> bytes | None:
    """The file's bytes; None when absent, unreadable or refused (see the module's docstring)."""
    why = refusal(root, path)
    if why is not None:
        warn(path, why)
        return None
    try:  # O_NONBLOCK: a FIFO swapped in after the check opens at once, and is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warn(path, "not a regular file")
            return None
        try:
            return f.read()
        except OSError:
            return None


def read_text(root: Path, path: Path) -> str | None:
    data = read_bytes(root, path)
    return None if data is None else data.decode("utf-8", errors="replace")


def write_text(path: Path, text: str) -> None:
    """Write ``path`` as a new regular file, never through a link or into an existing file."""
    data = text.encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o644)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def own_dir(path: Path) -> bool:
    """Make ``path`` a real folder (not a link) to write into; False when something else, a
    link included, holds the name (the caller skips what it would have written there)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        warn(path, "a link or not a folder; nothing written into it")
        return False
    path.mkdir(parents=True, exist_ok=True)
    return True
