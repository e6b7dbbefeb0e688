"""A claimable unit of work: one packed micro-step plus what the loss needs to know.

Serialised as JSON bytes so any claim-queue backend (a TCPStore, a Ray actor, a
file) can carry it without pickling code objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from gyre.trace.packing import MicroStep, PackedSequence


def _plain(x):
    """numpy scalars/arrays (a packer may hand them over) -> plain JSON values."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


@dataclass
class MicroStepTask:
    """Micro-step ``index`` of a step, with the advantage of each execution present.

    ``advantages[i]`` belongs to ``micro_step.executions[i]``. ``spans`` lists, for every
    execution whose admitted targets also lie in other micro-steps of this step, the
    indices of all micro-steps holding its targets (so a replica can pre-pass them to
    get s_e); executions kept whole in this micro-step are absent.
    """

    index: int
    micro_step: MicroStep
    advantages: list[float]
    spans: dict[str, list[int]] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        d = {
            "index": self.index,
            "mode": self.micro_step.mode,
            "executions": self.micro_step.executions,
            # PackedSequence holds flat lists of scalars: a shallow dict serialises the same;
            # dataclasses.asdict deep-copies every token (~0.1 s per group on the controller's loop)
            "sequences": [
                {f.name: getattr(s, f.name) for f in fields(s)} for s in self.micro_step.sequences
            ],
            "advantages": self.advantages,
            "spans": self.spans,
            "groups": self.groups,
        }
        return json.dumps(d, separators=(",", ":"), default=_plain).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> MicroStepTask:
        d = json.loads(raw)
        ms = MicroStep(
            mode=d["mode"],
            sequences=[PackedSequence(**s) for s in d["sequences"]],
            executions=list(d["executions"]),
        )
        return cls(
            int(d["index"]),
            ms,
            [float(a) for a in d["advantages"]],
            {k: [int(i) for i in v] for k, v in d["spans"].items()},
            list(d["groups"]),
        )

    @property
    def n_tokens(self) -> int:
        return self.micro_step.n_tokens
