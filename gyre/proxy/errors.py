"""API-shaped errors: each API's own error body, so SDKs raise their usual exceptions.

Bad input must come back as a 4xx the client's SDK understands (never a 500),
so every error the proxy raises on purpose is an :class:`ApiError` with an HTTP
status and a kind; the route's adapter (:mod:`gyre.proxy.adapters.dialects`) picks the body.
"""

from __future__ import annotations

from typing import Any

# kind -> (openai type, anthropic type)
_TYPES = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("authentication_error", "authentication_error"),
    "permission": ("permission_error", "permission_error"),
    "not_found": ("not_found_error", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "overloaded": ("server_error", "overloaded_error"),
    "server": ("server_error", "api_error"),
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers  # e.g. Retry-After on a 503, so SDK clients back off

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.kind, _TYPES["server"])[0],
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": _TYPES.get(self.kind, _TYPES["server"])[1], "message": self.message},
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param, code=code)
