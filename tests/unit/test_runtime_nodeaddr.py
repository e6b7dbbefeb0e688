"""Where a cell serves and which interface its gloo sockets bind (gyre.runtime.nodeaddr)."""

from __future__ import annotations

from gyre.runtime.nodeaddr import (
    gloo_env,
    interface_of,
    ipv4_interfaces,
    is_loopback,
    node_ip,
    ray_local_ip,
)

IFACES = {"lo": "127.0.0.1", "eth0": "10.1.2.3", "ib0": "192.168.7.9"}


def test_loopback_is_all_of_127_slash_8_and_v6():
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.3") and is_loopback("::1")
    assert not is_loopback("10.1.2.3") and not is_loopback("not-an-ip")


def test_the_interface_holding_the_node_ip_is_found():
    assert interface_of("192.168.7.9", IFACES) == "ib0"
    assert interface_of("10.9.9.9", IFACES) is None


def test_gloo_binds_the_node_ip_interface_on_a_routable_node():
    assert gloo_env("10.1.2.3", {}, IFACES) == {"GLOO_SOCKET_IFNAME": "eth0"}


def test_gloo_is_pinned_to_loopback_on_loopback_nodes():
    # gloo's default is the hostname's address: the routable one on most machines
    assert gloo_env("127.0.0.1", {}, IFACES) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert gloo_env("127.0.0.3", {}, IFACES) == {"GLOO_SOCKET_IFNAME": "lo"}  # Ray nodes, 1 host


def test_gloo_default_is_left_for_unknown_ips_and_a_user_choice():
    assert gloo_env("10.9.9.9", {}, IFACES) == {}  # no interface holds it: gloo's own pick
    assert gloo_env("10.1.2.3", {"GLOO_SOCKET_IFNAME": "ib0"}, IFACES) == {}
    assert gloo_env("127.0.0.1", {"GLOO_SOCKET_IFNAME": "eth0"}, IFACES) == {}


def test_a_local_run_binds_what_the_driver_set_not_what_ray_reports(monkeypatch):
    monkeypatch.delenv("GYRE_BIND_HOST", raising=False)
    assert node_ip() == "127.0.0.1"  # outside Ray
    monkeypatch.setenv("GYRE_BIND_HOST", "127.0.0.9")
    assert node_ip() == "127.0.0.9"


def test_a_local_ray_gets_a_loopback_ip_it_does_not_rewrite():
    # Ray 2.60 turns 127.0.0.1 / localhost into the machine's routable address
    assert ray_local_ip("127.0.0.1") == ray_local_ip("localhost") == "127.0.0.2"
    assert is_loopback(ray_local_ip("127.0.0.1"))
    assert ray_local_ip("127.0.0.5") == "127.0.0.5"  # the user's own choice stays
    assert ray_local_ip("10.1.2.3") == "10.1.2.3"


def test_this_host_lists_loopback():
    assert interface_of("127.0.0.1", ipv4_interfaces()) is not None
