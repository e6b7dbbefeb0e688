"""The embedded engine: a Hugging Face causal LM on CPU behind the wire protocol.

Threads and loops: the engine lives in an asyncio loop (the server's). A
scheduler task decides what runs next; every torch call (load, prefill,
decode step, weights reload) runs in ONE dedicated worker thread, so the loop
keeps answering HTTP while the model computes (torch releases the GIL), and
the model, KV cache and RNGs are only ever touched by that one thread, in
order. Each scheduler iteration is one worker job:

    drop aborted rows -> prefill admitted requests (alone, at most
    ``prefill_chunk_tokens`` prompt tokens per job) -> one batched decode step
    for every live row -> events back to the loop

Abort finishes a request at once with its partial output (the worker drops
its row at the next job). Pause (``in_place``) stops submitting jobs: live
requests keep their KV and wait; new ones queue. A weights update is a job
like the others, so it lands between two steps; tokens carry the version
their step ran under (``weight_version_segments``). Nothing is global: two
engines in one process each have their own model, thread and scheduler.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.engine.base import Engine, KVRefused, RequestState
from gyre.engine.batch import DecodeBatch, Row, TokenEvent
from gyre.engine.checksum import layout_name, weights_checksum
from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.precision import compute_autocast, to_compute_dtype
from gyre.engine.prefix_cache import PrefixCache
from gyre.engine.protocol import (
    GenerateRequest,
    GroupResponse,
    InitWeightsUpdateGroupRequest,
    ModelInfo,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsResponse,
)
from gyre.engine.receive import NeedsFullCopy
from gyre.engine.request_checks import check_cache_layout, check_request, eos_ids

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gyre.engine.kv_migrate import KVPacket, KVStore
    from gyre.engine.weight_group import WeightGroup


class EmbeddedEngine(Engine):
    kind = "embedded"

    def __init__(self, config: EmbeddedEngineConfig):
        super().__init__(config.engine_id)
        self.config = config
        self.model: PreTrainedModel | None = None  # loaded by start(), in the worker thread
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.eos_token_ids: list[int] = []
        self.vocab_size = 0
        self.max_context_length = 0
        self._executor: ThreadPoolExecutor | None = None
        self._batch: DecodeBatch | None = None
        self._waiting: deque[RequestState] = deque()
        self._live: dict[str, RequestState] = {}  # rid -> state, for rows in the worker's batch
        self._wake: asyncio.Event | None = None
        self._scheduler: asyncio.Task | None = None
        self._loaded_version = config.weight_version  # written by the worker thread only
        self.weight_version = config.weight_version
        self._rng = random.Random(config.seed)
        self.weights_checksum: float | None = None  # of what the worker loaded (engine.checksum)
        self._groups: dict[str, WeightGroup] = {}  # weight-update groups joined, by name
        self._held: dict[str, int] = {}  # parameter -> version it holds (a delta's base check)
        self.steps = 0  # decode steps run (for tests/benchmarks)
        self.max_rows_seen = 0  # largest batch a decode step ran with
        # KV migration (gyre.engine.kv_migrate): rids to park at the next step boundary, the
        # parked (outgoing) and imported (incoming) entries, and what the worker admits with
        self._parking: set[str] = set()
        self._kv_out: KVStore | None = None
        self._kv_in: KVStore | None = None
        self._admit_kv: dict[str, KVPacket] = {}
        self.kv_counts = {"parked": 0, "exported": 0, "imported": 0, "admitted": 0, "refused": 0}
        self.prefill_tokens = 0  # prompt tokens prefilled, and the seconds it took (the
        self.prefill_s = 0.0  # re-prefill a migration saves is estimated from their ratio)

    # -- lifecycle ------------------------------------------------------------------------------
    def _load(self, path: str) -> PreTrainedModel:
        import torch
        from transformers import AutoModelForCausalLM

        if not Path(path).is_dir():  # never let from_pretrained treat it as a hub id (network)
            raise FileNotFoundError(f"model directory {path!r} does not exist")
        kwargs = {"dtype": getattr(torch, self.config.dtype), "local_files_only": True}
        if self.config.attn_implementation:
            kwargs["attn_implementation"] = self.config.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        # PreTrainedModel.to is @functools.wraps-decorated: mypy loses its bound self
        model = model.to(self.config.device)  # type: ignore[arg-type]
        model.eval()
        return to_compute_dtype(model, self.config.compute_dtype)

    def _start_worker(self) -> None:
        import torch

        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        self.model = self._load(self.config.model_dir)
        self._pack()
        self.weights_checksum = weights_checksum(self.model)
        self._held = dict.fromkeys(self._params(), self._loaded_version)
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(
                self.config.model_dir, local_files_only=True
            )
        except Exception:  # a model directory without tokenizer files still serves token ids
            self.tokenizer = None
        check_cache_layout(self.model)
        self.eos_token_ids = eos_ids(self.model, self.tokenizer)
        emb = self.model.get_input_embeddings().weight
        assert isinstance(emb, torch.Tensor)  # an embedding table: [vocab, hidden]
        self.vocab_size = int(emb.shape[0])
        limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or (1 << 30)
        self.max_context_length = min(limit, self.config.max_context_length or limit)
        self._batch = self._new_batch()

    def _pack(self) -> None:
        """(Re)pack the linear weights for oneDNN (``packed_linears``); after every in-place
        change of the weights, or the model would keep serving the old packed copy."""
        if self.config.packed_linears:
            from gyre.engine.packed import pack_linears

            pack_linears(self._loaded_model())

    def _loaded_model(self) -> PreTrainedModel:
        assert self.model is not None, "engine not started (no model loaded)"
        return self.model

    def _live_batch(self) -> DecodeBatch:
        assert self._batch is not None, "engine not started (no decode batch)"
        return self._batch

    def _kick(self) -> None:
        """Wake the scheduler (it sleeps while idle or paused)."""
        assert self._wake is not None, "engine not started"
        self._wake.set()

    def _new_batch(self) -> DecodeBatch:
        pc = None
        if self.config.prefix_cache_mb > 0:
            pc = PrefixCache(
                int(self.config.prefix_cache_mb * 2**20), self.config.prefix_cache_min_tokens
            )
        batch = DecodeBatch(self._loaded_model(), prefix_cache=pc)
        batch.version = self._loaded_version
        return batch

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"gyre-{self.engine_id}"
        )
        try:
            await self._run(
                self._start_worker
            )  # load first: requests are refused until the model is there
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
        await super().start()
        if self.config.kv_migration_mb > 0:
            from gyre.engine.kv_migrate import KVStore

            budget = int(self.config.kv_migration_mb * 2**20)
            self._kv_out, self._kv_in = KVStore(budget), KVStore(budget)
        self._wake = asyncio.Event()
        self._scheduler = asyncio.create_task(self._schedule(), name=f"{self.engine_id}-scheduler")

    async def stop(self) -> None:
        await super().stop()  # aborts everything live
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except (asyncio.CancelledError, Exception):
                pass
            self._scheduler = None
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, True)  # waits for a running job
            self._executor = None
        for group in self._groups.values():
            group.close()
        self._groups.clear()
        self._batch = None
        self.model = None
        self._live.clear()
        self._waiting.clear()

    def healthy(self) -> bool:
        return super().healthy() and self._scheduler is not None and not self._scheduler.done()

    async def _run(self, fn, *args):
        dev, compute = self.config.device, self.config.compute_dtype

        def job():
            import torch

            with torch.inference_mode(), compute_autocast(dev, compute):
                return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    # -- requests -------------------------------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        check_request(req, self.vocab_size, self.max_context_length)

    async def _enqueue(self, st: RequestState) -> None:
        self._waiting.append(st)
        self._kick()

    def _on_abort(self, st: RequestState) -> None:
        super()._on_abort(
            st
        )  # finish now with the partial output; the worker drops the row next job
        if self._wake is not None:
            self._wake.set()

    async def pause(self, mode="in_place") -> None:
        await super().pause(mode)
        self._kick()

    async def resume(self) -> None:
        await super().resume()
        self._kick()

    # -- scheduling -----------------------------------------------------------------------------
    def _make_row(self, st: RequestState):
        from gyre.engine.sampling import make_generator

        p = st.params
        stops = set(p.stop_token_ids or [])
        if not p.ignore_eos:
            stops.update(self.eos_token_ids)
        seed = p.seed if p.seed is not None else self._rng.getrandbits(63)
        gen = None if p.greedy else make_generator(seed)
        row = Row(rid=st.rid, params=p, stops=frozenset(stops), generator=gen)
        imported = self._kv_in.pop(st.rid) if self._kv_in is not None else None
        if imported is not None:  # a migrated request: the worker admits it with its K/V
            from gyre.engine.kv_migrate import restore_generator

            restore_generator(row, imported)
            self._admit_kv[st.rid] = imported
        return row

    def _worker_job(
        self, drop: set[str], admit: list[tuple[Row, list[int]]]
    ) -> tuple[int, list[TokenEvent], list[str]]:
        """Runs in the worker thread: drop rows, prefill admissions, one batched decode step."""
        batch = self._live_batch()
        batch.remove(drop)
        events: list[TokenEvent] = []
        for row, ids in admit:
            self._admit(batch, row, ids)
        t0, todo = time.perf_counter(), _prefill_todo(batch)
        events.extend(batch.prefill_some(self.config.prefill_chunk_tokens))
        self.prefill_tokens += todo - _prefill_todo(batch)
        self.prefill_s += time.perf_counter() - t0
        if len(batch):
            self.max_rows_seen = max(self.max_rows_seen, len(batch))
            self.steps += 1
            events.extend(batch.step())
        return (
            self._loaded_version,
            events,
            [r.rid for r in batch.rows] + [p.row.rid for p in batch.pending],
        )

    async def _schedule(self) -> None:
        wake = self._wake
        assert wake is not None, "engine not started"
        while True:
            # cleared before the state is read, never after: a request enqueued while this loop
            # awaits the worker (freeing finished rows below) has set it and is not missed
            wake.clear()
            if self._parking:
                await self._park_now()
            drop = {rid for rid, st in self._live.items() if st.finish is not None}
            for rid in drop:
                self._live.pop(rid, None)
            while self._waiting and self._waiting[0].finish is not None:
                self._waiting.popleft()  # aborted while queued
            runnable = bool(self._live) or bool(self._waiting)
            if self.paused or not runnable:
                if drop:  # free the KV of aborted rows even while paused/idle
                    await self._run(self._live_batch().remove, drop)
                await wake.wait()
                continue
            admit: list[tuple[Row, list[int]]] = []
            while self._waiting and len(self._live) + len(admit) < self.config.max_batch:
                st = self._waiting.popleft()
                if st.finish is None:
                    admit.append((self._make_row(st), st.input_ids))
                    self._live[st.rid] = st
            try:
                version, events, alive = await self._run(self._worker_job, drop, admit)
            except (
                Exception
            ) as e:  # a failing step must not hang every client: fail its requests, go on
                self._fail_all(e)
                continue
            self._apply(version, events, set(alive))

    def _fail_all(self, err: Exception) -> None:
        from gyre.engine.protocol import FinishReason

        for st in self._live.values():
            st.finish_with(
                FinishReason(type="abort", message=f"engine error: {type(err).__name__}: {err}")
            )
        self._live.clear()
        self._batch = self._new_batch()  # the old KV state is suspect; start clean

    def _apply(self, version: int, events: list[TokenEvent], alive: set[str]) -> None:
        for ev in events:
            st = self._live.get(ev.rid)
            if st is None or st.finish is not None:
                continue  # aborted meanwhile: its tokens past the abort are discarded
            lp = getattr(ev, f"{self.config.logprob_mode}_logprob")
            if ev.cached_tokens:
                st.cached_tokens = ev.cached_tokens
            st.append(ev.token, lp, version)
            if ev.finish is not None:
                st.finish_with(ev.finish)
        for rid in [
            rid for rid in self._live if rid not in alive and self._live[rid].finish is not None
        ]:
            self._live.pop(rid)  # finished and already gone from the worker's batch

    # -- KV migration (gyre.engine.kv_migrate) --------------------------------------------------
    async def park(self, rid: str) -> bool:
        st = self._requests.get(rid)
        if st is None:
            return False
        if self._kv_out is None or rid not in self._live:  # queued: nothing computed to keep
            return await self.abort(rid)
        if st.finish is None:
            self._parking.add(rid)
            self._kick()
        return True

    async def _park_now(self) -> None:
        """At a step boundary: take the rows asked to park out of the batch with their K/V,
        then finish their requests (``abort``, with every token the client was sent)."""
        from gyre.engine.protocol import FinishReason

        rids = [r for r in self._parking if r in self._live and self._live[r].finish is None]
        self._parking.clear()
        if not rids:
            return
        try:
            packets = await self._run(self._take_rows, rids)
        except Exception:  # cannot park: the calls move without their K/V
            packets = {}
        store = self._kv_out
        assert store is not None  # parking is only asked for with migration on
        for rid in rids:  # finished here; the loop's drop below forgets them (and any row a
            st = self._live[rid]  # failed take left in the batch)
            p = packets.get(rid)
            if p is not None and store.room_for(p.nbytes):
                store.put(rid, p)
                self.kv_counts["parked"] += 1
            st.abort_message = "moved: K/V parked for migration"
            st.finish_with(FinishReason(type="abort", message=st.abort_message))

    def _take_rows(self, rids: list[str]) -> dict[str, KVPacket]:
        from gyre.engine.kv_migrate import take_row

        out = {}
        for rid in rids:
            p = take_row(self._live_batch(), rid, self.weights_checksum)
            if p is not None:
                p.weights_dtype = layout_name(self.config.dtype, self.config.compute_dtype)
                out[rid] = p
        return out

    def _admit(self, batch: DecodeBatch, row: Row, ids: list[int]) -> None:
        """Worker: admit a row, with its imported K/V when it has one that still fits."""
        from gyre.engine.kv_migrate import admit_imported

        p = self._admit_kv.pop(row.rid, None)
        if p is not None and admit_imported(batch, row, ids, p):
            self.kv_counts["admitted"] += 1
            return
        batch.admit(row, ids)

    async def export_kv(self, rid: str, weight_version: int) -> KVPacket:
        """The parked K/V of ``rid`` for an engine serving ``weight_version`` (it leaves here)."""
        p = self._kv_out.pop(rid) if self._kv_out is not None else None
        if p is None:
            raise KVRefused("missing", f"no K/V parked for {rid!r}")
        if p.kv_version < 0 or p.kv_version != int(weight_version):
            raise KVRefused(
                "version",
                f"K/V of {rid!r} computed under weights v{p.kv_version}, the target serves "
                f"v{weight_version}: it must be prefilled again",
            )
        self.kv_counts["exported"] += 1
        return p

    async def import_kv(self, rid: str, packet: Any) -> dict[str, Any]:
        """Keep ``packet`` for request ``rid`` if it is this engine's kind of K/V, under its
        weights, and there is room; else :class:`KVRefused` (the caller re-prefills)."""
        try:
            store = self._check_import(packet)
        except KVRefused:
            self.kv_counts["refused"] += 1
            raise
        store.put(rid, packet)
        self.kv_counts["imported"] += 1
        rate = self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None
        return {
            "success": True,
            "tokens": len(packet.tokens),
            "bytes": packet.nbytes,
            "prefill_estimate_s": None if rate is None else len(packet.tokens) / rate,
        }

    def _check_import(self, p: KVPacket) -> KVStore:
        store = self._kv_in
        if store is None:
            raise KVRefused("unsupported", "KV migration is off on this engine (kv_migration_mb=0)")
        version = self._loaded_version
        if p.kv_version < 0 or p.kv_version != version or self.weight_version != version:
            raise KVRefused(
                "version",
                f"K/V computed under weights v{p.kv_version}; this engine serves "
                f"v{self.weight_version} (loaded v{version})",
            )
        if (
            p.weights_checksum is not None
            and self.weights_checksum is not None
            and p.weights_checksum != self.weights_checksum
        ):
            raise KVRefused("weights", "K/V computed under other weights (checksums differ)")
        mine = self._kv_layout()
        theirs = dict(p.layout(), weights_dtype=p.weights_dtype)
        if {k: theirs.get(k) for k in mine} != mine:
            raise KVRefused("layout", f"K/V layout {theirs} does not match this engine's {mine}")
        if len(p.tokens) >= self.max_context_length:
            raise KVRefused("room", f"{len(p.tokens)} tokens of K/V exceed the context limit")
        if not store.room_for(p.nbytes):
            raise KVRefused(
                "room",
                f"{p.nbytes} bytes of K/V over the migration budget "
                f"({self.config.kv_migration_mb:g} MiB, {store.bytes} bytes held)",
            )
        return store

    def _kv_layout(self) -> dict[str, Any]:
        cfg = self._loaded_model().config
        heads = int(cfg.num_attention_heads)
        out: dict[str, Any] = {
            "layers": int(cfg.num_hidden_layers),
            "heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
            "weights_dtype": layout_name(self.config.dtype, self.config.compute_dtype),
        }
        if self.config.compute_dtype == "float32":  # K/V are held in the weights' dtype
            out["dtype"] = self.config.dtype
        return out

    # -- weights ---------------------------------------------------------------------------------
    def _reload(self, path: str, version: int) -> str:
        new = self._load(path)
        missing = self._loaded_model().load_state_dict(new.state_dict(), strict=True)
        del new
        self._pack()
        self.weights_checksum = weights_checksum(self._loaded_model())
        self._loaded_version = version
        self._held = dict.fromkeys(self._params(), version)
        self._live_batch().new_weights(version)
        return str(missing)

    def _params(self) -> dict:
        """Parameters by every name (a tied head under both of its names)."""
        return dict(self._loaded_model().named_parameters(remove_duplicate=False))

    async def update_weights_from_disk(
        self, req: UpdateWeightsFromDiskRequest
    ) -> UpdateWeightsResponse:
        if not Path(req.model_path).is_dir():
            return UpdateWeightsResponse(
                success=False,
                message=f"model_path {req.model_path!r} is not a directory",
                weight_version=self.weight_version,
            )
        return await self._swap_weights(
            req.weight_version,
            req.abort_all_requests,
            f"loaded {req.model_path}",
            self._reload,
            req.model_path,
        )

    async def _swap_weights(
        self, version: int | str | None, abort_all: bool, loaded: str, job, *args
    ) -> UpdateWeightsResponse:
        """One weights update, from disk or a weight group: the new version is taken, ``job``
        runs on the worker between two steps with it as its last argument, and a job that fails
        or refuses (wrong shapes, a bad checksum, a missed version) keeps the old weights."""
        if abort_all:
            await self.abort_all("aborted by weights update")
        old = self.weight_version
        self._bump_version(version)
        try:
            await self._run(job, *args, self.weight_version)
        except Exception as e:
            self.weight_version = old
            return UpdateWeightsResponse(
                success=False,
                message=f"weights not loaded: {type(e).__name__}: {e}",
                weight_version=old,
                needs_full_copy=isinstance(e, NeedsFullCopy),
            )
        return UpdateWeightsResponse(
            success=True,
            message=loaded,
            num_paused_requests=self.live_requests,
            weight_version=self.weight_version,
            weights_checksum=self.weights_checksum,
            weights_dtype=layout_name(self.config.dtype, self.config.compute_dtype),
        )

    # -- weights in memory (SGLang's update_weights_from_distributed; docs/engine.md) -----------
    async def init_weights_update_group(self, req: InitWeightsUpdateGroupRequest) -> GroupResponse:
        from gyre.engine.weight_group import WeightGroup

        want = "nccl" if self.config.device.startswith("cuda") else "gloo"
        if req.backend != want:
            return GroupResponse(
                success=False,
                message=f"backend {req.backend!r}: this engine runs on {self.config.device}, "
                f"use {want!r}",
            )
        if req.group_name in self._groups:
            self._groups.pop(req.group_name).close()
        try:  # the rendezvous blocks until every member joined: a thread, not the loop
            group = await asyncio.to_thread(
                WeightGroup,
                req.master_address,
                req.master_port,
                req.rank_offset,
                req.world_size,
                req.group_name,
                req.backend,
            )
        except Exception as e:
            return GroupResponse(success=False, message=f"joining {req.group_name!r} failed: {e}")
        self._groups[req.group_name] = group
        return GroupResponse(
            success=True, message=f"joined {req.group_name!r} as rank {group.rank}"
        )

    async def destroy_weights_update_group(self, group_name: str) -> GroupResponse:
        group = self._groups.pop(group_name, None)
        if group is None:
            return await super().destroy_weights_update_group(group_name)
        group.close()
        return GroupResponse(success=True, message=f"left {group_name!r}")

    def _receive_bucket(
        self, group: WeightGroup, req: UpdateWeightsFromDistributedRequest, version: int
    ) -> None:
        """Worker thread: receive every tensor of the bucket, then check, then apply."""
        from gyre.engine import receive

        got = receive.receive(group, req, self.config.device)
        params = self._params()
        new = receive.decode_bucket(params, self._held, req, got)
        try:
            receive.apply(params, new)
        finally:  # even a bucket that failed half-way may have written some weights
            self._pack()
        # a tied head is one tensor under two names: it holds the version under both
        moved = {id(params[n]) for n in new}
        self._held.update({n: version for n, p in params.items() if id(p) in moved})
        self.weights_checksum = weights_checksum(self._loaded_model())
        self._loaded_version = version
        self._live_batch().new_weights(version)

    async def update_weights_from_distributed(
        self, req: UpdateWeightsFromDistributedRequest
    ) -> UpdateWeightsResponse:
        group = self._groups.get(req.group_name)
        if group is None:
            return UpdateWeightsResponse(
                success=False,
                message=f"no weight-update group {req.group_name!r}; call /init_weights_update_group",
                weight_version=self.weight_version,
            )
        return await self._swap_weights(
            req.weight_version,
            req.abort_all_requests,
            f"loaded {len(req.names)} tensors ({req.encoding})",
            self._receive_bucket,
            group,
            req,
        )

    def stats(self) -> dict:
        out = super().stats()
        batch = self._batch
        pc = batch.prefix_cache if batch is not None else None
        out.update(
            waiting=len(self._waiting),
            running=len(batch) if batch is not None else 0,
            prefilling=len(batch.pending) if batch is not None else 0,
            decode_steps=self.steps,
            max_rows_seen=self.max_rows_seen,
            prefill_tokens=self.prefill_tokens,
            prefill_s=round(self.prefill_s, 3),
        )
        if self._kv_in is not None and self._kv_out is not None:
            out.update({f"kv_{k}": v for k, v in self.kv_counts.items()})
            out.update(kv_parked_bytes=self._kv_out.bytes, kv_imported_bytes=self._kv_in.bytes)
        if pc is not None:
            out.update(
                prefix_cache_entries=len(pc),
                prefix_cache_bytes=pc.bytes,
                prefix_cache_hits=pc.hits,
                prefix_cache_misses=pc.misses,
                prefix_cache_hit_tokens=pc.hit_tokens,
            )
        return out

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_path=self.config.model_dir,
            tokenizer_path=self.config.model_dir if self.tokenizer is not None else None,
            weight_version=self.weight_version,
            engine_kind=self.kind,
            engine_id=self.engine_id,
            max_context_length=self.max_context_length,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            max_batch=self.config.max_batch,
            paused=self.paused,
            weights_checksum=self.weights_checksum,
            weights_dtype=layout_name(self.config.dtype, self.config.compute_dtype),
            kv_migration=self.config.kv_migration_mb > 0,
        )


def _prefill_todo(batch: DecodeBatch) -> int:
    """Prompt tokens the batch's queued prefills have still to run."""
    return sum(len(p.ids) - p.done for p in batch.pending)
