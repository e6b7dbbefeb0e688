"""A tiny Qwen3-family model and a byte-level BPE tokenizer, built offline.

Nothing in Gyre downloads weights. Tests, the quickstart and benchmarks build a
~1M-parameter model from a config and train a tokenizer on text that ships with
Python itself, then save both as an ordinary Hugging Face directory. Everything
downstream loads that directory through the same code path as a real model
(``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``), so the loading
code is the real one.

The chat template is Qwen-style (ChatML with ``<tool_call>`` JSON for tools) so
the proxy's rendering and tool-call parsing are exercised as with Qwen models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

# Written with explicit '...\n' strings: literal newlines inside {%- %} blocks are
# eaten by whitespace control.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tc.name + \'", "arguments": \' }}'
    "{%- if tc.arguments is string %}{{- tc.arguments }}{%- else %}{{- tc.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS_MODULES = [
    "json/__init__.py",
    "json/decoder.py",
    "textwrap.py",
    "argparse.py",
    "shutil.py",
    "subprocess.py",
]

_EXTRA_TEXT = """\
You are a helpful assistant. Run the tests, read the failing file, fix the bug and submit.
The quick brown fox jumps over the lazy dog. def main(): return 0
{"name": "bash", "arguments": {"command": "ls -la && cat README.md"}}
{"name": "read_file", "arguments": {"path": "src/app.py"}}
{"name": "write_file", "arguments": {"path": "src/app.py", "content": "print('hi')"}}
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
"""


def _corpus() -> list[str]:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [_EXTRA_TEXT] * 20
    for rel in _CORPUS_MODULES:
        p = stdlib / rel
        if p.exists():
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
    return texts


def build_tokenizer(vocab_size: int = 2048):
    """Train a byte-level BPE on local text and wrap it as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config_kwargs(
    vocab_size: int, layers: int = 2, hidden: int = 128, head_dim: int | None = None
) -> dict:
    """``head_dim`` defaults to ``hidden // 4`` (4 heads); set it apart from ``hidden`` for engines
    whose attention kernels only take some sizes (vLLM's CPU backend: 32, 64, 80, 96, 112, 128...;
    16 crashes it at the first request)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim or hidden // 4,
        tie_word_embeddings=True,
        max_position_embeddings=65536,
        rope_theta=10000.0,
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    layers: int = 2,
    hidden: int = 128,
    head_dim: int | None = None,
) -> Path:
    """Write a tiny Qwen3 model + tokenizer to ``out_dir`` and return it.

    Deterministic for a given (seed, sizes) on one machine; reuses an existing
    directory built with the same arguments.
    """
    out = Path(out_dir)
    spec = {"seed": seed, "vocab_size": vocab_size, "layers": layers, "hidden": hidden, "v": 1}
    if head_dim is not None and head_dim != hidden // 4:  # default sizes keep their old stamp
        spec["head_dim"] = head_dim
    stamp = out / "gyre_tiny.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return out
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    tok.save_pretrained(out)
    cfg = Qwen3Config(
        **tiny_config_kwargs(len(tok), layers, hidden, head_dim),
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(out)
    stamp.write_text(json.dumps(spec))
    return out


def spec_digest(**kw) -> str:
    return hashlib.sha1(json.dumps(kw, sort_keys=True).encode()).hexdigest()[:12]
