"""Packing buffer: ready groups -> micro-step tasks on the claim queue, as groups land.

A group is *ready* when every execution has a reward (score or missing). The buffer
hands groups to the running step oldest policy version first (ties: arrival
order), computes their advantages, drops what carries no gradient (missing
executions, all-equal groups), packs the rest into micro-steps under a token
budget and puts them on the claim queue. Streaming means this happens whenever
groups land, so cells start computing before the batch is complete.

Input per execution, either:

* an ``Admission`` from ``gyre.trace.admission.admit`` (its trajectory tree and
  admitted paths): packed by ``gyre.trace.packing.pack`` in ``paths`` or ``tree``
  mode; that packer bin-packs paths/subtrees and may put one execution into
  several micro-steps; or
* already packed rows (:class:`PackedSequence`), each holding targets of that
  execution only: :func:`pack_rows` never cuts a row and keeps an execution's rows
  in one micro-step whenever they fit the budget.

Either way, an execution whose targets end up in several micro-steps is listed in
those tasks' ``spans`` and replicas get its s_e from a no-grad pre-pass.

The *data cursor* is the set of consumed group ids: a group enters the buffer only
once, and a step's groups become consumed when the core commits that step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gyre.trace.packing import MicroStep, PackedSequence, weights_sum_to_one
from gyre.train.config import ObjectiveConfig, StreamConfig
from gyre.train.rewards import Reward, group_advantages

if TYPE_CHECKING:
    from gyre.trace.admission import Admission


@dataclass
class ReadyGroup:
    """One query's N executions, all assessed."""

    group_id: str
    rewards: dict[str, Reward]
    rows: dict[str, list[PackedSequence]] = field(
        default_factory=dict
    )  # execution id -> its packed rows
    admissions: dict[str, Admission] = field(
        default_factory=dict
    )  # execution id -> gyre.trace Admission
    policy_version: int | None = None  # oldest version that sampled its targets (derived if None)

    def version(self) -> int:
        if self.policy_version is not None:
            return self.policy_version
        vs = [
            v
            for rows in self.rows.values()
            for r in rows
            for v, t in zip(r.policy_version, r.is_target)
            if t and v >= 0
        ]
        for adm in self.admissions.values():
            for p in adm.paths:
                vs.extend(
                    int(adm.tree.version[t]) for t in p.targets if int(adm.tree.version[t]) >= 0
                )
        return min(vs) if vs else 0


@dataclass
class PackStats:
    groups: int = 0
    groups_all_equal: int = 0
    executions_scored: int = 0
    executions_missing: int = 0
    executions_trained: int = 0
    executions_split: int = 0
    tokens: int = 0
    targets: int = 0
    micro_steps: int = 0

    def add(self, o: PackStats) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(o, k))


def _target_weights(rows: list[PackedSequence]) -> tuple[int, float]:
    """|T_e| and the sum of its target token weights over an execution's rows."""
    n = sum(r.n_targets for r in rows)
    tot = sum(w for r in rows for w, t in zip(r.token_weight, r.is_target) if t)
    return n, tot


def _weights_error(tot: float) -> str:
    return f"target token weights sum to {tot}, expected 1 (= |T_e| * 1/|T_e|)"


def _normalise_weights(eid: str, rows: list[PackedSequence]) -> None:
    """Make sure target token weights are 1/|T_e| (fill them if the producer left zeros)."""
    n, tot = _target_weights(rows)
    if n == 0:
        return
    if tot == 0.0:
        for r in rows:
            r.token_weight = [1.0 / n if t else 0.0 for t in r.is_target]
    elif not weights_sum_to_one(tot):
        raise ValueError(f"execution {eid!r}: {_weights_error(tot)}")


def pack_rows(
    executions: list[tuple[str, list[PackedSequence]]], token_budget: int, mode: str = "paths"
) -> list[MicroStep]:
    """Greedy packing of whole rows; an execution stays in one micro-step when it fits.

    Rows are not modified except ``execution_index``, which is remapped to the
    micro-step's ``executions`` list.
    """
    out: list[MicroStep] = []
    cur: list[tuple[str, PackedSequence]] = []
    cur_tok = 0

    def flush():
        nonlocal cur, cur_tok
        if cur:
            names: list[str] = []
            seqs = []
            for eid, row in cur:
                if eid not in names:
                    names.append(eid)
                j = names.index(eid)
                r = PackedSequence(**{**row.__dict__})
                r.execution_index = [j if t else -1 for t in row.is_target]
                seqs.append(r)
            out.append(MicroStep(mode=mode, sequences=seqs, executions=names))
        cur, cur_tok = [], 0

    for eid, rows in executions:
        size = sum(len(r) for r in rows)
        if cur and cur_tok + size > token_budget:
            flush()
        if size <= token_budget:
            cur.extend((eid, r) for r in rows)
            cur_tok += size
            continue
        for r in rows:  # larger than a micro-step: split by rows
            if cur and cur_tok + len(r) > token_budget:
                flush()
            cur.append((eid, r))
            cur_tok += len(r)
    flush()
    return out


Packer = Callable[[list[tuple[str, list[PackedSequence]]], int, str], list[MicroStep]]


@dataclass
class PackedChunk:
    tasks: list  # list[MicroStepTask]
    stats: PackStats
    groups: list[str]


def pack_groups(
    groups: list[ReadyGroup],
    start_index: int,
    stream: StreamConfig,
    objective: ObjectiveConfig,
    packer: Packer = pack_rows,
) -> PackedChunk:
    """Advantages + packing for groups that landed together -> tasks numbered from ``start_index``."""
    from gyre.train.tasks import MicroStepTask

    stats = PackStats()
    adv_of: dict[str, float] = {}
    execs: list[tuple[str, list[PackedSequence]]] = []
    adms: list = []
    for g in groups:
        ga = group_advantages(g.rewards, eps=objective.adv_eps, std=objective.adv_std)
        unknown = (set(g.rows) | set(g.admissions)) - set(g.rewards)
        if unknown:
            raise ValueError(
                f"group {g.group_id!r}: rows for executions without a reward: {sorted(unknown)[:3]}"
            )
        stats.groups += 1
        stats.groups_all_equal += int(ga.all_equal and ga.n_scored > 0)
        stats.executions_scored += ga.n_scored
        stats.executions_missing += len(ga.missing)
        for eid in ga.scored:
            a = ga.advantages[eid]
            adm = g.admissions.get(eid)
            if adm is not None and a != 0.0 and adm.n_targets > 0 and not adm.dropped:
                if eid in adv_of:
                    raise ValueError(f"execution id {eid!r} appears twice in one batch")
                adv_of[eid] = a
                adms.append(adm)
                stats.executions_trained += 1
                stats.targets += adm.n_targets
                continue
            rows = g.rows.get(eid, [])
            if a == 0.0 or not rows:
                continue  # no gradient: counted as scored, not packed
            _check_rows(eid, rows)
            _normalise_weights(eid, rows)
            if eid in adv_of:
                raise ValueError(f"execution id {eid!r} appears twice in one batch")
            adv_of[eid] = a
            execs.append((eid, rows))
            stats.executions_trained += 1
            stats.tokens += sum(len(r) for r in rows)
            stats.targets += sum(r.n_targets for r in rows)
    micro = packer(execs, stream.token_budget, stream.pack_mode) if execs else []
    if adms:  # admitted trajectory trees: the trace package's packer (may share rows, may split executions)
        from gyre.trace.packing import pack

        tree_steps = pack(adms, stream.pack_mode, stream.token_budget)
        stats.tokens += sum(ms.n_tokens for ms in tree_steps)
        micro = micro + tree_steps
    spans = _split_executions(micro, start_index)
    stats.executions_split = len(spans)
    stats.micro_steps = len(micro)
    tasks = [
        MicroStepTask(
            index=start_index + k,
            micro_step=ms,
            advantages=[adv_of[e] for e in ms.executions],
            spans={e: spans[e] for e in ms.executions if e in spans},
            groups=[g.group_id for g in groups],
        )
        for k, ms in enumerate(micro)
    ]
    return PackedChunk(tasks=tasks, stats=stats, groups=[g.group_id for g in groups])


def _check_rows(eid: str, rows: list[PackedSequence]) -> None:
    for r in rows:
        r.validate()
        tids = {x for x, t in zip(r.execution_index, r.is_target) if t}
        if len(tids) > 1:
            raise ValueError(f"execution {eid!r}: a row holds targets of {len(tids)} executions")


def _split_executions(micro: list[MicroStep], start_index: int) -> dict[str, list[int]]:
    """The executions packed into more than one micro-step -> the task indices holding them."""
    where: dict[str, list[int]] = {}
    for k, ms in enumerate(micro):
        for e in ms.executions:
            where.setdefault(e, []).append(start_index + k)
    return {e: w for e, w in where.items() if len(w) > 1}


def validate_group(group: ReadyGroup) -> None:
    """Raise ``ValueError`` naming the problem if ``group`` could not be trained.

    Run when a group enters the buffer, so a bad group is refused on its own and
    never takes a step (or other groups) down with it.
    """
    if not group.rewards:
        raise ValueError(f"group {group.group_id!r} has no executions")
    group_advantages(group.rewards)  # bad scores raise here
    unknown = (set(group.rows) | set(group.admissions)) - set(group.rewards)
    if unknown:
        raise ValueError(
            f"group {group.group_id!r}: rows for executions without a reward: {sorted(unknown)[:3]}"
        )
    both = set(group.rows) & set(group.admissions)
    if both:
        raise ValueError(
            f"group {group.group_id!r}: executions with both rows and an admission: {sorted(both)[:3]}"
        )
    for eid, rows in group.rows.items():
        for r in rows:
            try:
                r.validate()
            except ValueError as e:
                raise ValueError(f"group {group.group_id!r}, execution {eid!r}: {e}") from e
            if len({x for x, t in zip(r.execution_index, r.is_target) if t}) > 1:
                raise ValueError(
                    f"group {group.group_id!r}, execution {eid!r}: a row holds targets of "
                    "several executions"
                )
        n, tot = _target_weights(rows)
        if n and tot != 0.0 and not weights_sum_to_one(tot):
            raise ValueError(f"group {group.group_id!r}, execution {eid!r}: {_weights_error(tot)}")


class PackingBuffer:
    """Holds ready groups until a step takes them (oldest policy version first)."""

    def __init__(self, consumed: Iterable[str] = ()):
        self.consumed: set[str] = set(consumed)
        self._ready: list[tuple[int, int, ReadyGroup]] = []
        self._ids: set[str] = set()
        self._arrival = itertools.count()
        self.ignored_consumed = 0

    def add(self, group: ReadyGroup) -> bool:
        """Add a ready group; ``False`` if it was consumed already (cursor) or is already queued.

        Raises ``ValueError`` (and adds nothing) for a group that could not be trained.
        """
        validate_group(group)
        if group.group_id in self.consumed:
            self.ignored_consumed += 1
            return False
        if group.group_id in self._ids:
            return False
        self._ids.add(group.group_id)
        self._ready.append((group.version(), next(self._arrival), group))
        return True

    def __len__(self) -> int:
        return len(self._ready)

    def take(self, n: int) -> list[ReadyGroup]:
        """Up to ``n`` groups, oldest policy version first."""
        self._ready.sort(key=lambda x: (x[0], x[1]))
        got, self._ready = self._ready[:n], self._ready[n:]
        for _, _, g in got:
            self._ids.discard(g.group_id)
        return [g for _, _, g in got]

    def give_back(self, groups: list[ReadyGroup]) -> None:
        """Return groups of a step that was abandoned (not committed)."""
        for g in groups:
            self.add(g)

    def commit(self, group_ids: Iterable[str]) -> None:
        self.consumed.update(group_ids)
