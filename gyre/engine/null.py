"""The null engine: fixed tokens at once, no model. For overhead benchmarks.

It measures everything around generation (proxy, HTTP, recording, routing)
with generation itself costing ~0. Its tokens mean nothing; its log-probs are
a constant. Abort and pause work (with ``token_delay_s > 0`` a request is
in flight long enough to abort or pause it).
"""

from __future__ import annotations

import asyncio

from gyre.engine.base import Engine, EngineInputError, RequestState
from gyre.engine.config import NullEngineConfig
from gyre.engine.protocol import FinishReason, GenerateRequest, ModelInfo


class NullEngine(Engine):
    kind = "null"

    def __init__(self, config: NullEngineConfig | None = None, **overrides):
        self.config = (config or NullEngineConfig()).model_copy(update=overrides)
        super().__init__(self.config.engine_id)
        self._tasks: set[asyncio.Task] = set()

    def validate(self, req: GenerateRequest) -> None:
        c = self.config
        bad = [t for t in req.input_ids if t >= c.vocab_size]
        if bad:
            raise EngineInputError(
                f"input_ids contains ids outside the vocabulary [0, {c.vocab_size}): {bad[:5]}"
            )
        total = len(req.input_ids) + req.sampling_params.max_new_tokens
        if total > c.max_context_length:
            raise EngineInputError(
                f"input ({len(req.input_ids)} tokens) + max_new_tokens "
                f"({req.sampling_params.max_new_tokens}) = {total} exceeds the context limit "
                f"{c.max_context_length}"
            )

    async def _enqueue(self, st: RequestState) -> None:
        if self.config.token_delay_s == 0 and not self.paused:
            self._produce_all(st)
            return
        task = asyncio.create_task(self._produce_slowly(st))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _plan(self, st: RequestState) -> tuple[list[int], FinishReason]:
        c = self.config
        n_max = st.params.max_new_tokens
        ids = [c.token_ids[i % len(c.token_ids)] for i in range(c.num_tokens)]
        if c.eos_token_id is not None and not st.params.ignore_eos:
            ids.append(c.eos_token_id)
        if len(ids) > n_max:
            return ids[:n_max], FinishReason(type="length", length=n_max)
        if c.eos_token_id is not None and not st.params.ignore_eos:
            return ids, FinishReason(type="stop", matched=c.eos_token_id)
        return ids, FinishReason(type="length", length=len(ids))

    def _produce_all(self, st: RequestState) -> None:
        ids, reason = self._plan(st)
        for t in ids:
            st.append(t, self.config.logprob, self.weight_version)
        st.finish_with(reason)

    async def _produce_slowly(self, st: RequestState) -> None:
        ids, reason = self._plan(st)
        for t in ids:
            await self.wait_unpaused()
            if st.finish is not None:
                return
            st.append(t, self.config.logprob, self.weight_version)
            await asyncio.sleep(self.config.token_delay_s)
        st.finish_with(reason)

    async def stop(self) -> None:
        await super().stop()
        for t in list(self._tasks):
            t.cancel()

    def model_info(self) -> ModelInfo:
        c = self.config
        return ModelInfo(
            model_path="null",
            is_generation=True,
            weight_version=self.weight_version,
            engine_kind=self.kind,
            engine_id=self.engine_id,
            max_context_length=c.max_context_length,
            vocab_size=c.vocab_size,
            eos_token_ids=[c.eos_token_id] if c.eos_token_id is not None else [],
            paused=self.paused,
        )
