"""Client for the proxy's admin routes (what the harness executor and the runtime call)."""

from __future__ import annotations

from typing import Any

import httpx


class ProxyAdminError(RuntimeError):
    pass


class ProxyAdminClient:
    """``ProxyAdminClient(base_url, admin_token).register(execution_id, label) -> api_key``.

    Synchronous on purpose: the harness executor registers a key before it
    launches a harness process, outside any event loop.
    """

    def __init__(self, base_url: str, admin_token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
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
        return self._call("DELETE", f"/admin/executions/{execution_id}")["revoked_keys"]

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

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ProxyAdminClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
