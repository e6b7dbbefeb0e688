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
  of a reply that was one block gives the same text, the round trip the tests check) and a
  tool's result rendered as the next user turn, which is where the model copies it from;
- :data:`SYSTEM` is the prompt: the protocol in two sentences and one worked exchange.
  mini-swe-agent's config (``gyre/harness/mini_tools.yaml``) and a peer trainer use the
  same text.

The template ignores the request's ``tools``: the system prompt describes the one tool.
:func:`install_template` writes a model directory that is the imported model with this
template (the weights linked, not copied), which is what ``model_dir`` of
``examples/smollm2-agent.toml`` points at.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM = (
    "You are a helpful assistant with a bash shell. To run a command, write it in a bash "
    "block; you then see its output. When you know the answer, reply with a last line of the "
    "form 'Answer: <number>'. Use cat to read a file and grep -r to search files.\n"
    "\n"
    "Example.\n"
    "User: What is 123 * 45? End your reply with a line of the form 'Answer: <number>'.\n"
    "Assistant:\n"
    "```bash\n"
    "echo $((123 * 45))\n"
    "```\n"
    "User: exit status 0\n"
    "5535\n"
    "Assistant: Answer: 5535"
)
TOOL_NAME = "run_command"  # the reference agent's shell tool; its argument is "command"

# Written with explicit '\n' strings: literal newlines inside {%- %} blocks are eaten by
# whitespace control. The default system line is SmolLM2's own.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tc.arguments is mapping and tc.arguments.command is defined %}"
    "{{- '```bash\\n' + tc.arguments.command + '\\n```' }}"
    "{%- elif tc.arguments is string %}{{- '```bash\\n' + tc.arguments + '\\n```' }}"
    "{%- else %}{{- '```bash\\n' + (tc.arguments | tojson) + '\\n```' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


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
