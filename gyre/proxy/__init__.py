"""Harness proxy: OpenAI/Anthropic endpoints in front of token-level engines, recording
token-exact traces per execution (see docs/proxy.md).

Public API: :class:`ProxyConfig`, :func:`build_app`, :class:`ProxyServer` (start/stop on
127.0.0.1), :class:`ProxyAdminClient` (register an execution key). Importing this package
is cheap; the heavy parts load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProxyConfig", "ProxyServer", "ProxyAdminClient", "build_app"]


def __getattr__(name: str) -> Any:
    if name == "ProxyConfig":
        from gyre.proxy.config import ProxyConfig

        return ProxyConfig
    if name == "ProxyServer":
        from gyre.proxy.runner import ProxyServer

        return ProxyServer
    if name == "ProxyAdminClient":
        from gyre.proxy.admin import ProxyAdminClient

        return ProxyAdminClient
    if name == "build_app":
        from gyre.proxy.app import build_app

        return build_app
    raise AttributeError(name)
