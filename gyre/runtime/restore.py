"""What a resumed run keeps of the groups that were in flight when its driver died.

``executions.jsonl`` holds one line per finished execution, written as it finishes (reward or
missing reason, trace, the version it was dispatched at and the versions that served it). A
resume reads it with the checkpoint's trained group ids and decides, without any I/O of its
own (:func:`plan_restore`): the groups trained are done; every other group with a finished
execution is *in flight* and is dispatched again under its own id (its own task), its finished
executions restored as they are (reward and trace reused for training, never rerun, never
logged again) and only its unfinished attempts relaunched. A group whose executions all
finished is restored whole and waits for a step like any scored group.

An execution that ended because the run's own infrastructure failed it (``RELAUNCH_REASONS``:
cancelled, the executor's own failure, no model call answered) is not an outcome of the
policy: it counts as unfinished and is relaunched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gyre.trace.assessment import Missing, MissingReason

RELAUNCH_REASONS = frozenset(
    {
        MissingReason.cancelled.value,
        MissingReason.infra_error.value,
        MissingReason.model_unreachable.value,
    }
)


@dataclass(frozen=True)
class Restored:
    """One finished execution kept for its group: what the trainer needs of it again."""

    execution: str  # its own id (earlier segment): its trace file is found by it
    group: int
    attempt: int
    reward: float | None
    missing: str | None  # the missing reason when reward is None
    detail: str
    version: int | None  # policy version it was dispatched at (None: a run dir before it)

    def outcome(self) -> float | Missing:
        """The reward, or the ``Missing`` with its reason, as the packing buffer takes it."""
        if self.reward is not None:
            return float(self.reward)
        return Missing(reason=MissingReason(self.missing), detail=self.detail)


@dataclass
class RestorePlan:
    """Groups to dispatch again (in this order: the policy's first group ids), the finished
    executions they keep, and the attempts to relaunch."""

    groups: list[int] = field(default_factory=list)
    finished: dict[tuple[int, int], Restored] = field(default_factory=dict)
    relaunch: list[tuple[int, int]] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {
            "groups": len(self.groups),
            "restored": len(self.finished),
            "relaunched": len(self.relaunch),
        }


def _kept(row: dict[str, Any]) -> bool:
    """A line of a finished training execution whose outcome stands."""
    if "group" not in row or "attempt" not in row or "execution" not in row:
        return False
    if row.get("reward") is not None:
        return True
    why = row.get("missing")
    if why is None or why in RELAUNCH_REASONS:
        return False
    try:
        MissingReason(why)
    except ValueError:  # a reason this version does not know: run it again
        return False
    return True


def plan_restore(
    rows: Iterable[dict[str, Any]], trained: Iterable[str | int], group_size: int
) -> RestorePlan:
    """From ``executions.jsonl``'s rows and the checkpoint's trained groups (``"g12"`` or
    ``12``): the groups in flight, what each keeps, and what is relaunched.

    A pure function: the same records give the same plan. An attempt with two lines (it cannot
    happen through ``gyre run``, whose restored executions are not logged again) keeps the first.
    """
    done = {int(str(g).lstrip("g")) for g in trained}
    plan = RestorePlan()
    for r in rows:
        gid, att = int(r.get("group", -1)), int(r.get("attempt", -1))
        if gid in done or not 0 <= att < group_size or not _kept(r):
            continue
        if (gid, att) in plan.finished:
            continue
        v = r.get("dispatch_version")
        plan.finished[(gid, att)] = Restored(
            execution=str(r["execution"]),
            group=gid,
            attempt=att,
            reward=None if r.get("reward") is None else float(r["reward"]),
            missing=r.get("missing"),
            detail=str(r.get("missing_detail", "")),
            version=None if v is None else int(v),
        )
    plan.groups = sorted({g for g, _ in plan.finished})
    plan.relaunch = [
        (g, a) for g in plan.groups for a in range(group_size) if (g, a) not in plan.finished
    ]
    return plan


def group_version(versions: Iterable[int]) -> float:
    """The version a group counts at in staleness: the mean of its executions' own dispatch
    versions, so the group's staleness (the trained version minus this) is the mean of its
    executions' staleness. A group dispatched once has one version and this is that version
    (an int); a resumed group mixes the killed segment's version (restored executions) with
    the resume's (relaunched ones). The objective is unaffected: it takes each token's
    behaviour log-prob from the trace, whatever version sampled it."""
    vs = list(versions)
    if not vs:
        raise ValueError("a group has at least one execution")
    m = sum(vs) / len(vs)
    return int(m) if m == int(m) else m
