"""API keys -> executions. A key is the only identity a black-box harness carries.

* managed: only keys registered through the admin route are accepted; the run
  decides the execution id (and a label the role rules may read).
* open: any key names its own execution (``open-<sha256(key)[:16]>``), so a
  user can point their own agent at ``gyre proxy`` and get a trace per key.

Either way a request without a known key gets 401, and a key can only ever
write its own execution's trace. Keys never appear in traces or file names.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    execution_id: str
    label: str = ""


def key_from_headers(headers) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


class KeyRegistry:
    def __init__(self, mode: str = "open") -> None:
        if mode not in ("open", "managed"):
            raise ValueError(f"mode must be open or managed, got {mode!r}")
        self.mode = mode
        self._keys: dict[str, Identity] = {}

    def resolve(self, key: str | None) -> Identity | None:
        if not key:
            return None
        ident = self._keys.get(key)
        if ident is None and self.mode == "open":
            ident = Identity("open-" + hashlib.sha256(key.encode()).hexdigest()[:16])
        return ident

    def register(self, execution_id: str, label: str = "", key: str | None = None) -> str:
        if not execution_id:
            raise ValueError("execution_id must be non-empty")
        key = key or "gyre-" + secrets.token_urlsafe(24)
        old = self._keys.get(key)
        if old is not None and old.execution_id != execution_id:
            raise ValueError("that key already belongs to another execution")
        self._keys[key] = Identity(execution_id=execution_id, label=label)
        return key

    def revoke(self, execution_id: str) -> int:
        gone = [k for k, v in self._keys.items() if v.execution_id == execution_id]
        for k in gone:
            del self._keys[k]
        return len(gone)

    def executions(self) -> dict[str, str]:
        return {v.execution_id: v.label for v in self._keys.values()}
