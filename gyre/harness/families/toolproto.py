"""The tool protocol of the tool-use families: a fenced bash block, one worked exchange.

SmolLM2-135M-Instruct, sampled at temperature 1, never called a tool written as
``<tool_call>{json}</tool_call>`` (0 of 16), but wrote a bash block that computes the answer
in 9 of 16 replies when the prompt showed one worked exchange in that form, and copied a
tool's result as ``Answer: N`` in 15 of 16 (ENVIRONMENT.md). So the model speaks in bash
blocks, and the pieces around it translate:

- the proxy's ``bash`` output parser (``[proxy] parser = "bash"``) turns each
  ````` ```bash ... ``` ````` block of a reply into an OpenAI ``run_command`` tool call
  (``{"command": ...}``), so Gyre's reference agent runs it unmodified, through the same
  tool-call format as with any model. The trace stays token-exact: the proxy keeps each
  call's output ids verbatim and renders only the new messages after them;
- :data:`CHAT_TEMPLATE` is the shared tool-call chat template: SmolLM2's own ChatML, plus an
  assistant turn's tool calls rendered back as the same fenced block (so a full re-render
  of a reply that was one block gives the same text, the round trip the tests check), a
  tool's result rendered as the next user turn, which is where the model copies it from,
  and, when the request offers tools, one worked exchange (:data:`EXAMPLE`) as chat turns
  after the system turn;
- :data:`RESPONSE_TEMPLATE` is the parser for a peer that uses transformers' response
  parsing (TRL): a block is the same ``run_command`` call the proxy makes of it;
- :data:`SYSTEM` is the system prompt: the protocol in two sentences. A peer trainer renders
  the same system prompt, tools and template; mini-swe-agent's config
  (``gyre/harness/mini_tools.yaml``) says the same in its own action format.

The template ignores the request's ``tools``: the system prompt describes the one tool.
:func:`install_template` writes a model directory that is the imported model with this
template (the weights linked, not copied), which is what ``model_dir`` of
``examples/smollm2-agent.toml`` points at.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .base import TOOL_NAME

SYSTEM = (
    "You are a helpful assistant with a bash shell. To run a command, write it in a bash "
    "block; you then see its output. When you know the answer, reply with a last line of the "
    "form 'Answer: <number>'."
)
# The exchange's command. `bc` because the model imitates it: 32 held-out calc problems at
# temperature 1, one exchange as turns: 3 of 32 replies ran a block that printed the right
# value with `echo "123 * 45" | bc`, 0 of 16 with `echo $((123 * 45))` (and 0 of 64 through
# the whole stack; docs/real-model.md).
COMMAND = 'echo "123 * 45" | bc'
# The worked exchange, as chat turns: SmolLM2 imitates turns far more than the same exchange
# written out in a system prompt (16 held-out calc problems, temperature 1: 4 replies with a
# closed bash block against 0; docs/real-model.md).
EXAMPLE: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "What is 123 * 45? End your reply with a line of the form 'Answer: <number>'.",
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": {"command": COMMAND}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_example", "content": "exit status 0\n5535\n"},
    {"role": "assistant", "content": "Answer: 5535"},
]
_EXAMPLE_TEXT = (
    "<|im_start|>user\n" + EXAMPLE[0]["content"] + "<|im_end|>\n"
    "<|im_start|>assistant\n```bash\n" + COMMAND + "\n```<|im_end|>\n"
    "<|im_start|>user\nexit status 0\n5535\n<|im_end|>\n"
    "<|im_start|>assistant\nAnswer: 5535<|im_end|>\n"
)

# Written with explicit '\n' strings: literal newlines inside {%- %} blocks are eaten by
# whitespace control. The default system line is SmolLM2's own. The {% generation %}
# markers (ignored when rendering) mark the assistant's tokens, as TRL's training templates
# do; a call of another tool than the shell renders as a block named after it, so the name
# survives rendering (TRL checks that it does). When the request offers
# tools, the worked exchange follows the system turn (as Qwen's template writes its tool
# section only then): the reference agent offers its tools, so it gets the exchange; a
# text-based harness (mini-swe-agent) offers none and brings its own prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}"
    "{%- if tools %}{{- EXAMPLE }}{%- endif %}"
    "{%- endif %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tc.name == 'run_command' and tc.arguments is mapping and tc.arguments.command is defined %}"
    "{{- '```bash\\n' + tc.arguments.command + '\\n```' }}"
    "{%- elif tc.arguments is string %}{{- '```bash\\n' + tc.arguments + '\\n```' }}"
    "{%- else %}{{- '```' + tc.name + '\\n' + (tc.arguments | tojson) + '\\n```' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- if loop.first and message.role == 'system' and tools %}{{- EXAMPLE }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
).replace("EXAMPLE", "'" + _EXAMPLE_TEXT.replace("\n", "\\n").replace("'", "\\'") + "'")


# The same protocol for transformers' response parsing (``tokenizer.response_template``,
# transformers >= 5.13; TRL 1.16's GRPOTrainer parses tool calls with it when it is set, and
# knows no template of its own for ours): each fenced block is a run_command call, the text
# before the first block the content, as the proxy's ``bash`` parser reads it.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\n?```(?:bash|sh)\n",
            "close_pattern": r"\n?```\s*",
            "repeats": True,
            "content": "text",
            "transform": {
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": {"command": "{content}"}},
            },
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def install_template(model_dir: str | Path, out_dir: str | Path) -> Path:
    """``out_dir``: ``model_dir``'s files linked (weights are not copied), its chat template
    replaced by :data:`CHAT_TEMPLATE`. Idempotent; returns ``out_dir``."""
    src, out = Path(model_dir).resolve(), Path(out_dir)
    if not (src / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a model directory (no config.json)")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "chat_template.jinja" or not f.is_file():
            continue
        link = out / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(f, link)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return out


if __name__ == "__main__":  # python -m gyre.harness.families.toolproto MODEL_DIR OUT_DIR
    import sys

    if len(sys.argv) != 3:
        print("usage: python -m gyre.harness.families.toolproto MODEL_DIR OUT_DIR", file=sys.stderr)
        sys.exit(2)
    try:
        print(install_template(sys.argv[1], sys.argv[2]))
    except (ValueError, OSError) as e:
        print(f"toolproto: {e}", file=sys.stderr)
        sys.exit(1)
