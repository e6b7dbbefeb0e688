"""Typed configuration of the trainer (composed into Gyre's top-level config later).

Every knob that changes the update is here, with the paper's values as defaults,
so a run's behaviour is fully described by one serialisable object.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator


class ObjectiveConfig(BaseModel):
    """GSPO with token-level capped importance weights and a per-execution sequence clip.

    See :mod:`gyre.train.objective` for the formula.
    """

    token_cap: float = Field(
        5.0, gt=0, description="cap on the stop-gradient token ratio w_t = min(sg(r_t), cap)"
    )
    clip_low: float = Field(
        0.995, gt=0, description="executions with A_e < 0 and s_e < clip_low give no gradient"
    )
    clip_high: float = Field(
        1.005, gt=0, description="executions with A_e > 0 and s_e > clip_high give no gradient"
    )
    ratio_reference: Literal["behaviour", "proximal", "decoupled"] = Field(
        "behaviour",
        description="reference log-prob in r_t and s_e: the engine's behaviour log-prob b_t; the proximal "
        "log-prob of the step's starting weights (r_t = s_e = 1); or 'decoupled': w_t against b_t, the "
        "sequence clip against the proximal policy (so it never binds with one optimizer step per batch)",
    )
    adv_eps: float = Field(1e-6, gt=0, description="eps in A_e = (R_e - mean) / (std + eps)")
    adv_std: Literal["population", "sample"] = Field(
        "population", description="std over the group's scores"
    )
    execution_split: Literal["prepass", "forbid"] = Field(
        "prepass",
        description="an execution whose admitted paths span several micro-steps: 'prepass' computes its s_e "
        "with a no-grad pass over its other micro-steps; 'forbid' raises",
    )

    @model_validator(mode="after")
    def _check_range(self) -> ObjectiveConfig:
        if not self.clip_low <= 1.0 <= self.clip_high:
            raise ValueError(
                f"clip range must contain 1.0, got [{self.clip_low}, {self.clip_high}]"
            )
        return self


class OptimConfig(BaseModel):
    """The core's optimizer. Only the core holds its state."""

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(1.0, description="max global grad norm (None: no clipping)")


class StreamConfig(BaseModel):
    """How ready groups become micro-steps."""

    batch_groups: int = Field(32, ge=1, description="B: groups per optimizer step")
    token_budget: int = Field(8192, ge=1, description="max tokens in one micro-step")
    pack_mode: Literal["paths", "tree"] = "paths"
    poll_s: float = Field(
        0.005, gt=0, description="sleep between polls of the claim queue when it is empty"
    )
    stall_timeout_s: float = Field(
        600.0, gt=0, description="raise if a step makes no progress this long"
    )


class CheckpointConfig(BaseModel):
    """Core checkpoints (weights, optimizer state, version, data cursor: one model and its
    optimizer state each, ~3x the model's size with AdamW)."""

    dir: str | None = Field(
        None,
        description="checkpoint root; None disables checkpoints (gyre run always writes them to "
        "the run directory's checkpoints/)",
    )
    every_steps: int = Field(
        1, ge=1, description="checkpoint every this many steps (and always after the last)"
    )
    keep: int = Field(2, ge=1, description="how many checkpoints to keep (the newest)")

    def due(self, steps_done: int, total_steps: int | None = None) -> bool:
        """Whether the step that brings the run to ``steps_done`` steps ends with a checkpoint:
        every ``every_steps`` steps, and always the run's last, so a resume repeats at most
        ``every_steps - 1`` steps."""
        return steps_done % self.every_steps == 0 or (
            total_steps is not None and steps_done >= total_steps
        )


class TrainerConfig(BaseModel):
    """Everything one replica needs; identical on every cell."""

    model_dir: str
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="precision of the forward/backward matmuls: 'bfloat16' runs the log-prob "
        "function under torch.autocast (AMX on recent x86 CPUs: ~6x the float32 matmul rate) "
        "while weights, gradients and optimizer state stay in `dtype`; log-softmax stays float32",
    )
    device: str = "cpu"
    activation_checkpointing: bool = Field(
        False,
        description="keep only each decoder layer's input through the forward and recompute the "
        "rest in the backward (HF's gradient checkpointing, also in Gyre's tree-attention "
        "layer loop): a micro-step's activations shrink from every layer's intermediates to "
        "one hidden state per layer, for one more forward of compute",
    )
    seed: int = 0
    j_max: int | None = Field(
        5, ge=1, description="admission: at most this many paths per execution (None: all)"
    )
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig()
    stream: StreamConfig = StreamConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logprob_fn: str = Field(
        "gyre.train.packed:token_logprobs",
        description="'module:function' computing per-token log-probs of a PackedSequence (with grad)",
    )
