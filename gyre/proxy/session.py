"""Per-execution state: the calls it made, and the token-exact bridge between them.

Every answered call becomes a :class:`CallNode`: its normalised messages, the
assistant turn the proxy returned (with the original tool-call argument text),
and its tokens, delta-encoded exactly like the trace record (``base``,
``base_len``, ``suffix``, ``output``).

Matching a new request (:meth:`ExecutionState.find_bridge`): walk the request's
assistant messages from the last one backwards; each is looked up by its *echo
key* (position, stripped content, tool-call ids) in an index of the assistant
turns this execution was given. A hit is confirmed by comparing the history
before it with that call's messages - first the raw JSON objects (a C-level
equality check: the harness re-sends unchanged history verbatim), then, for
messages that differ in raw form (moved ``cache_control`` markers, re-serialised
tool arguments), their normalised form after restoring cached tool-call payloads.
Only the messages after the echo are new; they alone are rendered and tokenized.

Nothing here is proportional to the context length except C-level compares
and byte concatenation: the prefix's ids are kept as ready-made JSON bytes for
the most recently used calls, so the engine request is built without
re-serialising half a million integers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.config import ProxyConfig
from gyre.proxy.counters import BridgeCounts, BridgeMode
from gyre.proxy.types import Message, ParsedCall


def echo_key(m: Message) -> tuple:
    calls = tuple((tc.get("id", ""), tc["function"]["name"]) for tc in m.get("tool_calls") or ())
    return ((m.get("content") or "").strip(), calls)


@dataclass(eq=False)
class CallNode:
    request_id: str
    seq: int
    norm: list[Message]
    raw_to_norm: list[int]  # norm index where raw item j starts; len(raw)+1 entries
    n_raw: int
    # kept only while this call is a leaf (memory: one raw copy per leaf)
    raw_items: list[Any] | None
    tools_raw: Any
    tools: list[dict] | None
    head: list[Message]  # leading system messages (rendered with every continuation)
    assistant: Message
    base: CallNode | None
    base_len: int
    suffix: list[int]
    output: list[int]
    # JSON of input+output ids as pieces (no brackets; join with b","), kept for hot calls only:
    # building the next engine request then costs one join, not re-serialising the ids
    json_parts: list[bytes] | None = None
    n_input_parts: int = 0  # json_parts[:n_input_parts] is the input
    raw_bytes: int = 0  # size of the body raw_items came from (what holding them costs, about)

    @property
    def input_len(self) -> int:
        return self.base_len + len(self.suffix)

    @property
    def full_len(self) -> int:
        return self.input_len + len(self.output)

    def materialise(self, upto: int) -> list[int]:
        """The first ``upto`` ids of this call's input+output, rebuilt along the base chain."""
        pieces: list[list[int]] = []
        node: CallNode | None = self
        need = upto
        while node is not None and need > 0:
            own = node.suffix + node.output
            if need > node.base_len:
                pieces.append(own[: need - node.base_len])
                need = node.base_len
            node = node.base
        out: list[int] = []
        for p in reversed(pieces):
            out.extend(p)
        return out


@dataclass
class Bridge:
    """How a request's input is built: ``base``'s first ``base_len`` ids, then new messages."""

    base: CallNode | None
    base_len: int
    echo: Message | None  # the re-sent assistant turn (None: plain resample of base's input)
    new: list[Message]  # messages after the echo (rendered and tokenized)
    norm: list[Message]  # the request's full normalised conversation
    raw_to_norm: list[int]
    head: list[Message]
    forked: bool = False
    fork_at: int | None = None  # index of the first message that differed from a recorded call


# How far back find_bridge looks. A resample (same input, new sample) follows the call it
# repeats closely; a fork diagnosis only labels a call that could not be bridged anyway.
RESAMPLE_LOOKBACK = 4
FORK_LOOKBACK = 64


@dataclass
class Plan:
    """One call's prompt: the bridge it extends and the tokens rendered after it."""

    request_id: str
    bridge: Bridge
    suffix: list[int]
    input_parts: list[bytes]  # JSON pieces of the input ids (prefix pieces are shared, not copied)
    input_len: int
    mode: BridgeMode
    verify_equal: bool | None = None


class _Request:
    """One request's raw messages, normalised lazily and at most once per message."""

    __slots__ = ("_cache", "_call", "_restore", "raw", "tools_raw")

    def __init__(self, call: ParsedCall, restore: Callable[[str], tuple[str, str] | None]):
        self._call, self._restore = call, restore
        self.raw = call.raw_items
        self.tools_raw = call.tools_raw
        self._cache: dict[int, list[Message]] = {}

    def norm_at(self, j: int) -> list[Message]:
        v = self._cache.get(j)
        if v is None:
            v = self._cache[j] = self._call.normalize_item(self.raw[j], self._restore)
        return v

    def same_prefix(self, node: CallNode, n: int) -> int:
        """Number of leading raw items (of the first ``n``) equal to ``node``'s messages."""
        raw, nr = self.raw, node.raw_items
        if nr is not None and raw[:n] == nr[:n]:  # C-level; identical objects compare by identity
            return n
        for j in range(n):
            if nr is not None and (raw[j] is nr[j] or raw[j] == nr[j]):
                continue
            mine = node.norm[node.raw_to_norm[j] : node.raw_to_norm[j + 1]]
            theirs = self.norm_at(j)
            if theirs != mine and not _same_turn(theirs, mine):
                return j
        return n


@dataclass
class ExecutionState:
    execution_id: str
    label: str = ""
    hot_nodes: int = ProxyConfig.model_fields["prefix_cache_nodes"].default
    next_seq: int = 0
    nodes: list[CallNode] = field(default_factory=list)
    echo_index: dict[tuple, CallNode] = field(default_factory=dict)
    tool_payloads: dict[str, tuple[str, str]] = field(default_factory=dict)
    hot: OrderedDict[int, CallNode] = field(default_factory=OrderedDict)
    counters: BridgeCounts = field(default_factory=BridgeCounts)
    # leaves holding their raw items, oldest first: at most hot_nodes of them keep them
    raw_leaves: deque[CallNode] = field(default_factory=deque)

    # -- payload cache -----------------------------------------------------------------------
    def restore(self, call_id: str) -> tuple[str, str] | None:
        return self.tool_payloads.get(call_id)

    def remember_tool_call(self, call_id: str, name: str, arguments: str) -> None:
        self.tool_payloads[call_id] = (name, arguments)

    # -- matching ----------------------------------------------------------------------------
    def find_bridge(self, call: ParsedCall) -> Bridge:
        """The cheapest exact way to build ``call``'s input, tried in this order:

        1. :meth:`_resample`: the same input as a recent call (a new sample at one context);
        2. :meth:`_extend`: an earlier call's input + its answer + new messages (the common case);
        3. :meth:`_unbridged`: everything rendered afresh (noting a rewritten history).
        """
        req = _Request(call, self.restore)
        if self.nodes:
            bridge = self._resample(req) or self._extend(req)
            if bridge is not None:
                return bridge
        return self._unbridged(req)

    def _resample(self, req: _Request) -> Bridge | None:
        """A recent call with exactly this input and tools: reuse its input ids as they are."""
        n = len(req.raw)
        for last in reversed(self.nodes[-RESAMPLE_LOOKBACK:]):
            if (
                last.n_raw == n
                and req.tools_raw == last.tools_raw
                and req.same_prefix(last, n) == n
            ):
                return Bridge(
                    base=last,
                    base_len=last.input_len,
                    echo=None,
                    new=[],
                    norm=last.norm,
                    raw_to_norm=last.raw_to_norm,
                    head=last.head,
                )
        return None

    def _extend(self, req: _Request) -> Bridge | None:
        """The latest assistant message that echoes a turn we gave, with the history before it
        unchanged: that call's input + answer are the prefix, the messages after it are new."""
        raw = req.raw
        for i in range(len(raw) - 1, -1, -1):
            m = raw[i]
            if not (isinstance(m, dict) and m.get("role") == "assistant"):
                continue
            echo = req.norm_at(i)
            if len(echo) != 1:
                continue
            node = self.echo_index.get((i, echo_key(echo[0])))
            if node is None or node.n_raw != i or req.tools_raw != node.tools_raw:
                continue
            if req.same_prefix(node, i) != i:
                continue
            new: list[Message] = []
            offsets = list(node.raw_to_norm)
            pos = len(node.norm) + 1
            offsets.append(pos)  # raw item i (the echo) -> one message
            for j in range(i + 1, len(raw)):
                part = req.norm_at(j)
                new.extend(part)
                pos += len(part)
                offsets.append(pos)
            return Bridge(
                base=node,
                base_len=node.full_len,
                echo=echo[0],
                new=new,
                norm=node.norm + [node.assistant] + new,
                raw_to_norm=offsets,
                head=node.head,
            )
        return None

    def _unbridged(self, req: _Request) -> Bridge:
        """No bridge: normalise everything, and note whether this rewrote a recorded history."""
        norm: list[Message] = []
        offsets = [0]
        for j in range(len(req.raw)):
            norm.extend(req.norm_at(j))
            offsets.append(len(norm))
        head = _head(norm)
        forked, fork_at = False, None
        for node in reversed(self.nodes[-FORK_LOOKBACK:]):
            k = _common_prefix(norm, node.norm + [node.assistant])
            if k > len(head):  # shares real conversation (not just the system prompt)
                forked, fork_at = True, k  # yet cannot extend it
                break
        return Bridge(
            base=None,
            base_len=0,
            echo=None,
            new=norm,
            norm=norm,
            raw_to_norm=offsets,
            head=head,
            forked=forked,
            fork_at=fork_at,
        )

    # -- prefix ids as JSON --------------------------------------------------------------------
    def prefix_parts(self, base: CallNode | None, base_len: int) -> list[bytes]:
        """JSON pieces of ``base``'s first ``base_len`` ids (no copy when ``base`` is hot)."""
        if base is None or base_len == 0:
            return []
        if base.json_parts is not None:
            if id(base) in self.hot:
                self.hot.move_to_end(id(base))
            if base_len == base.full_len:
                return list(base.json_parts)
            if base_len == base.input_len:
                return base.json_parts[: base.n_input_parts]
        return [jsonfast.ids_json(base.materialise(base_len))]

    def prefix_json(self, base: CallNode | None, base_len: int) -> bytes:
        return b",".join(self.prefix_parts(base, base_len))

    # -- recording ---------------------------------------------------------------------------
    def add_node(
        self,
        node: CallNode,
        prefix: list[bytes] | bytes,
        call_raw: list[Any],
        input_parts: list[bytes] | None = None,
        raw_bytes: int = 0,
    ) -> None:
        """Record an answered call; ``input_parts`` (prefix + suffix ids as JSON pieces) saves
        rebuilding them; ``raw_bytes``: the size of the body ``call_raw`` was parsed from."""
        if input_parts is None:
            prefix_list = [prefix] if isinstance(prefix, bytes) else list(prefix)
            input_parts = [
                p
                for p in prefix_list + [jsonfast.ids_json(node.suffix) if node.suffix else b""]
                if p
            ]
        if len(input_parts) > 16:  # compact now and then: one copy every ~8 calls, not one per call
            input_parts = [b",".join(input_parts)]
        node.n_input_parts = len(input_parts)
        node.json_parts = input_parts + ([jsonfast.ids_json(node.output)] if node.output else [])
        node.raw_items = call_raw
        node.raw_bytes = raw_bytes
        if (
            node.base is not None
            and node.base.raw_items is not None
            and node.base_len == node.base.full_len
        ):
            node.base.raw_items = None  # superseded by the extension: one raw copy per leaf
        self.raw_leaves.append(node)
        self.trim_raw(max(self.hot_nodes, 1))
        # the tools a conversation re-sends each call are one object, not one copy per call
        last = self.nodes[-1] if self.nodes else None
        for prev in (node.base, last):
            if prev is not None and prev.tools_raw == node.tools_raw:
                node.tools_raw, node.tools = prev.tools_raw, prev.tools
                break
        self.nodes.append(node)
        self.echo_index[(node.n_raw, echo_key(node.assistant))] = node
        for tc in node.assistant.get("tool_calls") or ():
            self.remember_tool_call(tc["id"], tc["function"]["name"], tc["function"]["arguments"])
        self.hot[id(node)] = node
        while len(self.hot) > self.hot_nodes:
            _, old = self.hot.popitem(last=False)
            old.json_parts = None

    def held_raw_bytes(self) -> int:
        """About what the raw items kept for the fast history compare hold."""
        return sum(n.raw_bytes for n in self.raw_leaves if n.raw_items is not None)

    def trim_raw(self, keep: int) -> None:
        """Keep the raw items of the newest ``keep`` leaves only. A request extending an older
        call is matched on its normalised messages instead: the same tokens, more CPU."""
        leaves = [n for n in self.raw_leaves if n.raw_items is not None]
        for n in leaves[: max(len(leaves) - keep, 0)]:
            n.raw_items = None
        self.raw_leaves = deque(leaves[-keep:] if keep > 0 else [])


def _same_turn(a: list[Message], b: list[Message]) -> bool:
    """An assistant turn the client re-serialised (reasoning dropped, whitespace) is still ours."""
    return (
        len(a) == 1
        and len(b) == 1
        and a[0].get("role") == "assistant" == b[0].get("role")
        and echo_key(a[0]) == echo_key(b[0])
    )


def _head(norm: list[Message]) -> list[Message]:
    h = 0
    while h < len(norm) and norm[h].get("role") == "system":
        h += 1
    return norm[:h]


def _common_prefix(a: list[Message], b: list[Message]) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n
