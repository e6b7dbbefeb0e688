"""Packed micro-steps: the wire format between admission and the trainer.

A :class:`PackedSequence` is one row of tokens plus, per token, the index of its
predecessor (``parent``). That single array expresses both packing modes:

* ``paths``: every admitted root-to-leaf path is its own chain
  (``parent[i] = i - 1`` inside a path, ``-1`` at its first token), paths laid
  end to end;
* ``tree``: an execution's admitted subtree serialised once in depth-first
  pre-order; ``parent[i]`` is the tree parent, so every token attends exactly to
  its ancestors and shared prefixes are stored (and computed) once.

Position ids are the depth along the token's root-to-leaf path in both modes, so
a token sees the same context at the same positions either way: that is what
makes the two modes (and a plain forward of the original request) give the same
log-probs. Invariant checked by :meth:`PackedSequence.validate`:
``-1 <= parent[i] < i`` and ``position_ids[i] == position_ids[parent[i]] + 1``.

Pure python: no torch here (the torch side is ``gyre.train.packed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("paths", "tree")


class PackingError(ValueError):
    """A packed sequence that breaks the format's invariants."""


@dataclass
class PackedSequence:
    """One row of a micro-step (see module docstring for the invariants)."""

    input_ids: list[int]
    position_ids: list[int]
    parent: list[int]
    is_target: list[bool]
    behaviour_logprob: list[float]
    policy_version: list[int]
    execution_index: list[int]
    token_weight: list[float]
    # Additive fields (not in the original contract):
    # tree_index[i]: the token's index in its execution's TrajectoryTree (-1 if synthetic);
    # lets callers map a packed token back to the request that sampled it.
    tree_index: list[int] = field(default_factory=list)
    # path_index[i]: which admitted path (index into Admission.paths) fixed this target (-1 elsewhere).
    path_index: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return sum(1 for t in self.is_target if t)

    def validate(self) -> None:
        """Raise :class:`PackingError` if the row breaks an invariant."""
        n = len(self.input_ids)
        for name in ("position_ids", "parent", "is_target", "behaviour_logprob", "policy_version",
                     "execution_index", "token_weight"):
            if len(getattr(self, name)) != n:
                raise PackingError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        for name in ("tree_index", "path_index"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise PackingError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        for i, p in enumerate(self.parent):
            if not -1 <= p < i:
                raise PackingError(f"token {i}: parent {p} is not an earlier token (need -1 <= parent < i)")
            want = 0 if p < 0 else self.position_ids[p] + 1
            if self.position_ids[i] != want:
                raise PackingError(f"token {i}: position {self.position_ids[i]} but depth is {want}")
            if self.is_target[i] and p < 0:
                raise PackingError(f"token {i}: a target needs a predecessor to be predicted from")

    @classmethod
    def from_chain(cls, input_ids: list[int], is_target: list[bool] | None = None) -> "PackedSequence":
        """A single causal chain (handy in tests and for plain SFT-style rows)."""
        n = len(input_ids)
        tgt = list(is_target) if is_target is not None else [i > 0 for i in range(n)]
        return cls(
            input_ids=list(input_ids),
            position_ids=list(range(n)),
            parent=[i - 1 for i in range(n)],
            is_target=tgt,
            behaviour_logprob=[0.0] * n,
            policy_version=[-1 if not t else 0 for t in tgt],
            execution_index=[0 if t else -1 for t in tgt],
            token_weight=[0.0] * n,
        )


@dataclass
class MicroStep:
    """What one training cell processes before contributing to the gradient."""

    mode: str  # "paths" | "tree"
    sequences: list[PackedSequence]
    executions: list[str]  # execution ids present; PackedSequence.execution_index points here

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    @property
    def n_targets(self) -> int:
        return sum(s.n_targets for s in self.sequences)
