"""Copying and removing trees a harness built, bounded and without recursion.

The scorer copies the harness's workspace before the verifier sees it. That
tree is hostile input: 700 folders deep (``shutil.copytree`` recursed into a
``RecursionError`` that ended the whole run), a FIFO or socket (the copy
failed, which made the execution *missing*), a million files (the copy ate the
verifier's budget), set-id files (copied with their mode bits, as root).
:func:`copy_workspace` walks it with an explicit stack and

- copies folders, regular files and symbolic links (as links, never followed);
- **skips** FIFOs, sockets and device nodes (they are not content; the report
  lists them);
- drops set-uid, set-gid and sticky bits (mode ``& 0o777``);
- keeps a file's holes as holes (``SEEK_DATA``/``SEEK_HOLE``), so the copy takes no more
  disk than the workspace did under its quota (which counts allocated blocks);
- stops at ``max_files`` entries, ``max_bytes`` of file data or ``max_depth``
  levels with :class:`WorkspaceRefused`, as it does for an entry it cannot
  read: the workspace's own doing, which the scorer turns into a zero.

An ``OSError`` on the *destination* side (the host's disk full) propagates: that
is the infrastructure's failure, not the harness's.

:func:`remove_tree` deletes such a tree (or one a verifier grew while it ran)
without recursion, without following links and with a bounded number of open
descriptors, and never raises.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .safe_read import printable

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN_DIRS = 64  # remove_tree: deeper folders are moved up to the top first


class WorkspaceRefused(Exception):
    """The workspace cannot be copied within the limits (or at all); the message says why."""


@dataclass(frozen=True)
class CopyLimits:
    max_files: int = 200_000  # entries of any kind
    max_bytes: int = 4 << 30  # sum of regular files' sizes
    max_depth: int = 128  # folder levels below the workspace


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # FIFOs, sockets, devices (first 20)
    skipped_count: int = 0


def copy_workspace(src: Path, dst: Path, limits: CopyLimits = CopyLimits()) -> CopyReport:
    """Copy ``src`` to the new folder ``dst`` within ``limits`` (see the module docstring)."""
    rep = CopyReport()
    try:
        top = os.lstat(src)
    except OSError as e:
        raise WorkspaceRefused(f"the workspace is gone ({e.strerror})") from None
    if not stat.S_ISDIR(top.st_mode):  # e.g. replaced by a link to / by a harness unsandboxed
        raise WorkspaceRefused("the workspace is not a folder any more")
    os.mkdir(dst, 0o700)
    dir_modes: list[tuple[Path, int]] = []
    stack: list[tuple[Path, Path, int]] = [(Path(src), Path(dst), 0)]
    while stack:
        s, d, depth = stack.pop()
        for name in _list(s, src):
            se, de = s / name, d / name
            try:
                st = os.lstat(se)
            except OSError as e:
                raise WorkspaceRefused(f"{_rel(se, src)}: cannot be read ({e.strerror})") from None
            rep.files += 1
            if rep.files > limits.max_files:
                raise WorkspaceRefused(f"more than {limits.max_files} entries")
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > limits.max_depth:
                    raise WorkspaceRefused(f"folders more than {limits.max_depth} levels deep")
                os.mkdir(de, 0o700)
                dir_modes.append((de, (st.st_mode & 0o777) | 0o700))
                stack.append((se, de, depth + 1))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(se)
                except OSError as e:
                    raise WorkspaceRefused(
                        f"{_rel(se, src)}: link cannot be read ({e.strerror})"
                    ) from None
                os.symlink(target, de)
            elif stat.S_ISREG(st.st_mode):
                rep.bytes += st.st_size
                if rep.bytes > limits.max_bytes:
                    raise WorkspaceRefused(f"more than {limits.max_bytes} bytes of files")
                _copy_file(se, de, st, src)
            else:  # FIFO, socket, block or character device: not content
                rep.skipped_count += 1
                if len(rep.skipped) < 20:
                    rep.skipped.append(_rel(se, src))
    for path, mode in reversed(dir_modes):
        os.chmod(path, mode)
    return rep


def _rel(p: Path, root: Path) -> str:
    r = printable(str(p.relative_to(root)) if p != root else ".")
    return r if len(r) <= 120 else r[:60] + "…" + r[-40:]


def _list(d: Path, root: Path) -> list[str]:
    try:
        with os.scandir(d) as it:
            return [e.name for e in it]
    except OSError as e:
        raise WorkspaceRefused(f"{_rel(d, root)}: folder cannot be read ({e.strerror})") from None


def _copy_file(src: Path, dst: Path, st: os.stat_result, root: Path) -> None:
    try:
        fi = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise WorkspaceRefused(f"{_rel(src, root)}: cannot be read ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fi).st_mode):
            raise WorkspaceRefused(f"{_rel(src, root)}: changed while it was copied")
        fo = os.open(
            dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            try:
                _copy_data(fi, fo, st.st_size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # the host's disk
                    raise
                raise WorkspaceRefused(
                    f"{_rel(src, root)}: cannot be read ({e.strerror})"
                ) from None
            os.fchmod(fo, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(fo, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fo)
    finally:
        os.close(fi)


def _copy_data(fi: int, fo: int, size: int) -> None:
    """The first ``size`` bytes of ``fi`` into the new file ``fo``, holes kept as holes.

    Only the data segments (``SEEK_DATA``/``SEEK_HOLE``) are written; the size is set at
    the end. Written densely, a workspace of 2 x 64 MiB of holes (0 bytes under the
    workspace quota, which counts allocated blocks) took 128 MiB of the host's disk in
    its scoring copy. ``size`` (counted against the copy's limit) bounds what is read."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fi, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole from here on
                break
            raise
        if start >= size:
            break
        end = min(os.lseek(fi, start, os.SEEK_HOLE), size)
        os.lseek(fo, start, os.SEEK_SET)
        while start < end:
            n = os.sendfile(fo, fi, start, min(end - start, 1 << 30))
            if n == 0:  # the file shrank under us
                break
            start += n
        if start < end:
            break
        pos = end
    os.ftruncate(fo, size)


def remove_tree(path: str | Path) -> int:
    """Delete ``path`` and everything below it; the number of entries left behind. Never raises.

    Iterative, by descriptor (``unlinkat``/``openat`` with no-follow, so a link
    is removed, never followed); at most ``_MAX_OPEN_DIRS`` descriptors open:
    folders deeper than that are first moved up under the top one. Folders the
    tree's owner made unreadable are given back ``0o700`` first.
    """
    p = Path(path)
    try:
        top = os.open(p, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    except OSError:  # a link or a file (or unopenable): remove the name itself
        try:
            os.unlink(p)
            return 0
        except OSError:
            return 1
    left, moved = 0, 0
    subs, bad = _clear(top)
    left += bad
    stack: list[tuple[int, str, list[str]]] = [(top, "", subs)]
    try:
        while stack:
            fd, name, pending = stack[-1]
            if pending:
                child = pending.pop()
                if len(stack) >= _MAX_OPEN_DIRS:  # too deep: move it up under the top folder
                    moved += 1
                    new = f".gyre-rm-{moved}"
                    try:
                        os.rename(child, new, src_dir_fd=fd, dst_dir_fd=top)
                        stack[0][2].append(new)
                    except OSError:
                        left += 1
                    continue
                sub = _open_sub(fd, child)
                if sub is None:
                    left += 1
                    continue
                subs, bad = _clear(sub)
                left += bad
                stack.append((sub, child, subs))
                continue
            stack.pop()
            os.close(fd)
            try:
                if stack:
                    os.rmdir(name, dir_fd=stack[-1][0])
                else:
                    os.rmdir(p)
            except OSError:
                left += 1
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return left


def _clear(fd: int) -> tuple[list[str], int]:
    """Unlink every non-folder in the folder ``fd``; (its subfolders' names, failures)."""
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError:
        return [], 1
    subdirs, bad = [], 0
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except PermissionError:
            try:
                os.fchmod(fd, 0o700)
                os.unlink(name, dir_fd=fd)
            except OSError:
                bad += 1
        except FileNotFoundError:
            pass
        except OSError:
            bad += 1
    return subdirs, bad


def _open_sub(fd: int, name: str) -> int | None:
    for attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except PermissionError:
            if attempt:
                return None
            try:
                os.fchmod(fd, 0o700)
                os.chmod(name, 0o700, dir_fd=fd)
            except OSError:
                return None
        except OSError:
            return None
    return None
