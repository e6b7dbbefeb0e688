"""What a micro-step's objective reports, reduced across micro-steps and cells (no torch here:
the driver merges these too).

Counters sum; the ``*_max`` fields reduce by max. See :mod:`gyre.train.objective` for the
loss and :func:`gyre.train.objective.mismatch_stats` for the ``mm_*`` fields.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class ObjectiveStats:
    """Counters that reduce across micro-steps and replicas: sums, except the ``*_max`` fields.

    The ``mm_*`` fields measure the train/inference mismatch ``d_t = l_t - b_t`` between the
    trainer's log-prob and the behaviour log-prob the engine recorded, apart for targets sampled
    under the trainer's own weights version (``same``) and under another one (``other``); see
    :func:`mismatch_stats`. ``as_list`` puts the :data:`N_SUM` summed fields first and the
    max-reduced ones after, so a reduce can sum the head and max the tail.
    """

    loss_sum: float = 0.0  # sum of loss_e parts (divide by E for the batch loss)
    tokens: int = 0  # target tokens
    tokens_capped: int = 0  # targets with sg(r_t) > cap
    exec_weight: float = (
        0.0  # sum of token_weight (= executions seen, split ones counted once in total)
    )
    exec_clipped_weight: float = 0.0  # same, for clipped executions
    mm_same_tokens: int = 0  # targets with a behaviour log-prob, sampled at the trainer's version
    mm_same_k3: float = 0.0  # sum of exp(d) - d - 1 over them
    mm_same_mult: float = 0.0  # sum of exp(|d|) over them
    mm_other_tokens: int = 0  # same three, for targets sampled at another version
    mm_other_k3: float = 0.0
    mm_other_mult: float = 0.0
    # the same-version targets again, by which model call of their execution sampled them
    # (PackedSequence.turn; TURN_BUCKETS): later calls have longer contexts
    mm_turn1_tokens: int = 0
    mm_turn1_k3: float = 0.0
    mm_turn2_tokens: int = 0
    mm_turn2_k3: float = 0.0
    mm_turn3_4_tokens: int = 0
    mm_turn3_4_k3: float = 0.0
    mm_turn5_8_tokens: int = 0
    mm_turn5_8_k3: float = 0.0
    mm_turn9_16_tokens: int = 0
    mm_turn9_16_k3: float = 0.0
    mm_turn17_32_tokens: int = 0
    mm_turn17_32_k3: float = 0.0
    mm_turn33_up_tokens: int = 0
    mm_turn33_up_k3: float = 0.0
    mm_same_max: float = 0.0  # max |d| (max-reduced)
    mm_other_max: float = 0.0

    def add(self, other: ObjectiveStats) -> None:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(a, b) if f.name in MAX_FIELDS else a + b)

    def as_list(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, xs) -> ObjectiveStats:
        vals = [float(x) for x in xs]
        if len(vals) != len(fields(cls)):
            raise ValueError(f"{len(vals)} stats values for {len(fields(cls))} fields")
        kw: dict[str, Any] = {
            f.name: int(round(v)) if f.type in ("int", int) else v
            for f, v in zip(fields(cls), vals)
        }
        return cls(**kw)

    def mismatch_metrics(self) -> dict[str, float]:
        """``mismatch/*`` scalars of a step: k3 KL, max |d|, token_mult_prob_error, tokens.

        A class with no tokens reports only its count (0): a mean over nothing is not a number.
        """
        out: dict[str, float] = {}
        for cls_ in ("same", "other"):
            n = getattr(self, f"mm_{cls_}_tokens")
            out[f"mismatch/tokens_{cls_}_version"] = float(n)
            if n:
                out[f"mismatch/kl_{cls_}_version"] = getattr(self, f"mm_{cls_}_k3") / n
                out[f"mismatch/max_abs_{cls_}_version"] = getattr(self, f"mm_{cls_}_max")
                out[f"mismatch/token_mult_prob_error_{cls_}_version"] = (
                    getattr(self, f"mm_{cls_}_mult") / n
                )
        for label in TURN_BUCKETS:  # only the buckets some target fell in
            n = getattr(self, f"mm_turn{label}_tokens")
            if n:
                key = label.replace("_up", "+").replace("_", "-")
                out[f"mismatch/tokens_same_version_turn{key}"] = float(n)
                out[f"mismatch/kl_same_version_turn{key}"] = getattr(self, f"mm_turn{label}_k3") / n
        return out


# model-call buckets of the per-turn mismatch: call 1, 2, 3-4, 5-8, 9-16, 17-32, 33 and later
# (bucket i holds the calls k with ceil(log2 k) == i, the last one everything after)
TURN_BUCKETS = ("1", "2", "3_4", "5_8", "9_16", "17_32", "33_up")


MAX_FIELDS = ("mm_same_max", "mm_other_max")
N_SUM = len(fields(ObjectiveStats)) - len(MAX_FIELDS)  # as_list()[:N_SUM] sums, the rest maxes
assert tuple(f.name for f in fields(ObjectiveStats)[N_SUM:]) == MAX_FIELDS
