"""Copy a profile's configuration files into a sandboxed harness's fresh ``$HOME``, then exec it.

In the bubblewrap sandbox ``$HOME`` is a tmpfs made at start, so files a
profile puts there (``HarnessProfile.home_files``: ``.qwen/settings.json``,
``.codex/config.toml``) cannot be written by the executor beforehand. The
executor writes them under the execution's read-only inputs instead and starts
``python -S -I homeseed.py --from DIR -- CMD...`` inside the sandbox, after
``confine`` has switched to the sandbox user, so the copies belong to the
harness and it may rewrite them (Qwen Code migrates old settings in place).
Stdlib only, started by file: it runs before every such harness.
"""

from __future__ import annotations

import os
import shutil
import sys


def seed(src: str, home: str) -> None:
    """Copy the tree ``src`` into ``home`` (files overwritten, folders merged)."""
    shutil.copytree(src, home, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--from" or args[2] != "--":
        print("usage: homeseed.py --from DIR -- CMD...", file=sys.stderr)
        return 2
    src, cmd = args[1], args[3:]
    home = os.environ.get("HOME")
    if not home:
        print("homeseed: HOME is not set", file=sys.stderr)
        return 2
    try:
        seed(src, home)
    except OSError as e:
        print(f"homeseed: cannot copy {src} into {home}: {e}", file=sys.stderr)
        return 126
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"homeseed: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main())
