"""Scripts for the scripted engine: fixed assistant turns, as plain dataclasses.

A :class:`ScriptBook` holds named :class:`Script` s; a script is a list of
:class:`ScriptedTurn` s (text, optional reasoning, tool calls). JSON form::

    {"scripts": [
      {"name": "fix-bug", "match": "Fix the bug in app.py",
       "turns": [
         {"text": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "cat app.py"}}]},
         {"tool_calls": [{"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]}
       ],
       "exhausted": {"text": "Done."}}
    ]}

A bare list of turns (``[{"text": ...}, ...]``) is also accepted: one script named
``default`` that matches everything.

Which script: ``sampling_params["script"]`` (a name) if given, else the first
script whose ``match`` substring occurs in the decoded prompt, else the first
script without ``match``. Which turn: the number of assistant turns already in
the prompt (``<|im_start|>assistant`` headers before the generation prompt),
so every conversation of every execution walks its script the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ScriptedToolCall:
    name: str
    arguments: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> ScriptedToolCall:
        if "function" in d:  # accept OpenAI's {"function": {"name", "arguments"}} shape too
            d = d["function"]
        args = d.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        return cls(name=str(d["name"]), arguments=dict(args))


@dataclass
class ScriptedTurn:
    text: str = ""
    tool_calls: list[ScriptedToolCall] = field(default_factory=list)
    reasoning: str | None = None

    @classmethod
    def from_json(cls, d: dict | str) -> ScriptedTurn:
        if isinstance(d, str):
            return cls(text=d)
        return cls(
            text=str(d.get("text", "")),
            tool_calls=[ScriptedToolCall.from_json(t) for t in d.get("tool_calls", [])],
            reasoning=d.get("reasoning"),
        )

    def render(self) -> str:
        """The assistant message body exactly as the Qwen chat template writes it
        (without the ``<|im_start|>assistant\\n`` header and the closing ``<|im_end|>``)."""
        out = ""
        if self.reasoning is not None:
            out += "<think>\n" + self.reasoning + "\n</think>\n\n"
        out += self.text
        for i, tc in enumerate(self.tool_calls):
            if i > 0 or self.text:
                out += "\n"
            out += (
                '<tool_call>\n{"name": "'
                + tc.name
                + '", "arguments": '
                + json.dumps(tc.arguments, ensure_ascii=False)
                + "}\n</tool_call>"
            )
        return out


@dataclass
class Script:
    name: str
    turns: list[ScriptedTurn]
    match: str | None = None
    exhausted: ScriptedTurn | None = None

    @classmethod
    def from_json(cls, d: dict) -> Script:
        return cls(
            name=str(d.get("name", "default")),
            turns=[ScriptedTurn.from_json(t) for t in d.get("turns", [])],
            match=d.get("match"),
            exhausted=ScriptedTurn.from_json(d["exhausted"])
            if d.get("exhausted") is not None
            else None,
        )

    def turn(self, index: int) -> ScriptedTurn:
        if index < len(self.turns):
            return self.turns[index]
        if self.exhausted is not None:
            return self.exhausted
        return ScriptedTurn(text=f"[scripted engine: script {self.name!r} has no turn {index}]")


@dataclass
class ScriptBook:
    scripts: list[Script]

    @classmethod
    def from_json(cls, src: str | Path | dict | list) -> ScriptBook:
        """From a JSON file path, a JSON string, or already-parsed JSON."""
        data: Any = src
        if isinstance(src, Path) or (
            isinstance(src, str) and not src.lstrip().startswith(("{", "["))
        ):
            data = json.loads(Path(src).read_text(encoding="utf-8"))
        elif isinstance(src, str):
            data = json.loads(src)
        if isinstance(data, list):
            data = {"scripts": [{"name": "default", "turns": data}]}
        scripts = [Script.from_json(s) for s in data.get("scripts", [])]
        if not scripts:
            raise ValueError("a script book needs at least one script")
        return cls(scripts)

    @classmethod
    def single(cls, turns: list[ScriptedTurn], name: str = "default") -> ScriptBook:
        return cls([Script(name=name, turns=list(turns))])

    def select(self, prompt_text: str, key: str | None = None) -> Script | None:
        if key is not None:
            return next((s for s in self.scripts if s.name == key), None)
        for s in self.scripts:
            if s.match is not None and s.match in prompt_text:
                return s
        return next((s for s in self.scripts if s.match is None), None)
