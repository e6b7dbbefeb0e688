"""Synthetic executions shaped like the paper's case study (for tests, benches, demos).

The case study's trace: 636 proxy requests, 10 root-to-leaf paths, two main
paths (before and after a compaction), one main summary, sub-agent paths and a
sub-agent summary. :func:`case_study_execution` produces records with that
shape, delta-encoded exactly as the proxy writes them (``base``/``base_len``/
``input_suffix``), with request metadata the default role profile understands.

Shape (the split of tokens inside each request is ours; the paper gives only
message counts):

* main agent, phase 1: a chain of turns; every turn's input = previous turn's
  full sequence + a tool result (context); the output is sampled (targets);
* sub-agents spawned from main turns: their own system prompt (so they branch
  at the root), their own chain; their last output is pasted back into the
  main agent's next input as a tool result (context there);
* sub-agent 0 compacts: a summary request off its second-to-last turn, then a
  fresh chain seeded with the summary (pasted as context);
* main compaction: the summary request extends the second-to-last phase-1 turn
  (the harness drops the turn that overflowed), then phase 2 restarts from the
  system prompt + task + the pasted summary.

Leaves: main-1, main-summary, main-2, sub-agents 1..n-1, sub-agent 0 before
and after compaction, sub-agent-0 summary = 10 with the default 5 sub-agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .record import OutputSegment, TraceRecord

SUMMARY_PROMPT = "Summarize the conversation so far so that the work can continue."


@dataclass
class _Req:
    rid: str
    full_len: int


class _Gen:
    def __init__(self, execution_id: str, seed: int, vocab: int, out_len, tool_len, versions):
        self.eid = execution_id
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.out_len, self.tool_len = out_len, tool_len
        self.versions = versions
        self.records: list[TraceRecord] = []

    def toks(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.integers(16, self.vocab, size=int(n)).tolist())

    def n(self, rng_range) -> int:
        lo, hi = rng_range
        return int(self.rng.integers(lo, hi + 1))

    def request(self, base: _Req | None, suffix: tuple[int, ...], n_out: int, meta: dict) -> _Req:
        seq = len(self.records)
        out = self.toks(n_out)
        lps = tuple((-self.rng.exponential(1.0, size=len(out))).tolist())
        # Occasionally an output spans two engines/versions (a migrated request).
        v = int(self.rng.integers(self.versions[0], self.versions[1] + 1))
        if len(out) >= 4 and self.rng.random() < 0.1:
            cut = len(out) // 2
            segs: tuple[OutputSegment, ...] = (
                OutputSegment(start=0, end=cut, engine_id="engine-0", policy_version=v),
                OutputSegment(start=cut, end=len(out), engine_id="engine-1", policy_version=v + 1),
            )
        else:
            segs = (
                (OutputSegment(start=0, end=len(out), engine_id="engine-0", policy_version=v),)
                if out
                else ()
            )
        rid = f"{self.eid}-r{seq:04d}"
        rec = TraceRecord(
            execution_id=self.eid,
            request_id=rid,
            seq=seq,
            api="anthropic.messages",
            base=base.rid if base else None,
            base_len=base.full_len if base else 0,
            input_suffix=suffix,
            output_ids=out,
            output_logprobs=lps,
            segments=segs,
            t_start=float(seq),
            t_end=float(seq) + 0.5,
            meta=dict(meta),
        )
        self.records.append(rec)
        return _Req(rid=rid, full_len=(base.full_len if base else 0) + len(suffix) + len(out))


def _meta(system: str, last_user: str) -> dict:
    return {
        "system_sha1": system,
        "system_head": f"{system} system prompt",
        "last_user_head": last_user,
        "tools": ["Bash", "Read", "Write", "Task"] if system == "main" else ["Bash", "Read"],
    }


def case_study_execution(
    execution_id: str = "case-study",
    *,
    seed: int = 0,
    n_requests: int = 636,
    n_subagents: int = 5,
    system_len: int = 1500,
    task_len: int = 300,
    out_len: tuple[int, int] = (100, 400),
    tool_len: tuple[int, int] = (200, 850),
    summary_len: tuple[int, int] = (300, 600),
    vocab: int = 2048,
    versions: tuple[int, int] = (3, 4),
) -> list[TraceRecord]:
    """Records of one synthetic execution (see module docstring for its shape)."""
    if n_subagents < 1:
        raise ValueError("need at least one sub-agent (sub-agent 0 compacts)")
    fixed = 2 + 1  # main summary + sub-agent summary + at least one more
    if n_requests < 4 + 2 * n_subagents + fixed:
        raise ValueError(f"n_requests={n_requests} too small for {n_subagents} sub-agents")
    g = _Gen(execution_id, seed, vocab, out_len, tool_len, versions)
    sys_main, task = g.toks(system_len), g.toks(task_len)
    sys_sub = g.toks(system_len // 2)
    # request budget: ~40% to sub-agents, the rest to the two main phases
    n_sub_total = max(2 * n_subagents + 1, int(0.4 * n_requests))
    n_main = (
        n_requests - 1 - n_sub_total
    )  # minus the main summary (the sub-agent one is in n_sub_total)
    m1 = max(2, n_main // 2)
    m2 = n_main - m1
    per_sub = [
        n_sub_total // n_subagents + (1 if i < n_sub_total % n_subagents else 0)
        for i in range(n_subagents)
    ]
    spawn_at = {}  # main turn index (over m1 + m2) -> sub-agent index
    for i in range(n_subagents):
        spawn_at[int((i + 0.5) * (m1 + m2) / n_subagents)] = i

    ran: set[int] = set()

    def run_subagent(i: int) -> tuple[int, ...]:
        ran.add(i)
        turns = per_sub[i]
        sub_task = g.toks(g.n((20, 80)))
        meta = _meta("sub", "tool result")
        prev = g.request(None, sys_sub + sub_task, g.n(out_len), _meta("sub", "sub-agent task"))
        history = [prev]
        done = 1
        if i == 0:  # compaction: summary off the second-to-last turn, then a fresh chain
            before = max(2, (turns - 1) // 2)
            while done < before:
                prev = g.request(prev, g.toks(g.n(tool_len)), g.n(out_len), meta)
                history.append(prev)
                done += 1
            summ_base = history[-2]
            instr = g.toks(20)
            summ_out_len = g.n(summary_len)
            g.request(
                summ_base, g.toks(g.n(tool_len)) + instr, summ_out_len, _meta("sub", SUMMARY_PROMPT)
            )
            summary = g.records[-1].output_ids
            done += 1
            prev = g.request(
                None, sys_sub + sub_task + summary, g.n(out_len), _meta("sub", "continue")
            )
            done += 1
        while done < turns:
            prev = g.request(prev, g.toks(g.n(tool_len)), g.n(out_len), meta)
            done += 1
        return g.records[-1].output_ids  # the sub-agent's final answer

    main_meta = _meta("main", "tool result")
    prev = g.request(None, sys_main + task, g.n(out_len), _meta("main", "the task"))
    history = [prev]
    turn = 1
    pending: tuple[int, ...] | None = None
    for t in range(1, m1):
        if t - 1 in spawn_at:
            pending = run_subagent(spawn_at[t - 1])
        tool = pending if pending is not None else g.toks(g.n(tool_len))
        pending = None
        prev = g.request(prev, tool, g.n(out_len), main_meta)
        history.append(prev)
        turn += 1
    # main compaction off the second-to-last phase-1 turn
    g.request(
        history[-2],
        g.toks(g.n(tool_len)) + g.toks(20),
        g.n(summary_len),
        _meta("main", SUMMARY_PROMPT),
    )
    summary = g.records[-1].output_ids
    prev = g.request(None, sys_main + task + summary, g.n(out_len), _meta("main", "continue"))
    for t in range(m1 + 1, m1 + m2):
        if t - 1 in spawn_at:
            pending = run_subagent(spawn_at[t - 1])
        tool = pending if pending is not None else g.toks(g.n(tool_len))
        pending = None
        prev = g.request(prev, tool, g.n(out_len), main_meta)
    # sub-agents whose spawn turn fell past the end run now (keeps the request count exact)
    for i in range(n_subagents):
        if i not in ran:
            run_subagent(i)
    return g.records


def small_execution(
    execution_id: str = "small", *, seed: int = 0, vocab: int = 2048
) -> list[TraceRecord]:
    """A ~24-request version with short sequences (for exactness tests on the tiny model)."""
    return case_study_execution(
        execution_id,
        seed=seed,
        n_requests=24,
        n_subagents=2,
        system_len=24,
        task_len=6,
        out_len=(2, 6),
        tool_len=(2, 6),
        summary_len=(3, 6),
        vocab=vocab,
    )
