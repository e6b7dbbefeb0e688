"""Where the cells' gloo world meets: a file only the run's user can open, not a TCP port.

torch's TCPStore has no authentication. On loopback any local user could connect to the
world's rendezvous, list its keys, read rank 0's address and, by the protocol's ``SET``,
rewrite a rank's address during a world rebuild (after a cell restart), putting a stranger
between the cells' gradient reduce. When every cell runs on the driver's machine (a local run),
the rendezvous is a torch ``FileStore`` in a folder the driver creates with mode 0700
(``tempfile.mkdtemp``): the cells are Ray actors of the same user and open it; another user
cannot enter the folder. Each world (the first, and each rebuild after a cell restart) gets a
fresh file, since a killed rank never finishes a FileStore's cleanup and its stale keys would
meet the new world. The folder goes with the cluster.

A cell on another machine cannot see the folder (``Cell.sees``): then the world keeps the
TCPStore on the core's node IP, which every host that reaches that address and every local user
of that node can reach (docs/runtime.md, "Network exposure"). ``GYRE_RENDEZVOUS=tcp`` in the
driver's environment asks for that TCPStore on one machine too: the two-node test's cluster
stands in for two machines on one.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any


class Rendezvous:
    """The driver's private folder for the worlds' store files, made on first use."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.token = secrets.token_hex(16)
        self.generation = 0

    def _folder(self) -> str:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="gyre-rdv-")  # 0700, owned by the driver's user
            (Path(self.folder) / "token").write_text(self.token)
        return self.folder

    async def store_file(self, cells: list[Any]) -> str | None:
        """A fresh store file for the next world when every cell sees the folder, else None
        (the world then meets over TCP)."""
        if os.environ.get("GYRE_RENDEZVOUS") == "tcp":
            return None
        folder = self._folder()
        seen = await asyncio.gather(*[c.sees.remote(folder, self.token) for c in cells])
        self.generation += 1
        return f"{folder}/world-{self.generation}" if all(seen) else None

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
