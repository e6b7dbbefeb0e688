"""The fenced-bash tool protocol: the shared chat template renders a tool call as the block the
proxy's ``bash`` parser reads back as the same call, through a real (offline-trained)
tokenizer, and the proxy's token-exact continuation works with that template."""

from __future__ import annotations

import json
from functools import cache
from itertools import count
from typing import Any

import pytest

from gyre.harness.families import toolproto
from gyre.proxy.parsing import BashBlockParser, make_parser
from gyre.proxy.render import Renderer
from gyre.proxy.types import TextDelta, ToolCallEvent


@cache
def _tok() -> Any:
    from gyre.models.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = toolproto.CHAT_TEMPLATE
    return tok


def _parse(text: str, chunk: int) -> tuple[str, list[tuple[str, dict]], int]:
    ids = count()
    p = make_parser("bash", lambda: f"call_{next(ids)}")
    events = []
    for i in range(0, len(text), chunk):  # streamed in pieces, as the proxy feeds it
        events += p.feed(text[i : i + chunk])
    events += p.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [
        (e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, ToolCallEvent)
    ]
    return content, calls, p.n_unparsed


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": toolproto.SYSTEM},
    {"role": "user", "content": "What is 382 * 686? End your reply with a line 'Answer: <n>'."},
    {
        "role": "assistant",
        "content": "Let me compute it.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {
                    "name": "run_command",
                    "arguments": json.dumps({"command": "echo $((382 * 686))"}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "exit status 0\n262052\n"},
    {"role": "assistant", "content": "Answer: 262052"},
]


@pytest.mark.parametrize("content", ["Let me compute it.", ""])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_template_renders_a_call_the_parser_reads_back(content: str, chunk: int) -> None:
    tok = _tok()
    conv = [dict(m) for m in CONVERSATION]
    conv[2]["content"] = content
    text = Renderer(tok).text(conv)
    assert "<|im_start|>user\nexit status 0\n262052\n<|im_end|>" in text  # the result: a user turn
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert turn.endswith("```bash\necho $((382 * 686))\n```")
    # what the model would have generated: the turn's own tokens, decoded
    ids = tok.encode(turn, add_special_tokens=False)
    generated = tok.decode(ids, skip_special_tokens=False)
    assert generated == turn
    got_content, calls, unparsed = _parse(generated, chunk)
    assert calls == [("run_command", {"command": "echo $((382 * 686))"})]
    assert got_content == content and unparsed == 0
    # and rendered again from the parsed call: the same text, so a full re-render is exact
    again = [dict(m) for m in conv]
    again[2] = {
        "role": "assistant",
        "content": got_content,
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for n, a in calls
        ],
    }
    assert Renderer(tok).text(again) == text


def test_proxy_continuation_after_a_bash_call() -> None:
    """The proxy's bridge: only the tool result and the next generation prompt are new."""
    tok = _tok()
    r = Renderer(tok)
    head, assistant, tool = CONVERSATION[:2], CONVERSATION[2], CONVERSATION[3]
    ids = r.continuation(head[:1], assistant, [tool], None, tok.eos_token_id)
    assert ids is not None
    assert tok.decode(ids) == "\n<|im_start|>user\nexit status 0\n262052\n<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("reply", "content", "calls", "unparsed"),
    [
        ("Answer: 12", "Answer: 12", [], 0),
        ("```bash\nls data\n```", "", [{"command": "ls data"}], 0),
        ("```sh\ncat a.txt\n```", "", [{"command": "cat a.txt"}], 0),
        ("```bash\necho $((3*4))```", "", [{"command": "echo $((3*4))"}], 0),
        (
            "First:\n```bash\ncat a\n```\nthen\n```bash\ncat b\n```",
            "First:\n\nthen",  # the text around the blocks, whitespace kept
            [{"command": "cat a"}, {"command": "cat b"}],
            0,
        ),
        ("```python\nprint(1)\n```", "```python\nprint(1)\n```", [], 0),  # not a shell block
        ("```bash\n\n```", "```bash\n\n```", [], 1),  # empty: not a call
        ("Run:\n```bash\necho $((12 *", "Run:\n```bash\necho $((12 *", [], 1),  # cut off
        (
            '```bash\necho "a\\"b" | grep \'x\'\n```',
            "",
            [{"command": 'echo "a\\"b" | grep \'x\''}],
            0,
        ),
    ],
)
def test_bash_parser_cases(reply: str, content: str, calls: list, unparsed: int) -> None:
    for chunk in (1, 3, 10_000):
        got_content, got_calls, got_unparsed = _parse(reply, chunk)
        assert got_content == content, chunk
        assert [a for _, a in got_calls] == calls and got_unparsed == unparsed
        assert all(n == "run_command" for n, _ in got_calls)


def test_installed_model_dir_has_the_template(tmp_path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "chat_template.jinja").write_text("old")
    (src / "weights.bin").write_bytes(b"x")
    out = toolproto.install_template(src, tmp_path / "tools")
    assert (out / "chat_template.jinja").read_text() == toolproto.CHAT_TEMPLATE
    assert (out / "weights.bin").is_symlink() and (out / "config.json").read_text() == "{}"
    toolproto.install_template(src, out)  # idempotent
    with pytest.raises(ValueError, match="not a model directory"):
        toolproto.install_template(tmp_path / "nope", tmp_path / "x")
    assert isinstance(make_parser("bash", str), BashBlockParser)


def test_worked_exchange_only_when_tools_are_offered() -> None:
    """The reference agent offers tools and gets the exchange as chat turns; a text-based
    harness offers none and gets SmolLM2's plain ChatML. The exchange is what the template
    renders of :data:`toolproto.EXAMPLE` (so the hand-written text cannot drift from it)."""
    tok = _tok()
    r = Renderer(tok)
    tools = [{"type": "function", "function": {"name": "run_command", "parameters": {}}}]
    conv = [{"role": "system", "content": toolproto.SYSTEM}, {"role": "user", "content": "Q"}]
    with_tools = r.text(conv, tools, add_generation_prompt=True)
    without = r.text(conv, None, add_generation_prompt=True)
    assert toolproto._EXAMPLE_TEXT in with_tools and "123 * 45" not in without
    assert with_tools == without.replace(
        "<|im_end|>\n", "<|im_end|>\n" + toolproto._EXAMPLE_TEXT, 1
    )
    own = r.text([{"role": "system", "content": "S"}, *toolproto.EXAMPLE])
    assert own.split("<|im_end|>\n", 1)[1] == toolproto._EXAMPLE_TEXT
    default = r.text([{"role": "user", "content": "Q"}], tools)  # SmolLM2's default system line
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert toolproto._EXAMPLE_TEXT in default
    # the proxy's bridge with tools: the exchange is in the anchor, so only new turns are added
    head = [conv[0]]
    ids = r.continuation(head, CONVERSATION[2], [CONVERSATION[3]], tools, tok.eos_token_id)
    assert ids is not None and "123 * 45" not in tok.decode(ids)


def test_example_config_uses_the_protocol() -> None:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cfg = tomllib.loads((root / "examples" / "smollm2-agent.toml").read_text())
    args = cfg["run"]["harness_args"]
    assert args[args.index("--system") + 1] == toolproto.SYSTEM
    assert cfg["proxy"]["parser"] == "bash" and "--no-tools" not in args


def test_template_passes_the_checks_trl_makes_of_a_tool_template() -> None:
    """TRL 1.16 (``trl.chat_template_utils``) trains with tools only on a template that
    renders a call's name, arguments and the tool's reply, that is prefix-preserving, and
    that marks the assistant's tokens with ``{% generation %}``: the same checks, here."""
    tok = _tok()
    name, key, val, content = "tool_name_x1", "arg_key_x2", "arg_val_x3", "content_x4"
    calls = [{"type": "function", "function": {"name": name, "arguments": {key: val}}}]
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "name": name, "content": content},
    ]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    assert all(s in rendered for s in (name, key, val, content))
    ids1 = tok.apply_chat_template(msgs[:2], tokenize=True, return_dict=False)
    ids2 = tok.apply_chat_template(
        msgs, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert ids2[: len(ids1)] == ids1
    assert "{%- generation %}" in toolproto.CHAT_TEMPLATE
    out = tok.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    text = tok.decode(masked)
    assert "echo $((382 * 686))" in text and "Answer: 262052" in text and "262052\n" not in text


@pytest.mark.parametrize(
    "reply",
    [
        '```bash\necho "382 * 686" | bc\n```',
        'Let me compute it.\n```bash\necho "382 * 686" | bc\n```',
        "Answer: 262052",
        "```bash\nls data\n```\n```bash\ncat data/a.txt\n```",
    ],
)
def test_response_template_parses_as_the_proxy_does(reply: str) -> None:
    """A peer trainer parsing replies with transformers' ``parse_response`` and
    :data:`toolproto.RESPONSE_TEMPLATE` (TRL) sees the same calls and content as Gyre's proxy."""
    tok = _tok()
    tok.response_template = toolproto.RESPONSE_TEMPLATE
    prefix = tok.apply_chat_template(
        [{"role": "user", "content": "Q"}], tokenize=False, add_generation_prompt=True
    )
    got = tok.parse_response(reply + "<|im_end|>", prefix=prefix)
    content, calls, _ = _parse(reply, 10_000)
    assert (got.get("content") or "") == content
    assert [c["function"]["arguments"] for c in got.get("tool_calls") or []] == [
        a for _, a in calls
    ]
    assert all(c["function"]["name"] == "run_command" for c in got.get("tool_calls") or [])
