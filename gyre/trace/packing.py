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

Pure python + numpy: no torch here (the torch side is ``gyre.train.packed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MODES = ("paths", "tree")

# Every target of execution e carries 1/|T_e|, so e's weights sum to 1 over all its micro-steps.
WEIGHT_SUM_TOL = 1e-6  # the sum taken in float64 on the host, from the rows
ACCUMULATED_WEIGHT_SUM_TOL = 1e-4  # the sum accumulated by the trainer (micro-step + pre-pass)


def weights_sum_to_one(total: float, tol: float = WEIGHT_SUM_TOL) -> bool:
    """Whether an execution's target token weights add up to 1 (NaN does not).

    The one place the rule is written; the buffer, the loss and its pre-pass all ask here.
    """
    return abs(total - 1.0) <= tol


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
    # turn[i]: for a target, which of its execution's model calls sampled it (1 = the first
    # call, by the proxy's arrival order ``TraceRecord.seq``); -1 elsewhere. Empty: unknown.
    # The trainer splits the train/inference mismatch by it (later calls, longer contexts).
    turn: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return sum(1 for t in self.is_target if t)

    def validate(self) -> None:
        """Raise :class:`PackingError` if the row breaks an invariant."""
        n = len(self.input_ids)
        for name in (
            "position_ids",
            "parent",
            "is_target",
            "behaviour_logprob",
            "policy_version",
            "execution_index",
            "token_weight",
        ):
            if len(getattr(self, name)) != n:
                raise PackingError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        for name in ("tree_index", "path_index", "turn"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise PackingError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        for i, p in enumerate(self.parent):
            if not -1 <= p < i:
                raise PackingError(
                    f"token {i}: parent {p} is not an earlier token (need -1 <= parent < i)"
                )
            want = 0 if p < 0 else self.position_ids[p] + 1
            if self.position_ids[i] != want:
                raise PackingError(
                    f"token {i}: position {self.position_ids[i]} but depth is {want}"
                )
            if self.is_target[i] and p < 0:
                raise PackingError(f"token {i}: a target needs a predecessor to be predicted from")

    @classmethod
    def from_chain(
        cls, input_ids: list[int], is_target: list[bool] | None = None
    ) -> PackedSequence:
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


# ---------------------------------------------------------------------------- packing
@dataclass
class _Unit:
    """A piece of one execution that must stay in one row: a path (``paths``) or a subtree (``tree``)."""

    adm: int  # index into the admissions list
    tokens: np.ndarray  # tree indices, parents first
    parent: np.ndarray  # local parent index (-1 = root)
    owner: np.ndarray  # admitted path number for targets, -1 for context

    def __len__(self) -> int:
        return len(self.tokens)


def _truncated_paths(adm) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(path number, tree indices root..last target, that path's targets) for paths with targets."""
    out = []
    for k, p in enumerate(adm.paths):
        if p.last_target < 0:
            continue
        toks = adm.tree.path_tokens(p.leaf)
        cut = int(np.searchsorted(toks, p.last_target)) + 1  # indices increase along a path
        out.append((k, toks[:cut], p.targets))
    return out


def _path_units(ai: int, adm) -> list[_Unit]:
    units = []
    for k, toks, tg in _truncated_paths(adm):
        owner = np.where(np.isin(toks, tg), k, -1)
        units.append(_Unit(adm=ai, tokens=toks, parent=np.arange(len(toks)) - 1, owner=owner))
    return units


def _tree_units(ai: int, adm, token_budget: int) -> list[_Unit]:
    """The admitted subtree, DFS pre-order; split into several subtrees if over budget."""
    paths = sorted(
        _truncated_paths(adm), key=lambda x: x[1].tolist()
    )  # lexicographic = DFS pre-order
    n_tree = len(adm.tree)
    # A shared token is emitted with whichever path comes first in DFS order, which need
    # not be the path that admitted it, so targets are looked up across all paths.
    owner = np.full(n_tree, -1, dtype=np.int64)
    for k, _toks, tg in paths:
        owner[tg] = k
    local = np.full(n_tree, -1, dtype=np.int64)  # tree index -> local index in the current unit
    units: list[_Unit] = []
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    size = 0

    def flush() -> None:
        nonlocal chunks, size
        if chunks:
            toks = np.concatenate([c[0] for c in chunks])
            par = np.concatenate([c[1] for c in chunks])
            own = owner[toks]
            owner[toks] = -1  # a prefix repeated in a later split unit is context there
            local[toks] = -1
            units.append(_Unit(adm=ai, tokens=toks, parent=par, owner=own))
        chunks, size = [], 0

    for _k, toks, _tg in paths:
        em = local[toks] >= 0  # emitted tokens form a prefix of the path
        shared = len(toks) if em.all() else int(np.argmin(em))
        if size and size + len(toks) - shared > token_budget:
            flush()
            shared = 0
        new = toks[shared:]
        if not len(new):
            continue
        ids = np.arange(size, size + len(new))
        par = ids - 1
        par[0] = local[toks[shared - 1]] if shared else -1
        local[new] = ids
        chunks.append((new, par))
        size += len(new)
    flush()
    return units


def _tree_arrays(tree) -> dict[str, np.ndarray]:
    cache = getattr(tree, "_np_cache", None)
    if cache is None or len(cache["tokens"]) != len(tree):
        cache = {
            "tokens": np.asarray(tree.tokens, dtype=np.int64),
            "depth": np.asarray(tree.depth, dtype=np.int64),
            "logprob": np.asarray(tree.logprob, dtype=np.float64),
            "version": np.asarray(tree.version, dtype=np.int64),
            "turn": _turns(tree),
        }
        tree._np_cache = cache
    return cache


def _turns(tree) -> np.ndarray:
    """Per token: the 1-based call index (``TraceRecord.seq`` + 1) of the request that sampled
    it, for targets; -1 for context."""
    n = len(tree.tokens)
    if not n:
        return np.zeros(0, dtype=np.int64)
    call = np.asarray([r.seq + 1 for r in tree.requests], dtype=np.int64)
    src = np.asarray(tree.source, dtype=np.int64)
    tgt = np.frombuffer(bytes(tree.is_target), dtype=np.uint8).astype(bool)
    return np.where(tgt, call[src], -1)


def pack(admissions: list, mode: str, token_budget: int) -> list[MicroStep]:
    """Cut admitted executions into micro-steps of at most ``token_budget`` tokens.

    ``paths``: each admitted path (cut after its last admitted target: later
    tokens cannot affect any loss) is a unit. ``tree``: each execution's
    admitted subtree is one unit, split into several subtrees (sharing is then
    lost between them) only when it exceeds the budget. Units are bin-packed
    first-fit-decreasing; each micro-step is one row (a forest). A single path
    longer than the budget gets a micro-step of its own (a path cannot be cut
    without changing its context). Dropped or empty executions are skipped;
    every target carries ``1/|T_e|`` so each execution's weights sum to 1 over
    all micro-steps.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if token_budget <= 0:
        raise ValueError("token_budget must be positive")
    seen: set[str] = set()
    units: list[_Unit] = []
    for ai, adm in enumerate(admissions):
        if adm.execution_id in seen:
            raise PackingError(f"execution {adm.execution_id!r} appears twice")
        seen.add(adm.execution_id)
        if adm.dropped or adm.n_targets == 0:
            continue
        units.extend(
            _path_units(ai, adm) if mode == "paths" else _tree_units(ai, adm, token_budget)
        )
    return [_row(b, units, admissions, mode) for b in _first_fit(units, token_budget)]


def _first_fit(units: list[_Unit], token_budget: int) -> list[list[int]]:
    """Bin-pack units first-fit-decreasing into rows of at most ``token_budget`` tokens (a unit
    longer than the budget gets a row of its own); each row keeps its units in order."""
    order = sorted(range(len(units)), key=lambda u: -len(units[u]))
    bins: list[list[int]] = []
    room: list[int] = []
    for u in order:
        n = len(units[u])
        for bi in range(len(bins)):
            if room[bi] >= n:
                bins[bi].append(u)
                room[bi] -= n
                break
        else:
            bins.append([u])
            room.append(token_budget - n)
    for b in bins:
        b.sort()  # keep admission/path order inside a row
    return bins


def _row(b: list[int], units: list[_Unit], admissions: list, mode: str) -> MicroStep:
    """One micro-step: the units of bin ``b`` laid side by side in one row (a forest)."""
    executions: list[str] = []
    ex_index: dict[int, int] = {}
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("ids", "pos", "par", "tgt", "blp", "ver", "exe", "w", "tix", "pix", "turn")
    }
    off = 0
    for u in b:
        unit = units[u]
        adm = admissions[unit.adm]
        arr = _tree_arrays(adm.tree)
        if unit.adm not in ex_index:
            ex_index[unit.adm] = len(executions)
            executions.append(adm.execution_id)
        t = unit.tokens
        tg = unit.owner >= 0
        parts["ids"].append(arr["tokens"][t])
        parts["pos"].append(arr["depth"][t])
        parts["par"].append(np.where(unit.parent >= 0, unit.parent + off, -1))
        parts["tgt"].append(tg)
        parts["blp"].append(np.where(tg, arr["logprob"][t], 0.0))
        parts["ver"].append(np.where(tg, arr["version"][t], -1))
        parts["exe"].append(np.where(tg, ex_index[unit.adm], -1))
        parts["w"].append(np.where(tg, adm.weight, 0.0))
        parts["tix"].append(t)
        parts["pix"].append(unit.owner)
        parts["turn"].append(np.where(tg, arr["turn"][t], -1))
        off += len(t)
    cat = {k: np.concatenate(v).tolist() for k, v in parts.items()}
    row = PackedSequence(
        input_ids=cat["ids"],
        position_ids=cat["pos"],
        parent=cat["par"],
        is_target=cat["tgt"],
        behaviour_logprob=cat["blp"],
        policy_version=cat["ver"],
        execution_index=cat["exe"],
        token_weight=cat["w"],
        tree_index=cat["tix"],
        path_index=cat["pix"],
        turn=cat["turn"],
    )
    return MicroStep(mode=mode, sequences=[row], executions=executions)
