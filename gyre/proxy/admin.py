"""Client for the proxy's admin routes (what the harness executor and the runtime call).

The admin routes listen only on the proxy's unix socket (never on the API port
harnesses reach): ``ProxyAdminClient(server.admin_socket, token)``, or
``server.admin_client()`` for an in-process :class:`~gyre.proxy.runner.ProxyServer`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx


class ProxyAdminError(RuntimeError):
    pass


class ProxyAdminClient:
    """``ProxyAdminClient(admin_socket, admin_token).register(execution_id, label) -> api_key``.

    Synchronous on purpose: the harness executor registers a key before it
    launches a harness process, outside any event loop.
    """

    def __init__(self, admin_socket: str, admin_token: str, timeout: float = 30.0) -> None:
        if admin_socket.startswith(("http://", "https://")):
            raise ValueError(
                "the proxy's admin routes are on its unix socket (ProxyServer.admin_socket, "
                "`gyre proxy` prints it), not on the API URL"
            )
        self.admin_socket = admin_socket
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=admin_socket),
            base_url="http://gyre-admin",
            timeout=timeout,
            headers={"authorization": f"Bearer {admin_token}"},
        )

    def _call(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        r = self._http.request(method, path, json=json)
        if r.status_code >= 400:
            raise ProxyAdminError(f"{method} {path} -> {r.status_code}: {r.text[:500]}")
        return r.json()

    def register(self, execution_id: str, label: str = "", key: str | None = None) -> str:
        body: dict[str, Any] = {"execution_id": execution_id, "label": label}
        if key is not None:
            body["key"] = key
        return self._call("POST", "/admin/executions", body)["api_key"]

    def revoke(self, execution_id: str) -> int:
        return self._call("DELETE", f"/admin/executions/{quote(execution_id, safe='')}")[
            "revoked_keys"
        ]

    def calls(self, execution_id: str) -> dict[str, Any]:
        """``{"attempted", "answered", "last_error"}``: the execution's model calls so far."""
        return self._call("GET", f"/admin/executions/{quote(execution_id, safe='')}")

    def executions(self) -> dict[str, str]:
        return self._call("GET", "/admin/executions")["executions"]

    def add_engine(self, url: str) -> list[dict[str, Any]]:
        return self._call("POST", "/admin/engines", {"url": url})["engines"]

    def drain(self, url: str) -> int:
        return self._call("POST", "/admin/engines/drain", {"url": url})["moved"]

    def remove_engine(self, url: str) -> list[dict[str, Any]]:
        return self._call("POST", "/admin/engines/remove", {"url": url})["engines"]

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/admin/stats")

    def health(self) -> dict[str, Any]:
        """Engine details (urls, states, reachability); the API port's /health has counts only."""
        r = self._http.get("/health")
        if r.status_code not in (200, 503):
            raise ProxyAdminError(f"GET /health -> {r.status_code}: {r.text[:500]}")
        return r.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ProxyAdminClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
