"""The one free-port helper (gyre.ports) every package, test and benchmark uses."""

from __future__ import annotations

import socket

from gyre.ports import free_ports


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_one_port_by_default_on_the_host_given():
    (port,) = free_ports(host="127.0.0.1")
    assert 0 < port < 65536
