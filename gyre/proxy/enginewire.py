"""The SGLang ``/generate`` wire, both ways: the request body as byte pieces, the answer checked.

The body is assembled from pre-serialised JSON bytes (the prefix ids of a long context are
cached as JSON by the session), so sending a 500K-token input costs a memcpy, not half a
million ``int -> str`` conversions. An answer that is not the ``/generate`` JSON is an
:class:`EngineProtocolError`; a 4xx is the client's fault, a 5xx the engine's. Each answer's
tokens become trace output segments, one per engine and weights version.
"""

from __future__ import annotations

from typing import Any

import aiohttp.payload

from gyre.engine.client import EngineProtocolError
from gyre.proxy import jsonfast
from gyre.proxy.enginefaults import EngineBroke
from gyre.proxy.errors import ApiError
from gyre.trace.record import OutputSegment

JSON_HEADERS = {"content-type": "application/json"}


BIG_PIECE = 64 << 10
"""Body pieces at least this long are written as they are; runs of smaller ones are joined first
(a write is a syscall, and joining a few KiB is cheaper than one)."""


def generate_body(
    rid: str,
    input_parts: list[bytes],
    extra_ids: list[int],
    sampling: dict[str, Any],
    stream: bool,
) -> PartsPayload:
    """The /generate body as pieces around the pre-serialised id pieces: the big (cached prefix)
    pieces are never joined or copied, they go to the socket as they are (:class:`PartsPayload`)."""
    out = [b'{"rid":' + jsonfast.dumps(rid) + b',"input_ids":[']
    first = True
    for p in input_parts:
        if p:
            if not first:
                out.append(b",")
            out.append(p)
            first = False
    if extra_ids:
        if not first:
            out.append(b",")
        out.append(jsonfast.ids_json(extra_ids))
    out.append(
        b'],"sampling_params":'
        + jsonfast.dumps(sampling)
        + b',"return_logprob":true,"stream":'
        + (b"true" if stream else b"false")
        + b"}"
    )
    return PartsPayload(coalesce(out))


def coalesce(parts: list[bytes], big: int = BIG_PIECE) -> list[bytes]:
    out: list[bytes] = []
    run: list[bytes] = []
    for p in parts:
        if len(p) >= big:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out


class PartsPayload(aiohttp.payload.Payload):
    """A JSON request body given as byte pieces, written to the connection piece by piece.

    A 500K-token ``/generate`` body is ~3 MB, nearly all of it the cached JSON of the prefix ids;
    joining the pieces would copy it once more per call (and once per resume). The pieces are
    handed to the transport as they are (Content-Length is their total), so the only per-call
    copy left is the kernel's.
    """

    _autoclose = True  # bytes in memory, nothing to close

    def __init__(self, parts: list[bytes]) -> None:
        super().__init__(parts, content_type="application/json")
        self._size = sum(len(p) for p in parts)

    @property
    def parts(self) -> list[bytes]:
        return self._value

    def joined(self) -> bytes:
        return b"".join(self._value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.joined().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.joined()

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        size = self._size
        assert size is not None  # set by __init__ (aiohttp types it Optional)
        left = size if content_length is None else min(content_length, size)
        for p in self._value:
            if left <= 0:
                break
            if len(p) > left:
                p = p[:left]
            await writer.write(p)
            left -= len(p)


# -- the answer ---------------------------------------------------------------------------------
def peek(raw: bytes) -> str:
    text = raw[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(raw) > 120 else "")


def error_code(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 500


def raise_engine_error(status: int, text: str, url: str) -> None:
    if 400 <= status < 500:
        raise ApiError(400, f"engine rejected the request: {text[:500]}")
    raise EngineBroke(f"engine {url} answered {status}: {text[:200]}")


def unpack_checked(data: Any):
    """:func:`unpack`, with anything that is not a ``/generate`` answer a protocol error."""
    if not isinstance(data, dict) or not isinstance(data.get("output_ids", []), list):
        raise EngineProtocolError(f"not a /generate answer: {peek(jsonfast.dumps(data))}")
    try:
        return unpack(data)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise EngineProtocolError(f"malformed /generate answer ({type(e).__name__}: {e})") from None


def unpack(data: dict[str, Any]):
    meta = data.get("meta_info") or {}
    ids = [int(t) for t in data.get("output_ids") or []]
    lps_raw = meta.get("output_token_logprobs") or []
    lps = [float(x[0]) if x[0] is not None else 0.0 for x in lps_raw]
    if len(lps) < len(ids):  # an engine that did not return log-probs for every token
        lps = lps + [0.0] * (len(ids) - len(lps))
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    marks = [(int(i), _version(v)) for i, v in meta.get("weight_version_segments") or []]
    if not marks and meta.get("weight_version") is not None:
        marks = [(0, _version(meta["weight_version"]))]
    return ids, lps[: len(ids)], finish, marks


def _version(v: Any) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return -1  # SGLang's "default" and other non-numeric labels


# -- trace output segments ----------------------------------------------------------------------
def output_segments(
    start: int, end: int, engine_id: str, marks: list[tuple[int, int]]
) -> list[OutputSegment]:
    """Output ``[start, end)`` from one engine attempt, split where its weights version changed."""
    if not marks:
        return [OutputSegment(start=start, end=end, engine_id=engine_id, policy_version=-1)]
    marks = sorted(marks)
    marks[0] = (0, marks[0][1])
    out = []
    for k, (i, v) in enumerate(marks):
        s = min(start + i, end)
        e = min(start + marks[k + 1][0], end) if k + 1 < len(marks) else end
        if e > s:
            out.append(OutputSegment(start=s, end=e, engine_id=engine_id, policy_version=v))
    return out


def merge_segments(segs: list[OutputSegment]) -> list[OutputSegment]:
    out: list[OutputSegment] = []
    for s in segs:
        if (
            out
            and out[-1].engine_id == s.engine_id
            and out[-1].policy_version == s.policy_version
            and out[-1].end == s.start
        ):
            out[-1] = OutputSegment(
                start=out[-1].start,
                end=s.end,
                engine_id=s.engine_id,
                policy_version=s.policy_version,
            )
        else:
            out.append(s)
    return out
