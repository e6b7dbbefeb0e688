"""Free TCP ports, picked by the process (on the node) that will listen on them.

A leaf module (standard library only), so the engine, the trainer, the runtime, the tests and
the benchmarks share one helper. A port picked here is free *now*: the caller binds it soon
after, and asks for all the ports it needs in one call so no two picks collide.
"""

from __future__ import annotations

import socket


def free_ports(n: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now (all sockets held open together, so the OS
    cannot hand one out twice). Picked by the node that will listen on them: one machine's view
    of its own ports says nothing about another machine's."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
