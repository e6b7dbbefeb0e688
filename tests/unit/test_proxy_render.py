"""Continuation rendering: the suffix derived from the template equals a full re-render's tail."""

import json

import pytest

from gyre.proxy.render import Renderer

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def _call(i, cmd):
    return {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}


CASES = {
    "tools+system, tool results": (
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}],
        {"role": "assistant", "content": "Let me look.", "tool_calls": [_call(0, "ls"), _call(1, "cat a.py")]},
        [{"role": "tool", "tool_call_id": "call_0", "content": "a.py\nb.py"},
         {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"}],
        TOOLS),
    "no system, user follow-up": (
        [{"role": "user", "content": "hi"}],
        {"role": "assistant", "content": "Hello!"},
        [{"role": "user", "content": "and now?"}],
        None),
    "system message mid-conversation (Claude Code)": (
        [{"role": "system", "content": "S"}, {"role": "system", "content": "reminder"}, {"role": "user", "content": "go"}],
        {"role": "assistant", "content": "", "tool_calls": [_call(2, "pwd")]},
        [{"role": "tool", "tool_call_id": "call_2", "content": "/w"}, {"role": "user", "content": "continue"},
         {"role": "system", "content": "late system note"}],
        TOOLS),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_continuation_equals_full_render(tiny_tokenizer, name):
    before, assistant, new, tools = CASES[name]
    r = Renderer(tiny_tokenizer)
    prompt = r.full(before, tools)
    # what the model generated for `assistant`: the template's body of that turn, then EOS
    with_turn = r.text(before + [assistant], tools)
    gen_prompt = r.text(before, tools, add_generation_prompt=True)
    body = with_turn[len(gen_prompt):-len(r.closing.text)]
    output = r.encode(body) + [tiny_tokenizer.eos_token_id]
    head = [m for m in before if m["role"] == "system"][:1] if before[0]["role"] == "system" else []
    i = 0
    while i < len(before) and before[i]["role"] == "system":
        i += 1
    head = before[:i]
    suffix = r.continuation(head, assistant, new, tools, output[-1])
    assert suffix is not None
    assert prompt + output + suffix == r.full(before + [assistant] + new, tools)


def test_closing_after_truncated_output(tiny_tokenizer):
    """An output cut by max_tokens has no EOS: the whole closing is added (the model sees its turn end)."""
    r = Renderer(tiny_tokenizer)
    assert r.closing.text == "<|im_end|>\n"
    assert r.closing_rest(tiny_tokenizer.eos_token_id) == "\n"
    assert r.closing_rest(5) == "<|im_end|>\n"
    suffix = r.continuation([], {"role": "assistant", "content": "abc"}, [{"role": "user", "content": "x"}], None, 5)
    assert tiny_tokenizer.decode(suffix, skip_special_tokens=False) == "<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_template_without_chat_template_is_refused(tiny_tokenizer):
    import copy

    t = copy.copy(tiny_tokenizer)
    t.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        Renderer(t)
