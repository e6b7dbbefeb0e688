"""Reading files a harness or a verifier wrote, without trusting them.

Everything under a workspace, an ``artifacts/`` folder or a verifier's reward
folder was written by code the policy controls. Gyre reads a few of those files
on the host, sometimes as root: the verifier's ``reward.txt`` / ``reward.json``
/ ``junit.xml`` and the harness's ``model_calls.json``. Each such read here is

- **no-follow**: the final component is opened with ``O_NOFOLLOW`` relative to
  a directory descriptor opened (also without following) before the untrusted
  code ran, so neither ``reward.txt -> /etc/shadow`` nor a swapped parent
  folder reaches a host file;
- **non-blocking**: ``O_NONBLOCK``, so a FIFO named like a result file returns
  at once instead of parking a thread forever;
- **a regular file only**: ``fstat`` must say ``S_ISREG`` (no FIFO, socket,
  ``/dev/zero``);
- **bounded**: the size is checked before reading and at most ``limit`` bytes
  are read (a 512 MiB sparse file is refused, not loaded);
- **quoted briefly**: :func:`quote` shows a few bytes of bad content, so a
  record never carries a file's contents.

Pure stdlib; callers run these off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

READ_LIMIT = 64 * 1024  # result files are a number, a small JSON object or a junit summary
_QUOTE = 16


class UnsafeFile(Exception):
    """A harness-written file that is not a small regular file; the message says why."""


def printable(s: str) -> str:
    """``s`` with lone surrogates (a file name's undecodable bytes, a JSON ``"\\ud800"``)
    replaced: a record must serialise as UTF-8 (pydantic refuses surrogates)."""
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def quote(data: bytes | str, n: int = _QUOTE) -> str:
    """At most ``n`` characters of ``data`` for an error message (``repr``, ``…`` if cut)."""
    s = data.decode("utf-8", "replace") if isinstance(data, bytes) else printable(data)
    return repr(s[:n]) + ("…" if len(s) > n else "")


def open_dir(path: Path) -> int:
    """A descriptor of the directory ``path`` itself (its last component not a link)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_at(dir_fd: int, name: str, limit: int = READ_LIMIT) -> bytes | None:
    """The bytes of regular file ``name`` in the directory ``dir_fd``; None if it does not exist.

    Raises :class:`UnsafeFile` for a link, a non-regular file, a file over
    ``limit`` bytes, or one that cannot be read; never blocks, never follows.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        # ELOOP: the name is a symlink (O_NOFOLLOW); anything else: unreadable.
        what = "a symbolic link" if e.errno == errno.ELOOP else f"unreadable ({e.strerror})"
        raise UnsafeFile(f"{name} is {what}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{name} is not a regular file")
        if st.st_size > limit:
            raise UnsafeFile(f"{name} is {st.st_size} bytes (limit {limit})")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, limit + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:  # grew while we read it
            raise UnsafeFile(f"{name} is over {limit} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise UnsafeFile(f"{name} is unreadable ({e.strerror})") from None
    finally:
        os.close(fd)


def read_file(path: str | Path, limit: int = READ_LIMIT) -> bytes | None:
    """:func:`read_at` for ``path``: its parent opened without following its last component.

    For files whose parent the untrusted side could not replace (the
    executor's own ``artifacts/`` folder, which the harness can write into but
    not rename); where it could, open the directory first with :func:`open_dir`.
    """
    p = Path(path)
    try:
        d = open_dir(p.parent)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafeFile(f"{p.parent.name}/ is not a plain directory ({e.strerror})") from None
    try:
        return read_at(d, p.name, limit)
    finally:
        os.close(d)
