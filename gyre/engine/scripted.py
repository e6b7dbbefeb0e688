"""The scripted engine (a test double, named as such): replays fixed assistant turns.

It drives real harnesses (mini-swe-agent, Claude Code) through a fixed
sequence of tool calls without a trained model. Everything except the choice
of tokens is real: the turn is rendered in the Qwen ``<tool_call>{json}</tool_call>``
format, tokenized by the served model's REAL tokenizer, ended by the
tokenizer's EOS (``<|im_end|>``), and streamed in chunks, so the proxy's
parser, recorder and streaming paths run exactly as with a model.

Log-probs are "plausible", not meaningful: a deterministic function of
(script, turn, position) in [-1.5, -0.02]. Resuming works: if the input
already ends with a prefix of the turn (the proxy re-issued prompt + partial
output after a drain), the engine continues from there.

The scripts are plain dataclasses (kept with the engine that replays them): a
:class:`ScriptBook` holds named :class:`Script` s; a script is a list of
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

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.engine.base import Engine, EngineInputError, RequestState
from gyre.engine.config import ScriptedEngineConfig
from gyre.engine.protocol import FinishReason, GenerateRequest, ModelInfo


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


def plausible_logprob(script: str, turn: int, pos: int) -> float:
    """Deterministic stand-in log-prob in [-1.5, -0.02], mostly near 0 like a confident model."""
    h = hashlib.sha1(f"{script}:{turn}:{pos}".encode()).digest()
    u = int.from_bytes(h[:4], "big") / 2**32
    return -(0.02 + 1.48 * u**3)


class ScriptedEngine(Engine):
    kind = "scripted"

    def __init__(self, config: ScriptedEngineConfig, book: ScriptBook):
        super().__init__(config.engine_id)
        from transformers import AutoTokenizer

        self.config = config
        self.book = book
        if not Path(config.tokenizer_dir).is_dir():  # never a hub id: nothing is downloaded
            raise FileNotFoundError(f"tokenizer directory {config.tokenizer_dir!r} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_dir, local_files_only=True)
        self.eos_id: int = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)
        self._header = self.tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self._newline = self.tokenizer.encode("\n", add_special_tokens=False)
        self._tasks: set[asyncio.Task] = set()
        self._turn_cache: dict[tuple[str, int], list[int]] = {}

    # -- planning -------------------------------------------------------------------------------
    def _header_positions(self, ids: list[int]) -> list[int]:
        h, n = self._header, len(self._header)
        return [i for i in range(len(ids) - n + 1) if ids[i] == h[0] and ids[i : i + n] == h]

    def turn_ids(self, script_name: str, turn_index: int) -> list[int]:
        key = (script_name, turn_index)
        if key not in self._turn_cache:
            script = next(s for s in self.book.scripts if s.name == script_name)
            text = script.turn(turn_index).render()
            self._turn_cache[key] = self.tokenizer.encode(text, add_special_tokens=False) + [
                self.eos_id
            ]
        return self._turn_cache[key]

    def plan(
        self, input_ids: list[int], script_key: str | None = None
    ) -> tuple[str, int, int, list[int]]:
        """(script name, turn index, tokens already present, full turn ids) for a prompt."""
        text = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        assert isinstance(text, str)  # one sequence in, one string out
        script = self.book.select(text, script_key)
        if script is None:
            raise EngineInputError(
                f"scripted engine: no script matches this prompt (key={script_key!r}; scripts: "
                f"{[(s.name, s.match) for s in self.book.scripts]})"
            )
        heads = self._header_positions(input_ids)
        turn = max(len(heads) - 1, 0)
        ids = self.turn_ids(script.name, turn)
        done = 0
        if heads:  # resume: the prompt may already hold a prefix of this turn
            tail = input_ids[heads[-1] + len(self._header) :]
            if tail[: len(self._newline)] == self._newline:
                tail = tail[len(self._newline) :]
            if tail and tail == ids[: len(tail)]:
                done = len(tail)
        return script.name, turn, done, ids

    # -- engine ---------------------------------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        bad = [t for t in req.input_ids if t >= self.vocab_size]
        if bad:
            raise EngineInputError(
                f"input_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        total = len(req.input_ids) + req.sampling_params.max_new_tokens
        if total > self.config.max_context_length:
            raise EngineInputError(
                f"input ({len(req.input_ids)} tokens) + max_new_tokens "
                f"({req.sampling_params.max_new_tokens}) = {total} exceeds the context limit "
                f"{self.config.max_context_length}"
            )
        key = (req.sampling_params.model_extra or {}).get("script")
        self.plan(req.input_ids, key)  # raises if no script matches

    async def _enqueue(self, st: RequestState) -> None:
        task = asyncio.create_task(self._produce(st))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _produce(self, st: RequestState) -> None:
        key = (st.params.model_extra or {}).get("script")
        name, turn, done, ids = self.plan(st.input_ids, key)
        stops = set(st.params.stop_token_ids or [])
        if not st.params.ignore_eos:
            stops.add(self.eos_id)
        n_max = st.params.max_new_tokens
        pos = done
        step = self.config.tokens_per_chunk
        while st.finish is None:
            await self.wait_unpaused()
            if st.finish is not None:
                return
            for _ in range(step):
                if pos >= len(ids):
                    # script turn finished without a stop token (ignore_eos): nothing more to say
                    st.finish_with(FinishReason(type="length", length=len(st.output_ids)))
                    return
                tok = ids[pos]
                st.append(tok, plausible_logprob(name, turn, pos), self.weight_version)
                pos += 1
                if tok in stops:
                    st.finish_with(FinishReason(type="stop", matched=tok))
                    return
                if len(st.output_ids) >= n_max:
                    st.finish_with(FinishReason(type="length", length=n_max))
                    return
            await asyncio.sleep(self.config.token_delay_s)

    async def stop(self) -> None:
        await super().stop()
        for t in list(self._tasks):
            t.cancel()

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_path=f"scripted:{self.config.tokenizer_dir}",
            tokenizer_path=self.config.tokenizer_dir,
            weight_version=self.weight_version,
            engine_kind=self.kind,
            engine_id=self.engine_id,
            max_context_length=self.config.max_context_length,
            vocab_size=self.vocab_size,
            eos_token_ids=[self.eos_id],
            paused=self.paused,
        )
