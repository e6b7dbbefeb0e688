"""Messages -> token ids with the model's own Hugging Face chat template.

Two ways to get a request's input ids:

* :meth:`Renderer.full` renders the whole conversation and tokenizes it (first
  call of a conversation, or a harness that rewrote history).
* :meth:`Renderer.continuation` is the token-exact bridge. The earlier call's
  input+output ids are kept verbatim; only the text the template puts *after*
  that assistant turn is rendered and tokenized. That text is derived from the
  template itself, never hand-written: render a short *anchor* conversation
  (the leading system messages and the assistant turn being extended) with and
  without the new messages, check the first is a prefix of the second, and take
  the difference. The template's closing text after an assistant turn (e.g.
  ``<|im_end|>\\n``) is found once with a sentinel turn; the part of it the
  model already generated (its stop token) is not repeated. The anchor does
  not grow with the conversation, so the cost per call does not either.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from gyre.proxy.timebound import RenderTimedOut, within
from gyre.proxy.types import Message

_SENTINEL = "GYRE_SENTINEL_7f3a"


class RenderError(Exception):
    """The chat template refused the conversation (e.g. raise_exception in the template), or
    took longer than the renderer's time limit."""


class TemplateRejected(ValueError):
    """The model's chat template fails, or passes the time limit, on the proxy's start-up
    renders (a plain one-turn conversation): it cannot serve any request."""


TIME_LIMIT_S = 10.0
"""Default bound on one render (ProxyConfig.template_time_limit_s): a 500K-token conversation
renders in well under a second."""


@dataclass
class Closing:
    text: str  # what the template writes after an assistant turn's content, e.g. "<|im_end|>\n"


def _for_template(messages: list[Message], args_as_dict: bool) -> list[Message]:
    """Tool-call arguments as dicts for templates that ``tojson`` them (Qwen2.5-style).

    Messages keep arguments as the original JSON text (for matching); only the
    copy handed to the template is changed, and only for the few messages rendered.
    """
    if not args_as_dict:
        return messages
    out = []
    for m in messages:
        tcs = m.get("tool_calls")
        if tcs:
            m = dict(m)
            new = []
            for tc in tcs:
                args = tc["function"]["arguments"]
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    tc = {**tc, "function": {**tc["function"], "arguments": parsed}}
                new.append(tc)
            m["tool_calls"] = new
        out.append(m)
    return out


class Renderer:
    def __init__(
        self,
        tokenizer: Any,
        *,
        stop_token_ids: list[int] | None = None,
        args_as_dict: bool = True,
        time_limit_s: float | None = TIME_LIMIT_S,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template; the proxy renders with the model's own template"
            )
        self.tok = tokenizer
        self.args_as_dict = args_as_dict
        self.time_limit_s = time_limit_s
        eos = tokenizer.eos_token_id
        ids = set(stop_token_ids or [])
        if eos is not None:
            ids.add(int(eos))
        self.stop_token_ids = sorted(ids)
        try:
            self.closing = self._find_closing()
            gen = self.text([{"role": "user", "content": "x"}], add_generation_prompt=True)
        except RenderError as e:
            raise TemplateRejected(str(e)) from None
        self.generation_opens_reasoning = gen.rstrip().endswith("<think>")

    # -- primitives -------------------------------------------------------------------------
    def text(
        self,
        messages: list[Message],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        msgs = _for_template(messages, self.args_as_dict)
        try:
            return within(
                self.time_limit_s,
                lambda: self.tok.apply_chat_template(
                    msgs, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
                ),
            )
        except RenderTimedOut:
            raise RenderError(
                f"chat template took longer than {self.time_limit_s:g} s to render; the limit is "
                "proxy.template_time_limit_s"
            ) from None
        except (
            Exception
        ) as e:  # jinja TemplateError, raise_exception(), type errors in the template
            raise RenderError(f"chat template failed: {type(e).__name__}: {e}") from e

    def text_for_probe(self, messages: list[Message], tools: list[dict] | None) -> str:
        """What :func:`gyre.proxy.rendered.probe` renders with: a prompt as sent to the model."""
        return self.text(messages, tools, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        # Chat-template output carries its own special tokens: never add BOS/EOS again.
        return self.tok.encode(text, add_special_tokens=False)

    def _find_closing(self) -> Closing:
        head = [{"role": "user", "content": "x"}]
        with_gen = self.text(head, add_generation_prompt=True)
        done = self.text(head + [{"role": "assistant", "content": _SENTINEL}])
        if not done.startswith(with_gen) or _SENTINEL not in done[len(with_gen) :]:
            raise TemplateRejected(
                "cannot derive the assistant turn's closing text from this chat template"
            )
        tail = done[len(with_gen) :]
        return Closing(tail[tail.index(_SENTINEL) + len(_SENTINEL) :])

    # -- the two ways -----------------------------------------------------------------------
    def full(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.text(messages, tools, add_generation_prompt=True))

    def closing_rest(self, last_output_id: int | None) -> str:
        """Closing text still to add after an output whose last token is ``last_output_id``."""
        closing = self.closing.text
        if last_output_id is not None and last_output_id in self.stop_token_ids:
            stop_text = self.tok.decode([last_output_id], skip_special_tokens=False)
            if stop_text and closing.startswith(stop_text):
                return closing[len(stop_text) :]
        return closing

    def continuation(
        self,
        head: list[Message],
        assistant: Message,
        new: list[Message],
        tools: list[dict] | None,
        last_output_id: int | None,
    ) -> list[int] | None:
        """Ids to append after an earlier call's input+output, or None when the template
        does not render the anchor conversation as a prefix (caller falls back to a full render)."""
        anchors = [head + [assistant]]
        if not any(m.get("role") == "user" for m in head):
            # templates that insist on a user query (raise without one) get a neutral one
            anchors.append(head + [{"role": "user", "content": "."}, assistant])
        for anchor in anchors:
            try:
                a = self.text(anchor, tools)
                b = self.text(anchor + new, tools, add_generation_prompt=True)
            except RenderError:
                continue
            if b.startswith(a) and a.endswith(self.closing.text):
                return self.encode(self.closing_rest(last_output_id) + b[len(a) :])
        return None


def copy_messages(messages: list[Message]) -> list[Message]:
    return copy.deepcopy(messages)
