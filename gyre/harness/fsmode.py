"""File modes a harness must not leave on the host: set-id bits, and access for other users.

A sandboxed harness can ``chmod 6777`` a file in its workspace. The workspace is
kept on the host after the run, and the scorer copies it (``shutil.copytree``
keeps modes), so that file would be setuid on the host -- setuid *root* in the
scoring copy while root launches Gyre, until the copy is handed to the sandbox
user. So once the harness has stopped, and before anything reads or copies its
tree, every mode is cut to its owner's ``rwx`` (:func:`safe_mode`): no
setuid, setgid or sticky bit, nothing for group or others. Also the reverse: the
owner may always read (and enter) what is left, so no ``chmod 000`` fails the copy.

The walk is iterative (no recursion limit: a 700-deep tree is a harness's to
make), opens every directory ``O_NOFOLLOW`` relative to its parent's descriptor
and never follows a link, so a tree changed under it (a surviving child of an
unsandboxed harness) cannot send a ``chmod`` to a host file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
MAX_DEPTH = 16384  # directories deeper than this are left as they are (and counted)


def safe_mode(st_mode: int) -> int:
    """The permission bits a harness-written entry keeps on the host: the owner's rwx only.

    A directory gets all three (so the scorer can copy the tree and a cleanup remove it),
    any other entry at least read and write, so the copy never fails on a mode the harness
    chose to make it fail.
    """
    if stat.S_ISDIR(st_mode):
        return 0o700
    return (stat.S_IMODE(st_mode) & 0o700) | 0o600


def _chmod_entry(name: str, dir_fd: int, want: int) -> bool:
    """chmod one non-directory entry without following a link; True when done."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:  # a socket (ENXIO), a FIFO's peer, an unreadable file (EACCES)
        fd = -1
    if fd >= 0:
        try:
            os.fchmod(fd, want)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
    try:  # by name: the entry was lstat'ed a moment ago as a non-link
        os.chmod(name, want, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _open_dir(name: str, dir_fd: int, mode: int) -> int:
    """Open a subdirectory (never through a link) and give it its safe mode first if it
    cannot be entered as it is (a harness's ``chmod 000``)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, safe_mode(mode), dir_fd=dir_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _entered(fd: int) -> int:
    """Give an opened directory its safe mode; 1 when that changed it."""
    st = os.fstat(fd)
    if stat.S_IMODE(st.st_mode) == safe_mode(st.st_mode):
        return 0
    os.fchmod(fd, safe_mode(st.st_mode))
    return 1


def strip_tree(root: Path) -> tuple[int, int]:
    """Give every entry under ``root`` (``root`` included) its :func:`safe_mode`.

    Returns (entries changed, entries that could not be changed or reached). Links are
    never followed (their own mode means nothing on Linux).
    """
    changed = failed = 0
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return 0, 1
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        changed += _entered(top)
        stack.append((top, os.scandir(top)))
    except OSError:
        os.close(top)
        return changed, 1
    try:
        while stack:
            fd, it = stack[-1]
            entry = next(it, None)
            if entry is None:
                stack.pop()
                _close(fd, it)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                failed += 1
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if not stat.S_ISDIR(st.st_mode):
                if stat.S_IMODE(st.st_mode) != safe_mode(st.st_mode):
                    ok = _chmod_entry(entry.name, fd, safe_mode(st.st_mode))
                    changed, failed = changed + ok, failed + (not ok)
                continue
            if len(stack) >= MAX_DEPTH:
                failed += 1
                continue
            try:
                sub = _open_dir(entry.name, fd, st.st_mode)
            except OSError:
                failed += 1
                continue
            try:
                changed += _entered(sub)
                stack.append((sub, os.scandir(sub)))
            except OSError:
                os.close(sub)
                failed += 1
    finally:
        for fd, it in stack:
            _close(fd, it)
    return changed, failed


def _close(fd: int, it: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    os.close(fd)
