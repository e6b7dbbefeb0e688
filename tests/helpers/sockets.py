"""Which TCP sockets a process tree listens on (Linux /proc only; what ``ss -ltnp`` shows).

seen = ListenerLog(root_pid)
while proc.poll() is None:
    seen.sample(); time.sleep(1)
seen.table()   # one row per (address, port, pid): who listened where
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Listener:
    addr: str
    port: int
    pid: int
    name: str  # the process's title when first seen (Ray workers retitle per task)

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.addr).is_loopback

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.addr).is_unspecified


def _addr(hex_ip: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_ip)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(
        socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    )


def listening_inodes() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in LISTEN state on this host."""
    out: dict[str, tuple[str, int]] = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A":  # TCP_LISTEN
                ip, port = f[1].split(":")
                out[f[9]] = (_addr(ip, v6), int(port, 16))
    return out


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (by parent pid, now)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree = {root}
    for pid in parent:
        chain, p = [], pid
        while p > 1 and p not in tree and len(chain) < 64:
            chain.append(p)
            p = parent.get(p, 0)
        if p in tree:
            tree.update(chain)
    return tree


class ListenerLog:
    """Every listening socket any process of ``root``'s tree held at some sample."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[str, int, int], Listener] = {}
        self.tree: set[int] = set()  # the process tree at the last sample

    def sample(self) -> None:
        inodes = listening_inodes()
        self.tree = process_tree(self.root)
        for pid in self.tree:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and (hit := inodes.get(link[8:-1])):
                    key = (hit[0], hit[1], pid)
                    self.seen.setdefault(key, Listener(hit[0], hit[1], pid, name))

    def table(self) -> str:
        rows = sorted(self.seen.values(), key=lambda s: (s.loopback, s.pid, s.port))
        return "\n".join(f"{s.addr:>15} {s.port:>6} {s.pid:>8} {s.name}" for s in rows)
