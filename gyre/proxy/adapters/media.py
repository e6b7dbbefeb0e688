"""Validation of image parts: the model here is text-only, but a malformed image is still a 400.

The real APIs refuse an image block without a source or with data that is not
base64; a proxy that answered 200 would teach a harness that a broken request
works. The image itself is not decoded (only its shape is checked, in one regex
pass with no copy), since it is not rendered.
"""

from __future__ import annotations

import re
from typing import Any

from gyre.proxy.errors import bad_request

_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(;[\w.+-]+=[\w.+-]+)*;base64,", re.A)


def _check_base64(data: str, where: str) -> None:
    if not data or len(data) % 4 or _B64.fullmatch(data) is None:
        raise bad_request(f"{where}: the image data is not valid base64")


def check_anthropic_image(block: dict[str, Any], where: str) -> None:
    """``{"type": "image", "source": {"type": "base64"|"url"|"file", ...}}``."""
    src = block.get("source")
    if not isinstance(src, dict):
        raise bad_request(f"{where}.source: an image block needs a source object")
    kind = src.get("type")
    if kind == "base64":
        if not isinstance(src.get("media_type"), str) or not src["media_type"]:
            raise bad_request(f"{where}.source.media_type: expected a string")
        if not isinstance(src.get("data"), str):
            raise bad_request(f"{where}.source.data: expected a base64 string")
        _check_base64(src["data"], f"{where}.source.data")
    elif kind == "url":
        if not isinstance(src.get("url"), str) or not src["url"]:
            raise bad_request(f"{where}.source.url: expected a non-empty string")
    elif kind == "file":
        if not isinstance(src.get("file_id"), str) or not src["file_id"]:
            raise bad_request(f"{where}.source.file_id: expected a non-empty string")
    else:
        raise bad_request(f"{where}.source.type: expected base64, url or file, got {kind!r}")


def check_openai_image(part: dict[str, Any], where: str) -> None:
    """``{"type": "image_url", "image_url": {"url": "https://..." | "data:image/png;base64,..."}}``."""
    iu = part.get("image_url")
    url = iu.get("url") if isinstance(iu, dict) else None
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}.image_url.url: expected a non-empty string", param="messages")
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None:
            raise bad_request(
                f"{where}.image_url.url: a data URL must be data:<type>;base64,<data>",
                param="messages",
            )
        _check_base64(url[m.end() :], f"{where}.image_url.url")
