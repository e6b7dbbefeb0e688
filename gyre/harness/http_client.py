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

CONNECT_RETRY_S = 7.0
"""How long a refused or cut connection is retried (backoff 0.5, 1, 2, 4 s)."""


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
        attempt, waited = 0, 0.0
        while True:
            req = urllib.request.Request(
                f"{o.base_url}/chat/completions",
                data=data,
                method="POST",
                headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {o.api_key}",
                },
            )
            cut = False  # no answer came: refused, reset, closed (not a timeout)
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
            except (urllib.error.URLError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
                cut = not isinstance(getattr(e, "reason", e), TimeoutError)
            except (ValueError, KeyError) as e:
                last = f"{type(e).__name__}: {e}"
            attempt += 1
            # a connection refused or cut is retried for CONNECT_RETRY_S, as the SDKs retry
            # it: a proxy restarting on its address is gone for a moment (a dead port costs
            # that long before the verdict)
            if attempt > o.max_retries and not (cut and waited < CONNECT_RETRY_S):
                break
            delay = 0.5 * 2 ** min(attempt - 1, 3)
            time.sleep(delay)
            waited += delay
        raise APIError(last)


class StdlibClient:
    def __init__(
        self, base_url: str, api_key: str, timeout: float = 3600.0, max_retries: int = 2
    ) -> None:
        self.base_url, self.api_key = base_url.rstrip("/"), api_key
        self.timeout, self.max_retries = timeout, max_retries
        self.chat = SimpleNamespace(completions=_Completions(self))
