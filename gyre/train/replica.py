"""A training replica: one copy of the model that turns claimed micro-steps into gradients.

It holds no optimizer and no step state: the core wraps one with an optimizer and
the step loop (:mod:`gyre.train.demo.core`), a satellite wraps one with joining
(:mod:`gyre.train.demo.satellite`). Gradients accumulate in ``param.grad`` across the
micro-steps a replica processes; the step's reduce sums them over participants.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from gyre.trace.packing import ACCUMULATED_WEIGHT_SUM_TOL, weights_sum_to_one
from gyre.train.config import TrainerConfig
from gyre.train.objective import ObjectiveStats, execution_log_ratio, gspo_loss, mismatch_stats
from gyre.train.precision import compute_autocast
from gyre.train.tasks import MicroStepTask

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def resolve(spec: str) -> Callable:
    """``'module:function'`` -> the function."""
    mod, _, fn = spec.partition(":")
    if not fn:
        raise ValueError(f"expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(mod), fn)


def load_causal_lm(
    model_dir: str, dtype: str = "float32", device: str = "cpu", checkpointing: bool = False
) -> torch.nn.Module:
    """Any HF causal LM directory -> model in train mode (eager-free, SDPA attention).
    ``checkpointing``: HF's gradient checkpointing on (non-reentrant), which
    :func:`gyre.train.packed.token_logprobs` honours in its own layer loop too."""
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    model.to(device)
    model.train()
    if checkpointing:  # transformers 5 renamed it; 4.x has only the old name
        hf: Any = model  # a PreTrainedModel: nn.Module's typing does not know its methods
        kwargs = {"use_reentrant": False}
        if hasattr(hf, "activation_checkpointing_enable"):
            hf.activation_checkpointing_enable(kwargs)
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


class ReplicaWorker:
    """Model + objective. ``compute(task)`` runs forward/backward of one micro-step."""

    def __init__(self, cfg: TrainerConfig):
        self.cfg = cfg
        self.model: torch.nn.Module | None = None
        self._logprob_fn = resolve(cfg.logprob_fn)
        self._prepass_cache: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}

    def start(self, model_dir: str | None = None) -> None:
        self.model = load_causal_lm(
            model_dir or self.cfg.model_dir,
            self.cfg.dtype,
            self.cfg.device,
            checkpointing=self.cfg.activation_checkpointing,
        )

    def stop(self) -> None:
        self.model = None
        self._prepass_cache.clear()

    @property
    def live_model(self) -> torch.nn.Module:
        """The model between ``start()`` and ``stop()``; using a stopped replica is a bug."""
        if self.model is None:
            raise RuntimeError("replica is not started (call start() first)")
        return self.model

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for p in self.live_model.parameters() if p.requires_grad]

    def zero_grad(self) -> None:
        for p in self.live_model.parameters():
            p.grad = None

    def new_step(self) -> None:
        """Forget per-step caches (pre-pass results are valid only for one set of weights)."""
        self._prepass_cache.clear()

    # ---------------------------------------------------------------------------------
    def _targets(self, task: MicroStepTask, grad: bool):
        """Concatenate l_t, b_t, execution index and token weight over the micro-step's targets.

        Returns ``(logp, ref, exec_index, token_weight, token_weight_f64, behaviour, version,
        turn)``: ``ref`` is ``None`` under the proximal reference; ``behaviour`` (float64),
        ``version`` (each target's sampling weights version) and ``turn`` (its model call, -1
        unknown) are always there, for the mismatch metrics.
        """
        dev = next(self.live_model.parameters()).device
        logps, refs, exs, tws, vers, turns = [], [], [], [], [], []
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            for seq in task.micro_step.sequences:
                idx = [i for i, t in enumerate(seq.is_target) if t]
                if not idx:
                    continue
                with compute_autocast(dev, self.cfg.compute_dtype):  # bf16 matmuls, fp32 masters
                    lp = self._logprob_fn(self.model, seq)
                it = torch.tensor(idx, dtype=torch.long, device=dev)
                logps.append(lp.index_select(0, it))
                refs.append(
                    torch.tensor(
                        [seq.behaviour_logprob[i] for i in idx], dtype=torch.float64, device=dev
                    )
                )
                exs.append(
                    torch.tensor(
                        [seq.execution_index[i] for i in idx], dtype=torch.long, device=dev
                    )
                )
                tws.append(
                    torch.tensor(
                        [seq.token_weight[i] for i in idx], dtype=torch.float64, device=dev
                    )
                )
                vers.append(
                    torch.tensor([seq.policy_version[i] for i in idx], dtype=torch.long, device=dev)
                )
                turns.append(
                    torch.tensor(
                        [seq.turn[i] for i in idx] if seq.turn else [-1] * len(idx),
                        dtype=torch.long,
                        device=dev,
                    )
                )
        if not logps:
            return None
        logp = torch.cat(logps)
        beh = torch.cat(refs)
        ref = None if self.cfg.objective.ratio_reference == "proximal" else beh.to(logp.dtype)
        tw64 = torch.cat(tws)
        exi, ver, turn = torch.cat(exs), torch.cat(vers), torch.cat(turns)
        return logp, ref, exi, tw64.to(logp.dtype), tw64, beh, ver, turn

    def _partials(self, step: int, task: MicroStepTask) -> dict[str, tuple[float, float]]:
        """No-grad per-execution (sum w*(l-b), sum w) of one micro-step, cached per step."""
        key = (step, task.index)
        if key not in self._prepass_cache:
            got = self._targets(task, grad=False)
            out: dict[str, tuple[float, float]] = {}
            if got is not None:
                logp, ref, ex, _tw, tw64, _beh, _ver, _turn = got
                diff = logp - (logp if ref is None else ref)
                num, den = execution_log_ratio(diff, ex, tw64, len(task.micro_step.executions))
                for i, e in enumerate(task.micro_step.executions):
                    if float(den[i]) > 0:
                        out[e] = (float(num[i]), float(den[i]))
            self._prepass_cache[key] = out
        return self._prepass_cache[key]

    def compute(
        self,
        task: MicroStepTask,
        *,
        step: int = 0,
        get_task: Callable[[int], MicroStepTask] | None = None,
        version: int | None = None,
    ) -> ObjectiveStats:
        """Forward + backward of one micro-step; gradients accumulate into ``param.grad``.

        ``version`` is the weights version this replica holds: the stats' train/inference
        mismatch (trainer log-prob vs the engine's behaviour log-prob, from this same forward)
        is split by whether a target was sampled at that version.

        Executions listed in ``task.spans`` have targets in other micro-steps too: their
        s_e comes from a no-grad pre-pass over those micro-steps (exact, because the
        weights do not change during accumulation), or an error with
        ``execution_split='forbid'``.
        """
        ocfg = self.cfg.objective
        got = self._targets(task, grad=True)
        if got is None:
            return ObjectiveStats()
        logp, ref, ex, tw, tw64, beh, ver, turn = got
        execs = task.micro_step.executions
        adv = torch.tensor(task.advantages, dtype=logp.dtype, device=logp.device)
        if len(task.advantages) != len(execs):
            raise ValueError(
                f"micro-step {task.index}: {len(task.advantages)} advantages for {len(execs)} executions"
            )
        seq_log_ratio = None
        if ocfg.ratio_reference == "decoupled":
            # the clip's reference is the step's starting weights, which the trainer holds now:
            # s_e = 1 exactly, for whole or split executions alike (no pre-pass)
            seq_log_ratio = torch.zeros(len(execs), dtype=torch.float64, device=logp.device)
        elif task.spans:
            if ocfg.execution_split == "forbid":
                raise ValueError(
                    f"micro-step {task.index}: executions {sorted(task.spans)} span several micro-steps; "
                    "objective.execution_split='forbid' requires each execution's targets in one micro-step"
                )
            if get_task is None:
                raise ValueError(
                    "a micro-step with split executions needs get_task for the s_e pre-pass"
                )
            diff = logp.detach() - (logp.detach() if ref is None else ref)
            num, den = execution_log_ratio(diff, ex, tw64, len(execs))
            for e, where in task.spans.items():
                i = execs.index(e)
                for j in where:
                    if j == task.index:
                        continue
                    n, d = self._partials(step, get_task(j)).get(e, (0.0, 0.0))
                    num[i] += n
                    den[i] += d
            bad = [
                (execs[i], d)
                for i, d in enumerate(den.tolist())
                if not weights_sum_to_one(d, ACCUMULATED_WEIGHT_SUM_TOL)
            ]
            if bad:
                raise ValueError(
                    f"micro-step {task.index}: token weights of executions do not sum to 1: {bad[:3]}"
                )
            seq_log_ratio = num
        loss, stats = gspo_loss(
            logp,
            ref,
            ex,
            tw,
            adv,
            token_cap=ocfg.token_cap,
            clip_low=ocfg.clip_low,
            clip_high=ocfg.clip_high,
            seq_log_ratio=seq_log_ratio,
            token_weight_exact=tw64,
        )
        loss.backward()
        stats.add(mismatch_stats(logp, beh, ver, version, turn))
        return stats
