"""A stdlib OpenAI chat-completions client with the shape the reference agent uses.

``client.chat.completions.create(**kw).choices[0].message`` with ``content`` and
``tool_calls`` (``id``, ``function.name``, ``function.arguments``). Importing the
official SDK costs ~1.5 s of CPU per harness process; for short executions run by
the hundred (the quickstart) that start-up, not the model, was the bottleneck. The
wire format is the same, so the proxy sees identical requests either way.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any


class APIError(RuntimeError):
    """The endpoint answered an error or could not be reached after the retries."""


def _ns(x: Any) -> Any:
    if isinstance(x, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in x.items()})
    if isinstance(x, list):
        return [_ns(v) for v in x]
    return x


class _Completions:
    def __init__(self, owner: StdlibClient) -> None:
        self._o = owner

    def create(self, **body: Any) -> Any:
        o = self._o
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(o.max_retries + 1):
            req = urllib.request.Request(
                f"{o.base_url}/chat/completions",
                data=data,
                method="POST",
                headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {o.api_key}",
                },
            )
            try:
                with urllib.request.urlopen(req, timeout=o.timeout) as r:
                    out = json.loads(r.read())
                msg = out["choices"][0]["message"]
                msg.setdefault("content", None)
                msg["tool_calls"] = msg.get("tool_calls") or None
                return _ns(out)
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
                if e.code < 500 and e.code != 429:
                    break
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                # a refused connection is retried too, as the SDKs do: a proxy restarting on
                # its address refuses for a moment (a dead port costs the backoff, 1.5 s)
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.5 * 2**attempt)
        raise APIError(last)


class StdlibClient:
    def __init__(
        self, base_url: str, api_key: str, timeout: float = 3600.0, max_retries: int = 2
    ) -> None:
        self.base_url, self.api_key = base_url.rstrip("/"), api_key
        self.timeout, self.max_retries = timeout, max_retries
        self.chat = SimpleNamespace(completions=_Completions(self))
