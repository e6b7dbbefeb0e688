"""One model call, token-in/token-out: the unit the proxy records and trees consume.

The record is the contract between the proxy (writer) and the trajectory
processor (reader), so it is plain data with no dependency on either side.

Inputs are delta-encoded. A 500K-token execution makes hundreds of calls, each
re-sending almost the whole context; storing every input in full would make a
trace quadratic in its length. The proxy already knows which earlier call a
request extends (that is how it keeps tokens exact), so a record says
"the first ``base_len`` tokens of call ``base``'s input+output, then
``input_suffix``". A request the proxy could not bridge (the harness rewrote
history) has ``base=None`` and the whole input in ``input_suffix``.

Format changes bump ``TRACE_FORMAT_VERSION``; readers refuse versions they do
not know rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

TRACE_FORMAT_VERSION = 1


class TraceFormatError(ValueError):
    """A record that cannot be used; the message names the record."""


@dataclass(frozen=True)
class OutputSegment:
    """A run of output tokens sampled by one engine at one policy version (the engine's
    ``weight_version``, SGLang's name for it on the wire).

    A request moved off a draining engine mid-generation is resumed elsewhere,
    so one output can span engines (and, across a publication, versions).
    ``start``/``end`` index into ``output_ids`` (end exclusive).
    """

    start: int
    end: int
    engine_id: str
    policy_version: int


OLD_VERSION_KEY = "weights_version"  # a segment's version in traces written before 2026-12-08


def segment_version(d: dict[str, Any]) -> Any:
    """A written segment's policy version, under its name or the one older traces used."""
    return d.get("policy_version", d.get(OLD_VERSION_KEY))


def _segment(d: dict[str, Any]) -> OutputSegment:
    """A segment as written (older traces: the same field under its old name)."""
    rest = {k: v for k, v in d.items() if k not in ("policy_version", OLD_VERSION_KEY)}
    if "policy_version" in d or OLD_VERSION_KEY in d:
        rest["policy_version"] = segment_version(d)
    return OutputSegment(**rest)


@dataclass(frozen=True)
class TraceRecord:
    execution_id: str
    request_id: str
    seq: int  # order of arrival within the execution, 0-based
    api: str  # "openai.chat", "anthropic.messages", ...
    base: str | None  # request_id of an earlier record whose full sequence prefixes this input
    base_len: int  # tokens taken from base's input+output (0 when base is None)
    input_suffix: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    segments: tuple[OutputSegment, ...]
    finish_reason: str = "stop"
    forked: bool = False  # True when the proxy fell back to a full render
    t_start: float = 0.0
    t_end: float = 0.0
    # Request metadata for role rules (harness profiles): model name, tool names,
    # a prefix and digest of the system prompt, selected headers, the key's label.
    meta: dict[str, Any] = field(default_factory=dict)
    format: int = TRACE_FORMAT_VERSION

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise TraceFormatError naming this record if it is inconsistent."""
        where = f"record {self.request_id!r} (execution {self.execution_id!r}, seq {self.seq})"
        if self.format != TRACE_FORMAT_VERSION:
            raise TraceFormatError(
                f"{where}: trace format {self.format}, reader knows {TRACE_FORMAT_VERSION}"
            )
        if len(self.output_logprobs) != len(self.output_ids):
            raise TraceFormatError(
                f"{where}: {len(self.output_ids)} output ids but {len(self.output_logprobs)} log-probs"
            )
        if self.base is None and self.base_len != 0:
            raise TraceFormatError(f"{where}: base_len={self.base_len} without a base")
        if self.base_len < 0:
            raise TraceFormatError(f"{where}: negative base_len")
        for lp in self.output_logprobs:
            if not (lp <= 0.0) or math.isnan(lp):
                raise TraceFormatError(f"{where}: log-prob {lp!r} is not a finite value <= 0")
        pos = 0
        for s in self.segments:
            if s.start != pos or s.end < s.start:
                raise TraceFormatError(f"{where}: output segments do not tile the output")
            pos = s.end
        if self.output_ids and pos != len(self.output_ids):
            raise TraceFormatError(
                f"{where}: output segments cover {pos} of {len(self.output_ids)} tokens"
            )
        if vocab_size is not None:
            for tok in (*self.input_suffix, *self.output_ids):
                if not 0 <= tok < vocab_size:
                    raise TraceFormatError(
                        f"{where}: token id {tok} outside vocabulary of {vocab_size}"
                    )

    def to_json(self) -> dict[str, Any]:
        # shallow on purpose: asdict() deep-copies every token id (seconds for a 500K-token input)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["meta"] = dict(self.meta)
        d["input_suffix"] = list(self.input_suffix)
        d["output_ids"] = list(self.output_ids)
        d["output_logprobs"] = list(self.output_logprobs)
        d["segments"] = [asdict(s) for s in self.segments]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceRecord:
        try:
            return cls(
                execution_id=str(d["execution_id"]),
                request_id=str(d["request_id"]),
                seq=int(d["seq"]),
                api=str(d["api"]),
                base=None if d.get("base") is None else str(d["base"]),
                base_len=int(d.get("base_len", 0)),
                input_suffix=tuple(int(x) for x in d["input_suffix"]),
                output_ids=tuple(int(x) for x in d["output_ids"]),
                output_logprobs=tuple(float(x) for x in d["output_logprobs"]),
                segments=tuple(_segment(s) for s in d.get("segments", ())),
                finish_reason=str(d.get("finish_reason", "stop")),
                forked=bool(d.get("forked", False)),
                t_start=float(d.get("t_start", 0.0)),
                t_end=float(d.get("t_end", 0.0)),
                meta=dict(d.get("meta", {})),
                format=int(d.get("format", TRACE_FORMAT_VERSION)),
            )
        except (KeyError, TypeError, ValueError) as e:
            rid = d.get("request_id", "?") if isinstance(d, dict) else "?"
            raise TraceFormatError(f"record {rid!r}: malformed ({type(e).__name__}: {e})") from e


# Keys the proxy puts in ``TraceRecord.meta`` (all optional; role rules read them):
META_KEYS = {
    "model": "model name the client asked for",
    "tools": "list of tool names offered in the request, in order",
    "system_sha1": "sha1 hex of the system prompt text (all system blocks/messages joined)",
    "system_head": "first 2000 characters of the system prompt text",
    "last_user_head": "first 2000 characters of the last user message's text",
    "n_messages": "number of messages in the request",
    "headers": "selected request headers, lower-case names (user-agent, anthropic-beta, "
    "x-claude-code-session-id, x-stainless-retry-count, ...)",
    "key_label": "label of the API key the execution used (never the key itself)",
    "stream": "whether the client asked for streaming",
    # added by the proxy (additive; see docs/trace-format.md)
    "bridge": "how the input was built: continuation (base's input+output + new suffix), resample "
    "(base's input again), full (whole conversation rendered), template_fallback",
    "fork_at": "index of the first message that differed from a recorded conversation (forked records)",
    "moves": "how often the call was moved between engines (drain/engine failure) before finishing",
    "n_tool_calls": "tool calls parsed out of the output",
    "n_tool_calls_unparsed": "tool calls written in the output that the proxy could not parse "
    "(broken JSON, cut off): the client got them as text",
    "client_disconnected": "true on an abort record: the client hung up before the answer was complete",
    "bridge_verified": "debug mode only: whether a full re-render gave the same ids as the bridge",
}
