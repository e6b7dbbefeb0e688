"""Continuation rendering: the suffix derived from the template equals a full re-render's tail."""

import json

import pytest

from gyre.proxy.render import Renderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _call(i, cmd):
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": cmd})},
    }


CASES = {
    "tools+system, tool results": (
        [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the bug."},
        ],
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [_call(0, "ls"), _call(1, "cat a.py")],
        },
        [
            {"role": "tool", "tool_call_id": "call_0", "content": "a.py\nb.py"},
            {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
        ],
        TOOLS,
    ),
    "no system, user follow-up": (
        [{"role": "user", "content": "hi"}],
        {"role": "assistant", "content": "Hello!"},
        [{"role": "user", "content": "and now?"}],
        None,
    ),
    "system message mid-conversation (Claude Code)": (
        [
            {"role": "system", "content": "S"},
            {"role": "system", "content": "reminder"},
            {"role": "user", "content": "go"},
        ],
        {"role": "assistant", "content": "", "tool_calls": [_call(2, "pwd")]},
        [
            {"role": "tool", "tool_call_id": "call_2", "content": "/w"},
            {"role": "user", "content": "continue"},
            {"role": "system", "content": "late system note"},
        ],
        TOOLS,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_continuation_equals_full_render(tiny_tokenizer, name):
    before, assistant, new, tools = CASES[name]
    r = Renderer(tiny_tokenizer)
    prompt = r.full(before, tools)
    # what the model generated for `assistant`: the template's body of that turn, then EOS
    with_turn = r.text(before + [assistant], tools)
    gen_prompt = r.text(before, tools, add_generation_prompt=True)
    body = with_turn[len(gen_prompt) : -len(r.closing.text)]
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
    suffix = r.continuation(
        [], {"role": "assistant", "content": "abc"}, [{"role": "user", "content": "x"}], None, 5
    )
    assert (
        tiny_tokenizer.decode(suffix, skip_special_tokens=False)
        == "<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_without_chat_template_is_refused(tiny_tokenizer):
    import copy

    t = copy.copy(tiny_tokenizer)
    t.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        Renderer(t)


# A Qwen3-style template: refuses a conversation without a user query, shows reasoning only after the
# last query, and writes tool arguments with tojson (so argument dicts, not strings, reach it).
QWEN3_LIKE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- if ns.last_query < 0 %}{{- raise_exception('No user query found in messages.') }}{%- endif %}"
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'user' or m.role == 'system' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content and loop.index0 > ns.last_query %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + (tc.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_continuation_with_a_template_that_needs_a_user_query(tiny_tokenizer):
    import copy

    tok = copy.copy(tiny_tokenizer)
    tok.chat_template = QWEN3_LIKE
    r = Renderer(tok)
    before = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    assistant = {"role": "assistant", "content": "", "tool_calls": [_call(7, "ls")]}
    new = [{"role": "tool", "tool_call_id": "call_7", "content": "a.py"}]
    prompt = r.full(before, TOOLS)
    body = r.text(before + [assistant], TOOLS)[
        len(r.text(before, TOOLS, add_generation_prompt=True)) : -len(r.closing.text)
    ]
    output = r.encode(body) + [tok.eos_token_id]
    # the anchor (system + assistant) has no user query: the template raises, the renderer adds a neutral one
    suffix = r.continuation(before[:1], assistant, new, TOOLS, output[-1])
    assert suffix is not None
    # (this template opens the turn with "\n<tool_call>", which BPE merges with the header's "\n" in a
    # one-piece tokenization, so compare text and the suffix's own tokens)
    full_text = r.text(before + [assistant] + new, TOOLS, add_generation_prompt=True)
    assert tok.decode(prompt + output + suffix, skip_special_tokens=False) == full_text
    assert r.full(before + [assistant] + new, TOOLS)[-len(suffix) :] == suffix
