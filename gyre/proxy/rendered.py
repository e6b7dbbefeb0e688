"""What of a request this model's chat template renders beyond the text every template shows.

The prompt-size floor (:mod:`gyre.proxy.promptsize`) must count every character the template
will render, or a request can hide megabytes where the floor does not look (tool definitions,
reasoning): 5 MB in ``tools[].description`` was rendered and tokenized in full (57 s, +1.6 GB)
before its 400. But templates differ in what they show: Qwen3 dumps each tool as JSON and shows
the reasoning of the turns after the last user message, a plain ChatML template shows no tools
and every ``<think>`` block as written. Counting what a template does not render would refuse
prompts that fit, so the proxy asks the template once, at start: it renders a probe conversation
with marker strings in each place and looks for which markers come out. Rendering the probe is
a few milliseconds; a template that fails on it is assumed to show none of these (the floor
then counts as little as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Placement = Literal["none", "last", "since_user", "all"]
"""Which assistant turns' reasoning a template shows: none; only the last assistant turn; those
after the last user message (Qwen3); all of them."""

ToolsShown = Literal["none", "names", "described", "json"]
"""How a template shows tool definitions: not at all; names; names and descriptions; the whole
definition as JSON (every key and string value)."""

_M = "gyreprobe"


@dataclass(frozen=True)
class RenderedShape:
    tools: ToolsShown = "none"
    reasoning: Placement = "none"  # a turn's reasoning_content / thinking / reasoning items
    think: Placement = "none"  # the <think>...</think> part of an assistant turn's text


def _probe_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": f"{_M}fn",
            "description": f"{_M}desc",
            "parameters": {
                "type": "object",
                "properties": {f"{_M}key": {"type": "string", "description": f"{_M}pdesc"}},
                f"x{_M}extra": f"{_M}value",
            },
        },
    }


def _tools_shown(render: Callable[..., str]) -> ToolsShown:
    try:
        base = render([{"role": "user", "content": "x"}], None)
        out = render([{"role": "user", "content": "x"}], [_probe_tool()])
    except Exception:  # a template that cannot render tools at all
        return "none"
    if out == base:
        return "none"
    markers = (f"{_M}desc", f"{_M}key", f"{_M}pdesc", f"x{_M}extra", f"{_M}value")
    if all(m in out for m in markers):
        return "json"
    if f"{_M}desc" in out and f"{_M}fn" in out:
        return "described"
    return "names" if f"{_M}fn" in out else "none"


def _call(i: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'},
        }
    ]


def _placement(render: Callable[..., str], turn: Callable[[str, str], dict[str, Any]]) -> Placement:
    """Render [user, A1, user, A2 + call, tool, A3 + call, tool]; which A's reasoning shows."""
    a1, a2, a3 = turn(f"{_M}r1", "one"), turn(f"{_M}r2", "two"), turn(f"{_M}r3", "three")
    convo = [
        {"role": "user", "content": "u1"},
        a1,
        {"role": "user", "content": "u2"},
        {**a2, "tool_calls": _call(2)},
        {"role": "tool", "tool_call_id": "call_2", "content": "t2"},
        {**a3, "tool_calls": _call(3)},
        {"role": "tool", "tool_call_id": "call_3", "content": "t3"},
    ]
    try:
        out = render(convo, None)
    except Exception:
        try:  # a template without tool calls: the last turn is the last assistant one
            out = render(convo[:3] + [a3], None)
        except Exception:
            return "none"
        if f"{_M}r1" in out:
            return "all"
        return "last" if f"{_M}r3" in out else "none"
    if f"{_M}r1" in out:
        return "all"
    if f"{_M}r2" in out and f"{_M}r3" in out:
        return "since_user"
    return "last" if f"{_M}r3" in out else "none"


def probe(render: Callable[..., str]) -> RenderedShape:
    """``render(messages, tools)``: the template's text for a conversation (the proxy's
    :meth:`gyre.proxy.render.Renderer.text`)."""

    def with_reasoning(r: str, content: str) -> dict[str, Any]:
        return {"role": "assistant", "content": content, "reasoning_content": r}

    def with_think(r: str, content: str) -> dict[str, Any]:
        return {"role": "assistant", "content": f"<think>\n{r}\n</think>\n\n{content}"}

    return RenderedShape(
        tools=_tools_shown(render),
        reasoning=_placement(render, with_reasoning),
        think=_placement(render, with_think),
    )
