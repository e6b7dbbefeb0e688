"""Which address a cell serves at, and which network interface its gloo traffic uses.

A cell's engine and the core's gloo rendezvous must be reachable from the other nodes, so they
bind the IP of the Ray node the cell runs on, not 127.0.0.1. A local run (``ray.init`` with
``_node_ip_address="127.0.0.1"``) has node IP 127.0.0.1, so its servers stay on loopback.

Gloo needs more than the rendezvous address: each rank's own sockets bind the address its
*hostname* resolves to, falling back to loopback. Where the hostname resolves to 127.x (as in
many ``/etc/hosts``), every rank would tell its peers a loopback address and a rank on another
machine would connect to itself. ``GLOO_SOCKET_IFNAME`` names the interface to bind instead;
:func:`gloo_env` sets it to the interface holding the node IP, unless the user set it already.
Loopback node IPs (one machine, several Ray nodes) leave gloo's default alone: every peer is
on the same machine there.

:func:`interface_of` is pure; :func:`ipv4_interfaces` and :func:`free_ports` touch the host.
"""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK = "127.0.0.1"


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address (127.0.0.0/8, ::1); not an IP at all: False."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def node_ip() -> str:
    """The IP of the Ray node this process runs on; 127.0.0.1 outside Ray (a cell built by a
    unit test), where Ray's own guess would be the machine's routable address."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else LOOPBACK


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free on ``host`` now (all sockets held open together, so no two
    picks collide). Picked by the node that will listen on them: the driver's view of its own
    ports says nothing about another machine's."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def interface_of(ip: str, interfaces: dict[str, str]) -> str | None:
    """The interface (name -> its IPv4 address) that holds ``ip``; None when none does."""
    return next((name for name, addr in interfaces.items() if addr == ip), None)


def ipv4_interfaces() -> dict[str, str]:
    """Each network interface's primary IPv4 address (Linux ``SIOCGIFADDR``; an interface
    without one is left out, so is everything on a system without the ioctl)."""
    import fcntl
    import struct

    out: dict[str, str] = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]  # SIOCGIFADDR
            except OSError:
                continue
            out[name] = socket.inet_ntoa(addr)
    return out


def gloo_env(ip: str, environ: dict[str, str], interfaces: dict[str, str]) -> dict[str, str]:
    """The environment a cell on node IP ``ip`` sets before joining gloo: GLOO_SOCKET_IFNAME =
    the interface holding ``ip``, when ``ip`` is not loopback and the user has not chosen one
    (``environ``); nothing otherwise, including when no interface holds ``ip``."""
    if is_loopback(ip) or environ.get("GLOO_SOCKET_IFNAME"):
        return {}
    name = interface_of(ip, interfaces)
    return {"GLOO_SOCKET_IFNAME": name} if name else {}
