"""The scripted engine (a test double, named as such): replays fixed assistant turns.

It drives real harnesses (mini-swe-agent, Claude Code) through a fixed
sequence of tool calls without a trained model. Everything except the choice
of tokens is real: the turn is rendered in the Qwen ``<tool_call>{json}</tool_call>``
format, tokenized by the served model's REAL tokenizer, ended by the
tokenizer's EOS (``<|im_end|>``), and streamed in chunks, so the proxy's
parser, recorder and streaming paths run exactly as with a model.

Log-probs are "plausible", not meaningful: a deterministic function of
(script, turn, position) in [-1.5, -0.02]. Turn choice and selection rules are
in :mod:`gyre.engine.script`. Resuming works: if the input already ends with
a prefix of the turn (the proxy re-issued prompt + partial output after a
drain), the engine continues from there.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from gyre.engine.base import Engine, EngineInputError, RequestState
from gyre.engine.config import ScriptedEngineConfig
from gyre.engine.protocol import FinishReason, GenerateRequest, ModelInfo
from gyre.engine.script import ScriptBook


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
            await self._unpaused.wait()
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
