"""Which address a cell serves at, and which network interface its gloo traffic uses.

On a cluster a cell's engine and the core's gloo rendezvous must be reachable from the other
nodes, so they bind the IP of the Ray node the cell runs on. A local run binds 127.0.0.1: the
driver sets ``GYRE_BIND_HOST=127.0.0.1`` for its cells (:data:`BIND_HOST_ENV`), which
:func:`node_ip` answers before asking Ray. Ray alone cannot be trusted with that: Ray 2.60
rewrites ``ray.init(_node_ip_address="127.0.0.1")`` to the machine's routable address (here
192.0.2.2), and every server of a cell followed it onto the network. :func:`ray_local_ip`
gives a local Ray instance a loopback address it keeps (127.0.0.2), so Ray's own agents that
bind the node IP (runtime-env agent, dashboard agent) stay on loopback too.

Gloo needs more than the rendezvous address: each rank's own sockets bind the address its
*hostname* resolves to, falling back to loopback. Where the hostname resolves to 127.x (as in
many ``/etc/hosts``), every rank would tell its peers a loopback address and a rank on another
machine would connect to itself. ``GLOO_SOCKET_IFNAME`` names the interface to bind instead;
:func:`gloo_env` sets it to the interface holding the node IP, unless the user set it already.
On a loopback node IP gloo is pinned to the loopback interface: its default (the hostname's
address) is the routable one on most machines, and every peer is on this machine anyway.

:func:`interface_of` is pure; :func:`ipv4_interfaces` touches the host.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

import ray

LOOPBACK = "127.0.0.1"
BIND_HOST_ENV = "GYRE_BIND_HOST"
"""Set by the driver of a local run for its cells: the address every server of theirs binds."""
RAY_LOCAL_IP = "127.0.0.2"
"""A local Ray instance's node IP: loopback, and not one Ray rewrites (127.0.0.1, localhost)."""


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address (127.0.0.0/8, ::1); not an IP at all: False."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def node_ip() -> str:
    """The address this process's servers bind: ``GYRE_BIND_HOST`` when the driver set it (a
    local run: 127.0.0.1), else the IP of the Ray node it runs on; 127.0.0.1 outside Ray (a cell
    built by a unit test), where Ray's own guess would be the machine's routable address."""
    if host := os.environ.get(BIND_HOST_ENV):
        return host
    return ray.util.get_node_ip_address() if ray.is_initialized() else LOOPBACK


def ray_local_ip(requested: str) -> str:
    """The node IP a local ``ray.init`` is given for ``requested`` (``run.ray.node_ip``): a
    loopback address Ray would rewrite to the routable one becomes :data:`RAY_LOCAL_IP`;
    anything else is the user's choice and kept."""
    return RAY_LOCAL_IP if requested in ("127.0.0.1", "localhost", "::1") else requested


def interface_of(ip: str, interfaces: dict[str, str]) -> str | None:
    """The interface (name -> its IPv4 address) that holds ``ip``; None when none does."""
    return next((name for name, addr in interfaces.items() if addr == ip), None)


def ipv4_interfaces() -> dict[str, str]:
    """Each network interface's primary IPv4 address (Linux ``SIOCGIFADDR``; an interface
    without one is left out, so is everything on a system without the ioctl)."""
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
    the interface holding ``ip`` (for a loopback ``ip``: the one holding 127.0.0.1), unless the
    user has chosen one (``environ``); nothing when no interface holds it."""
    if environ.get("GLOO_SOCKET_IFNAME"):
        return {}
    name = interface_of(LOOPBACK if is_loopback(ip) else ip, interfaces)
    return {"GLOO_SOCKET_IFNAME": name} if name else {}
