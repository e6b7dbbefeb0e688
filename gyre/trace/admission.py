"""Admission: which root-to-leaf paths of a tree are trained, and on which targets.

The paper's rule, exactly:

1. Leaves are grouped into role classes, ranked main > main-summary >
   sub-agent > sub-agent-summary (a leaf's role is the role of the last request
   on its path; see ``gyre.trace.roles``).
2. Repeatedly take the highest class that still has a leaf with unmasked
   trainable (target) tokens on its path; draw one leaf of that class with
   probability proportional to that count.
3. Fix the drawn path's targets to those still unmasked, then mask the whole
   root-to-leaf path (every target on it is now spoken for).
4. Stop when nothing trainable remains or after ``j_max`` paths.

So every target token is admitted at most once, shared prefixes are trained
once (on the first path that reaches them), and a path admitted late may carry
only its own few tokens.

Per-execution normalisation: every admitted target gets weight ``1/|T_e|``
where ``T_e`` is the execution's (disjoint) admitted target set, so an
execution weighs 1 in total however much it branched. An execution marked
``dropped`` (e.g. a missing assessment) weighs 0.

Seeded with ``random.Random(seed)``; :func:`execution_seed` derives a stable
per-execution seed from a run seed (Python's ``hash`` is salted per process).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import numpy as np

from .roles import ROLE_ORDER, Role
from .tree import TrajectoryTree


@dataclass
class AdmittedPath:
    leaf: int  # node id of the leaf
    role: Role
    targets: np.ndarray  # tree indices fixed to this path (ascending)
    last_target: int  # tree index of the deepest fixed target (-1 if none)
    drawn_from: int  # unmasked target count of the leaf when it was drawn


@dataclass
class Admission:
    """The admitted paths of one execution's tree."""

    tree: TrajectoryTree
    j_max: int | None
    seed: int
    paths: list[AdmittedPath] = field(default_factory=list)
    dropped: bool = False  # set by the trainer for executions without a valid score

    @property
    def execution_id(self) -> str:
        return self.tree.execution_id

    @property
    def n_targets(self) -> int:
        return int(sum(len(p.targets) for p in self.paths))

    @property
    def weight(self) -> float:
        """Per-target weight 1/|T_e| (0 for a dropped or empty execution)."""
        n = self.n_targets
        return 0.0 if self.dropped or n == 0 else 1.0 / n

    def targets_by_role(self) -> dict[str, int]:
        out = {r.value: 0 for r in ROLE_ORDER}
        for p in self.paths:
            out[p.role.value] += len(p.targets)
        return out


def execution_seed(run_seed: int, execution_id: str, step: int = 0) -> int:
    """A stable seed for one execution's admission draw."""
    h = hashlib.sha1(f"{run_seed}:{step}:{execution_id}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def admit(tree: TrajectoryTree, j_max: int | None, seed: int) -> Admission:
    """Run the paper's admission on ``tree`` (``j_max=None``: no cap).

    No defaults: in training both come from the trainer's config (``j_max``, ``seed``).
    """
    if j_max is not None and j_max < 0:
        raise ValueError("j_max must be >= 0 or None")
    rng = random.Random(seed)
    adm = Admission(tree=tree, j_max=j_max, seed=seed)
    nodes = tree.nodes
    masked = np.zeros(len(nodes), dtype=bool)
    node_targets = np.array([n.n_targets for n in nodes], dtype=np.int64)
    paths = {lf: np.array(tree.node_path(lf), dtype=np.int64) for lf in tree.leaves}
    by_class: dict[Role, list[int]] = {r: [] for r in ROLE_ORDER}
    for lf in tree.leaves:
        by_class[tree.leaf_role(lf)].append(lf)
    is_target = np.frombuffer(bytes(tree.is_target), dtype=np.uint8).astype(bool)
    while j_max is None or len(adm.paths) < j_max:
        chosen = None
        for role in ROLE_ORDER:
            leaves = by_class[role]
            if not leaves:
                continue
            counts = [int(node_targets[paths[lf]][~masked[paths[lf]]].sum()) for lf in leaves]
            total = sum(counts)
            if total == 0:
                continue
            r = rng.random() * total
            acc = 0
            for lf, c in zip(leaves, counts):
                acc += c
                if c and r < acc:
                    chosen = (role, lf, c)
                    break
            else:  # float edge: r == total
                k = max(i for i, c in enumerate(counts) if c)
                chosen = (role, leaves[k], counts[k])
            break
        if chosen is None:
            break
        role, lf, c = chosen
        live = [n for n in paths[lf].tolist() if not masked[n] and node_targets[n]]
        if live:
            idx = np.concatenate([nodes[n].token_indices() for n in live])
            idx = np.sort(idx[is_target[idx]])
        else:  # pragma: no cover (c > 0 implies live nodes)
            idx = np.zeros(0, dtype=np.int64)
        masked[paths[lf]] = True
        adm.paths.append(
            AdmittedPath(
                leaf=lf,
                role=role,
                targets=idx,
                last_target=int(idx[-1]) if len(idx) else -1,
                drawn_from=c,
            )
        )
    return adm
