"""Whether this user's ``gyre run`` created a run directory, for ``--resume``.

``--resume DIR`` takes ``DIR/config.json`` as it is: a run directory received from someone
else may set ``run.sandbox`` off, any harness command, any model folder. Gyre cannot know what
its user meant to trust, but it can say when the directory is not one it created, so the user
looks at that config first (docs/runtime.md, "Resume").

The owner of the folder says nothing: a directory unpacked from a tarball belongs to whoever
unpacked it. A marker file alone says nothing either: it is copied along with the directory.
So ``gyre run`` writes ``RUN_DIR/.gyre-origin`` holding a random nonce and an HMAC over the
nonce and the directory's real path, keyed by a per-user secret kept outside any run directory
(``$XDG_STATE_HOME/gyre/origin.key``, else ``~/.local/state/gyre/origin.key``, mode 0600). Only
this user's Gyre can write a marker that checks, and a marker copied from another directory
does not check here. A run directory moved by its owner reads as not created here: the
notice costs one line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

MARKER = ".gyre-origin"


def _key_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gyre" / "origin.key"


def _key(create: bool) -> bytes | None:
    p = _key_path()
    try:
        return bytes.fromhex(p.read_text().strip())
    except (OSError, ValueError):
        if not create:
            return None
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another gyre run made it just now
        return _key(create=False)
    except OSError:
        return None
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def _mac(key: bytes, nonce: str, run_dir: Path) -> str:
    msg = f"{nonce}\0{os.path.realpath(run_dir)}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def mark(run_dir: Path) -> None:
    """Write the marker of a run directory this user's ``gyre run`` just created (best effort:
    without a writable key the resume only prints its notice)."""
    key = _key(create=True)
    if key is None:
        return
    nonce = secrets.token_hex(16)
    try:
        (Path(run_dir) / MARKER).write_text(
            json.dumps({"nonce": nonce, "mac": _mac(key, nonce, run_dir)}) + "\n"
        )
    except OSError:
        pass


def created_here(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a marker this user's Gyre wrote for this very directory."""
    key = _key(create=False)
    if key is None:
        return False
    try:  # a received directory's marker may be a FIFO or a link: read a regular file only
        fd = os.open(Path(run_dir) / MARKER, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            m = json.loads(f.read(4096))
        nonce, mac = str(m["nonce"]), str(m["mac"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return hmac.compare_digest(mac, _mac(key, nonce, run_dir))


def notice(run_dir: Path) -> str:
    """The one line ``gyre run --resume`` prints for a directory it did not create."""
    return (
        f"gyre run: {run_dir} was not created by this user's gyre run here; resuming it takes "
        "its config.json as it is (run.sandbox, harness command, model_dir, ...): read it first"
    )
